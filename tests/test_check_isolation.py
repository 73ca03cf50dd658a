"""The block runs in a child process: whatever it does, the exit code and the report are the checker's.

Each child costs a torch import (~2 s), so the blocks that leave their process alive share one.
"""

import json
import os
import pathlib
import subprocess
import sys
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
            if type(self).calls > 5:  # after the first call, the forward trace and the shape probe
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
                # its pid as /proc numbers it (the block may be in a PID namespace of its own)
                say = 'read pid rest < /proc/self/stat; echo "$pid" > "$0.tmp"; mv "$0.tmp" "$0"'
                subprocess.Popen(["sh", "-c", say + "; exec sleep 300", __file__ + ".pid"])
                while not os.path.exists(__file__ + ".pid"):
                    time.sleep(0.01)
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


# --- a block that turns on its checker (issue 31, item 6) ----------------------------------------

TURNS = textwrap.dedent(
    """
    import json, os, signal, subprocess, sys, time

    from blocks import Good

    PIDS = __file__ + ".pids"


    def note_pid():  # as /proc outside any PID namespace of the checker's numbers it
        with open(PIDS, "a") as f:
            f.write(os.readlink("/proc/self") + "\\n")


    class TurnsOnItsChecker(Good):
        def forward(self, x):
            note_pid()
            if not os.path.exists(PIDS + ".spawned"):  # a process in a session of its own
                open(PIDS + ".spawned", "w").close()
                before = open(PIDS).read().count("\\n")
                code = "import os, sys, time; open(sys.argv[1], 'a').write("
                code += "os.readlink('/proc/self') + '\\\\n'); time.sleep(300)"
                subprocess.Popen([sys.executable, "-c", code, PIDS], start_new_session=True)
                deadline = time.monotonic() + 30
                while open(PIDS).read().count("\\n") == before and time.monotonic() < deadline:
                    time.sleep(0.01)
            targets = [os.getppid()] + json.load(open(__file__ + ".json"))
            for sig in (signal.SIGSTOP, signal.SIGTERM):
                for pid in targets:
                    try:
                        os.kill(pid, sig)
                    except OSError:
                        pass
            os.killpg(os.getpgrp(), signal.SIGTERM)  # its own group: itself
            return super().forward(x)
    """
)


def _namespaces():
    """Whether the supervisor gets a PID namespace of its own on this machine."""
    code = "from gptblock.check.isolation.reaper import own_pid_namespace as o; print(o())"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60).stdout.strip() == "True"  # fmt: skip


def _ancestors():
    pids, pid = [], os.getpid()
    while pid > 1:
        pids.append(pid)
        pid = int(pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    return pids


def _gone(pid):
    try:  # gone, or a zombie its parent outside reaps
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.parametrize("namespace", [True, False])
def test_a_block_that_signals_its_checker_gets_a_verdict_and_leaves_no_process(
    blocks, monkeypatch, namespace
):
    if not pathlib.Path("/proc/self/stat").exists():
        pytest.skip("no /proc to look the processes up in")
    if namespace and not _namespaces():
        pytest.skip("no PID namespace for the supervisor here (neither root nor user namespaces)")
    turns = blocks.parent / "turns.py"
    turns.write_text(TURNS)
    # The checker (this process) and its ancestors are named to the block only where it cannot
    # reach them; without the namespace it signals its parent (the supervisor) and itself.
    turns.with_name("turns.py.json").write_text(json.dumps(_ancestors() if namespace else []))
    if not namespace:
        from gptblock import early

        real = early.neutral_scripts

        def without_namespace(folder):
            script = real(folder)
            text = script.read_text().replace("isolated = own_pid_namespace()", "isolated = False")
            script.write_text(text)
            return script

        monkeypatch.setattr(early, "neutral_scripts", without_namespace)
        monkeypatch.setattr(early, "_server", None)  # a fork server of the changed script
    monkeypatch.syspath_prepend(str(blocks.parent))
    (report,) = check_isolated([f"{turns}:TurnsOnItsChecker"], kwargs={}, roles={}, timeout=5)
    assert not report.passed and "SIGTERM" in report.findings[-1].message, report.findings[-1]
    pids = [int(p) for p in pathlib.Path(f"{turns}.pids").read_text().split()]
    assert len(set(pids)) >= 2  # the block's process and the one it started, at least
    deadline = time.monotonic() + 10
    while not all(map(_gone, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p for p in pids if not _gone(p)] == []
    if not namespace:
        early._server.close()


def test_the_timeout_counts_the_blocks_time_not_the_checkers_own_between_requests(tmp_path):
    """A search at GPT-2's width takes the checker minutes between two requests; a block that
    answers each at once is not stopped for it (a 3-mistake block at width 768 lost its
    diagnosis to FAIL ``process`` so)."""
    import time

    from gptblock.check.isolation.check import ask_isolated

    path = tmp_path / "quick.py"
    path.write_text("import torch.nn as nn\nclass Block(nn.Linear):\n    def __init__(self):\n"
                    "        super().__init__(4, 4)\n")  # fmt: skip

    def slow_checker(call, i):
        call("build")
        time.sleep(2.5)  # the checker's own work, the child idle
        return call("build")[0]["description"]

    assert ask_isolated([f"{path}:Block"], slow_checker, timeout=2) == ["Block()"]
