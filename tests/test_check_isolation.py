"""The block runs in a child process: whatever it does, the exit code and the report are the checker's.

Each child costs a torch import (~2 s), so the blocks that leave their process alive share one.
"""

import json
import os
import pathlib
import textwrap
import time

import pytest

from gptblock import check_block
from gptblock.check import check_isolated
from gptblock.cli import main
from gptblock.errors import UserValueError

BLOCKS = textwrap.dedent(
    """
    import ctypes, os, sys, time
    import torch, torch.nn as nn
    from torch.nn import functional as F


    class Good(nn.Module):
        def __init__(self, n_embd, n_head):
            super().__init__()
            self.n_head = n_head
            self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
            self.qkv, self.proj = nn.Linear(n_embd, 3 * n_embd), nn.Linear(n_embd, n_embd)
            self.fc1, self.fc2 = nn.Linear(n_embd, 4 * n_embd), nn.Linear(4 * n_embd, n_embd)

        def attn(self, h):
            B, T, C = h.shape
            q, k, v = (t.view(B, T, self.n_head, -1).transpose(1, 2) for t in self.qkv(h).chunk(3, -1))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.proj(y.transpose(1, 2).reshape(B, T, C))

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


    class SysExit(Good):
        def forward(self, x):
            sys.exit(0)


    class OsExit(Good):
        calls = 0

        def forward(self, x):
            type(self).calls += 1
            if type(self).calls > 4:  # after the first call, the forward trace and the shape probe
                os._exit(0)
            return super().forward(x)


    class Hangs(Good):
        def forward(self, x):
            time.sleep(600)


    class Crashes(Good):
        def forward(self, x):
            ctypes.string_at(0)  # a segfault


    class Prints(Good):
        def forward(self, x):
            print("shape", tuple(x.shape), "x" * 10_000)
            print('{"nonce": "0", "event": "done"}')  # no forgery of the checker's protocol
            print("warning" * 100, file=sys.stderr)
            return super().forward(x)


    class Tuple(Good):
        def forward(self, x):
            return super().forward(x), None


    class Float32(Good):
        def forward(self, x):
            return super().forward(x).float()


    class Meta(Good):
        def forward(self, x):
            return super().forward(x).to("meta")


    class Raises(Good):
        def forward(self, x):
            raise RuntimeError("boom\\nsecond line")


    class LeavesAProcess(Good):
        def forward(self, x):
            if not os.path.exists(__file__ + ".pid"):  # a process that inherits stdout / stderr
                import subprocess
                child = subprocess.Popen(["sleep", "300"])
                open(__file__ + ".pid", "w").write(str(child.pid))
            return super().forward(x)


    class ExitsAtExit(Good):
        def __init__(self, n_embd, n_head):
            super().__init__(n_embd, n_head)
            import atexit
            atexit.register(os._exit, 3)  # ends the process oddly, after the checker is done


    class ExitsWhenBuilt(Good):
        def __init__(self, n_embd, n_head):
            sys.exit(3)
    """
)


@pytest.fixture(scope="module")
def blocks(tmp_path_factory):
    path = tmp_path_factory.mktemp("isolation") / "blocks.py"
    path.write_text(BLOCKS)
    return path


# One call, two children: the first crashes at once, a fresh one checks the rest; the processes a
# block starts and a block that ends its process oddly at exit come after the others' reports.
SHARED = ["Crashes", "Good", "Prints", "Tuple", "Float32", "Meta", "ExitsAtExit", "LeavesAProcess"]


@pytest.fixture(scope="module")
def shared(blocks):
    reports = check_isolated([f"{blocks}:{n}" for n in SHARED], kwargs={}, roles={})
    return dict(zip(SHARED, reports, strict=True))


def _message(report, name):
    return next(f.message for f in report.findings if f.name == name)


def test_blocks_that_print_or_return_the_wrong_thing_get_a_report_each(shared):
    names = ["Good", "Prints", "Tuple", "Float32", "Meta"]
    by = {n: shared[n] for n in names}
    assert by["Good"].passed and by["Good"].confident
    printed = by["Prints"]
    assert printed.passed, str(printed)  # printing is not a mistake, and cannot end the check
    assert any("bytes" in n and "to stdout, the first: 'shape (" in n for n in printed.notes)
    assert any("to stderr" in n for n in printed.notes)
    assert by["Tuple"].passed, str(by["Tuple"])  # (output, None): the output is taken, and said
    assert any("returns a tuple: its element 0" in n for n in by["Tuple"].notes)
    assert by["Float32"].diagnosis == ["dtype_device"]
    assert "a float64 input gave a float32 output" in _message(by["Float32"], "shape")
    assert by["Meta"].diagnosis == ["dtype_device"] and "output on meta" in _message(
        by["Meta"], "shape"
    )
    for report in by.values():
        assert "Traceback" not in str(report)


@pytest.mark.parametrize(
    "name, said",
    [
        (
            "SysExit",
            r"SystemExit: 0 \(sys.exit\(0\) was called\) \(at .*blocks.py:\d+: sys.exit\(0\)\)",
        ),
        ("Raises", r"RuntimeError: boom \(at .*blocks.py:\d+: raise RuntimeError"),
    ],
)
def test_a_block_whose_first_call_raises_is_an_error_naming_the_line(blocks, name, said):
    # not the shape mistake: what it raised, and where in the learner's file
    with pytest.raises(UserValueError, match=rf"cannot check {name}\(.*\): calling it .*{said}"):
        check_isolated([f"{blocks}:{name}"], kwargs={}, roles={})


@pytest.mark.parametrize(
    "name, what",
    [
        ("OsExit", "exited with code 0 without a result (os._exit"),
        ("Crashes", "was killed by SIGSEGV"),
        ("Hangs", "did not finish within 3 s (--timeout) and was stopped"),
    ],
)
def test_a_block_that_ends_or_hangs_its_process_gets_a_report_and_exit_code_1(
    blocks, capsys, name, what
):
    code = main(["check", f"{blocks}:{name}", "--timeout", "3", "--json"])
    data = json.loads(capsys.readouterr().out)  # valid JSON in every case
    assert code == 1 and data["passed"] is False
    (report,) = data["reports"]
    process = report["findings"][-1]
    assert process["name"] == "process" and what in process["message"], process
    assert " during copying the block" in process["message"] or " during the " in process["message"]
    if name == "OsExit":
        assert [f["name"] for f in report["findings"][:-1]] == ["shape"]  # the findings before it


def test_processes_the_block_starts_end_with_the_check(blocks, shared):
    assert shared["LeavesAProcess"].passed
    pid = int((blocks.parent / "blocks.py.pid").read_text())
    stat = pathlib.Path(f"/proc/{pid}/stat")
    if not pathlib.Path("/proc/self/stat").exists():
        pytest.skip("no /proc to look the process up in")

    def ended():  # gone, or a zombie waiting for init to reap it
        try:
            return stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
        except FileNotFoundError:
            return True

    # SIGKILL to the child's process group is delivered asynchronously: on a loaded machine the
    # process can still be running for a moment after the check returns, so wait a little.
    deadline = time.monotonic() + 10
    while not ended() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ended()


def test_the_targets_after_a_crash_are_checked_in_a_fresh_child(shared):
    first, second = shared["Crashes"], shared["Good"]
    assert "SIGSEGV" in first.findings[-1].message and not first.passed
    assert second.passed and second.confident
    assert shared["ExitsAtExit"].passed  # the child ended oddly after its reports: they stand


@pytest.mark.parametrize(
    "code, message",
    [
        ("import sys\nsys.exit(0)\n", "SystemExit: 0 (sys.exit(0) was called)"),
        ("import os\nos._exit(0)\n", "its process exited with code 0"),
    ],
)
def test_a_file_that_exits_at_import_exits_2_with_one_line_and_json(
    tmp_path, capsys, code, message
):
    path = tmp_path / "exits.py"
    path.write_text(code)
    assert main(["check", f"{path}:Block"]) == 2
    err = capsys.readouterr().err
    assert (
        message in err
        and len(err.strip().splitlines()) == 1
        and err.startswith("gptblock check: error:")
    )
    assert main(["check", f"{path}:Block", "--json"]) == 2
    data = json.loads(capsys.readouterr().out)
    assert data["passed"] is False and message in data["error"] and data["reports"] == []


def test_a_block_that_exits_when_built_cannot_be_built(blocks):
    with pytest.raises(UserValueError, match=r"cannot build ExitsWhenBuilt\(.*SystemExit: 3"):
        check_block(f"{blocks}:ExitsWhenBuilt")


def test_a_text_target_is_checked_in_a_child_by_default(blocks):
    report = check_block(f"{blocks}:OsExit", timeout=30)
    assert "os._exit" in report.findings[-1].message and os.getpid()  # and this process lives on


def test_an_object_is_sent_to_the_child_when_asked(tmp_path):
    from gptblock import TransformerBlock

    report = check_block(TransformerBlock, d_model=16, n_heads=2, isolate=True)
    assert report.passed and report.confident

    class Local(TransformerBlock):  # defined in a function: cannot be pickled
        pass

    with pytest.raises(
        UserValueError, match=r"cannot send .*Local to a child process.*isolate=False"
    ):
        check_block(Local, d_model=16, n_heads=2, isolate=True)


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), float("inf")])
def test_a_timeout_must_be_a_positive_number(timeout):
    with pytest.raises(UserValueError, match="timeout must be a positive number"):
        check_block("gptblock.lesson:Block", timeout=timeout)


CONFIGURED = textwrap.dedent(
    """
    import dataclasses
    import torch.nn as nn

    n_embd = 64  # a module setting the block reads


    @dataclasses.dataclass
    class Config:
        n_embd: int = 8
        n_head: int = 2

        def __post_init__(self):
            self.head_size = self.n_embd // self.n_head


    class Block(nn.Module):
        def __init__(self, config, layer_idx):
            super().__init__()
            self.proj = nn.Linear(config.n_embd, config.head_size * config.n_head)
            self.width, self.layer_idx = n_embd, layer_idx
    """
)


def test_the_runner_builds_the_block_again_from_the_builders_arguments_as_data(tmp_path):
    import json
    import sys

    import torch

    from gptblock.check.serve.runner import build, load, to_data

    path = tmp_path / "configured.py"
    path.write_text(CONFIGURED)
    target = load(f"{path}:Block")  # as the runner loads it: a module of the file's own name
    home = sys.modules[target.__module__]
    assert home.__name__ == "configured"
    args = {"config": home.Config(n_embd=16, n_head=4), "layer_idx": 1}
    recipe = {"settings": {"n_embd": to_data(16, home)}, "args": to_data(args, home)}
    module, undo = build(target, json.loads(json.dumps(recipe)))  # JSON: data, never code
    assert module.proj.weight.shape == (16, 16) and (module.width, module.layer_idx) == (16, 1)
    with torch.random.fork_rng():
        torch.manual_seed(0)  # seeded as the builder builds it (build.build_at)
        assert torch.equal(target(**args).proj.weight, module.proj.weight)
    undo()
    assert home.n_embd == 64
    with pytest.raises(ValueError, match="a function, which cannot be sent as data"):
        to_data({"act": lambda x: x}, home)
    assert _from_data_of(to_data(torch.nn.functional.gelu, home)) is torch.nn.functional.gelu


def _from_data_of(data):
    from gptblock.check.serve.runner import _from_data

    return _from_data(data, None)


def test_gptblock_check_starts_its_child_first_and_one_left_unused_ends(monkeypatch):
    import select

    from gptblock import early

    monkeypatch.setattr(early, "_started", None)
    for argv in (["train", "x.txt"], ["check", "--help"], ["--help"]):
        early.start(argv)
        assert early._started is None  # only for a check
    early.start(["check", "f.py:Block"])  # what gptblock.cli.main does first
    spawned = early._started
    assert spawned is not None and early.take() is spawned and early._started is None
    spawned.proc.stdin.close()  # the command ended (an error in its arguments) without a check
    status, deadline = b"", time.monotonic() + 120
    while time.monotonic() < deadline:
        if not select.select([spawned.proc.stdout], [], [], 1)[0]:
            continue
        chunk = os.read(spawned.proc.stdout.fileno(), 4096)
        if not chunk:
            break  # the supervisor ended, and the jobs it forked with it
        status += chunk
    assert status.startswith(b"supervisor ") and b"exit runner -9" in status, status
    for fd in (spawned.out_r, spawned.err_r, *(fd for p in spawned.pipes.values() for fd in p)):
        os.close(fd)
    spawned.proc.stdout.close()
    spawned.folder.cleanup()


def test_a_check_that_fails_before_it_runs_ends_the_child_started_for_it(capsys):
    from gptblock import early
    from gptblock.cli import main

    assert main(["check", "no_such_file.py:Block"]) == 2
    assert early._started is None  # dropped: its supervisor and forks have ended
    assert "no_such_file.py" in capsys.readouterr().err
