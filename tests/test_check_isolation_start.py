"""Where the block is built and run again: the runner builds it from the builder's arguments,
sent as data, and ``gptblock check`` starts its child before it imports torch (ending one it
leaves unused).
"""

import os
import textwrap
import time

import pytest

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


def _from_data_of(data):  # (runner's _from_data, inlined into build and _made)
    from functools import partial

    from gptblock.check.serve.loop import decode
    from gptblock.check.serve.runner import _made

    return decode(data, partial(_made, None))


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
    spawned.stdin.close()  # the command ended (an error in its arguments) without a check
    status, deadline = b"", time.monotonic() + 120
    while time.monotonic() < deadline:
        if not select.select([spawned.stdout], [], [], 1)[0]:
            continue
        chunk = os.read(spawned.stdout.fileno(), 4096)
        if not chunk:
            break  # the supervisor ended, and the jobs it forked with it
        status += chunk
    assert status.startswith(b"supervisor ") and b"exit runner -9" in status, status
    for fd in (spawned.out_r, spawned.err_r, *(fd for p in spawned.pipes.values() for fd in p)):
        os.close(fd)
    spawned.stdout.close()


def test_a_check_that_fails_before_it_runs_ends_the_child_started_for_it(capsys):
    from gptblock import early
    from gptblock.cli import main

    assert main(["check", "no_such_file.py:Block"]) == 2
    assert early._started is None  # dropped: its supervisor and forks have ended
    assert "no_such_file.py" in capsys.readouterr().err


SEEN = textwrap.dedent(
    """
    import json, os, random, sys
    from gptblock.lesson import Block as Lesson

    class Block(Lesson):
        def __init__(self, n_embd=32, n_head=4, block_size=16, dropout=0.0):
            super().__init__(n_embd, n_head, block_size, dropout)
            ours = [p for p in sys.path if p.endswith(("/a", "/b"))]
            seen = [os.getcwd(), os.environ.get("SEEN_MARK"), random.random(), ours]
            with open(os.environ["SEEN_LOG"], "a") as f:
                f.write(json.dumps(seen) + "\\n")
    """
)


def test_checks_of_one_process_fork_from_one_server_and_see_its_current_folder_and_environment(
    tmp_path, monkeypatch
):
    import json

    from gptblock import early
    from gptblock.check import check_isolated

    (tmp_path / "seen.py").write_text(SEEN)
    log = tmp_path / "seen.jsonl"
    monkeypatch.setenv("SEEN_LOG", str(log))
    servers = []
    for mark in ("a", "b"):
        folder = tmp_path / mark
        folder.mkdir()
        monkeypatch.chdir(folder)
        monkeypatch.setenv("SEEN_MARK", mark)
        monkeypatch.syspath_prepend(str(folder))
        (report,) = check_isolated([f"{tmp_path / 'seen.py'}:Block"], kwargs={}, roles={})
        assert report.passed, report
        servers.append(early._server)
    assert servers[0] is servers[1] and servers[0].proc.poll() is None  # torch imported once
    seen = [json.loads(line) for line in log.read_text().splitlines()]
    # Each build (builder and runner, at each size) as a new interpreter there and then would:
    for mark, path in (("a", ["a"]), ("b", ["b", "a"])):  # the checker's sys.path then
        mine = [s for s in seen if s[1] == mark]
        path = [str(tmp_path / p) for p in path]
        assert mine and all(s[0] == path[0] and s[3] == path for s in mine), seen
    assert len({s[2] for s in seen}) == len(seen)  # its own draws, not the server's


def test_a_forked_process_leaves_its_parents_fork_server_and_folder_alone():
    import gc
    from pathlib import Path

    from gptblock import early

    server = early._Server()
    try:
        pid = os.fork()
        if pid == 0:  # a forked checker drops the server it inherited (its own starts anew)
            del server
            gc.collect()
            os._exit(0)
        assert os.waitpid(pid, 0)[1] == 0
        assert (Path(server.folder) / "supervise.py").exists() and server.proc.poll() is None
    finally:
        server.close()
    assert not Path(server.folder).exists()


def test_to_data_forward_arguments_and_served():
    # (the doctest examples of serve/runner.py and isolation/worker.py, moved here)
    import types

    import torch
    import torch.nn as nn

    from gptblock import lesson
    from gptblock.check.isolation.worker import Served
    from gptblock.check.serve.calls import forward_arguments
    from gptblock.check.serve.runner import to_data

    assert to_data({"sizes": (1, 2), "cfg": types.SimpleNamespace(bias=True)}, None) == {
        "dict": {
            "sizes": {"tuple": [1, 2]},
            "cfg": {
                "object": "SimpleNamespace",
                "module": "types",
                "fields": {"dict": {"bias": True}},
            },
        }
    }

    class Layer(nn.Module):
        def forward(self, query, key, value, cache: "dict | None"):
            return query + key + value

    layer = Layer()
    assert forward_arguments(layer) == [
        "forward(query, key, value, cache) called with key = value = the input, cache=None"
    ]
    assert layer(torch.ones(1, 2, 3)).sum().item() == 18.0
    served = Served(lesson.Block, {"n_embd": 16, "n_head": 2, "block_size": 8})
    said = served("build")[0]["width"], served("width")[0], served("copy")[0]["dtype"]
    assert said == (16, {"C": 16, "T": 6, "longest": 8}, "float64")
    served.undo()
