"""A forward pass recorded as plain data where the block runs, and replayed where the checker runs.

``gptblock.check.serve.loop.record`` sends each ATen operator by name with its arguments as JSON and
the tensors' values; ``gptblock.check.roles.trace.from_plain`` reads that back, refusing what is not
a trace (an operator torch does not have, a reference to no node), and ``trace.rerun`` replays
it with values replaced, without the block's code. The child's environment names no checker.
"""

import json

import pytest
import torch
import torch.nn as nn

from gptblock import early, lesson
from gptblock.check.compare.modern import judge_cache
from gptblock.check.roles.trace import TraceError, from_plain, rerun
from gptblock.check.serve import loop
from gptblock.check.serve.cache import cache_api


def _block():
    torch.manual_seed(0)
    return lesson.Block(16, 2, 8, dropout=0.0).double().eval()


def test_a_replay_computes_what_the_block_computes_on_another_input():
    block = _block()
    x, x2 = torch.randn(2, 5, 7, 16, dtype=torch.float64)
    meta, tensors = loop.record(block, x)
    meta = json.loads(json.dumps(meta))  # as it travels: JSON
    trace = from_plain(meta, tensors)
    got = rerun(trace, {trace.input: x2}, [trace.output])[trace.output]
    with torch.no_grad():
        assert torch.allclose(got, block(x2), atol=1e-12)
    assert set(trace.parameters) == {n for n, _ in block.named_parameters()}


def test_what_is_not_a_trace_is_refused():
    meta, tensors = loop.record(nn.Linear(4, 4), torch.zeros(2, 3, 4))
    meta = json.loads(json.dumps(meta))
    forged = json.loads(json.dumps(meta))
    forged["ops"][0]["func"] = "os::system.default"
    with pytest.raises(TraceError, match="operator"):
        from_plain(forged, tensors)
    forged = json.loads(json.dumps(meta))
    forged["ops"][0]["args"][0] = {"r": 10_000}
    with pytest.raises(TraceError):
        from_plain(forged, tensors)
    with pytest.raises(TraceError, match="raised ValueError"):
        from_plain({"error": "ValueError"}, {})
    forged = json.loads(json.dumps(meta))
    forged["ops"][0]["args"].append({"opaque": "Generator"})
    trace = from_plain(forged, tensors)
    with pytest.raises(TraceError, match="Generator"):
        rerun(trace, {}, [trace.output])


def test_device_arguments_are_moved_to_where_the_trace_is_replayed():
    class Positions(nn.Module):
        def forward(self, x):
            return x + torch.arange(x.shape[1], device=x.device, dtype=x.dtype)[:, None]

    meta, tensors = loop.record(Positions(), torch.zeros(2, 3, 4))
    meta = json.loads(json.dumps(meta).replace('"cpu"', '"cuda:0"'))  # recorded on a GPU
    trace = from_plain(meta, tensors, device=torch.device("cpu"))
    x2 = torch.ones(2, 3, 4)
    got = rerun(trace, {trace.input: x2}, [trace.output])[trace.output]
    assert torch.equal(got, Positions()(x2))


def test_a_cache_answer_is_judged_as_data():
    x = torch.zeros(2, 4, 8)
    said = judge_cache({"api": "start_pos", "raised": "TypeError: no"}, {}, x, None)
    assert "driving start_pos raised TypeError: no" in said.note
    said = judge_cache({"api": "os.system"}, {}, x, None)
    assert "no cache API the checker knows" in said.note
    said = judge_cache({"api": "start_pos"}, {"whole": x}, x, None)
    assert "gave no (B, 1, C) outputs" in said.note


def test_the_childs_environment_names_no_checker(monkeypatch):
    monkeypatch.setenv("GPTBLOCK_SEEN", "1")
    monkeypatch.setenv("_", "/usr/local/bin/gptblock")
    monkeypatch.setenv("LEARNER_NOTE", "run by gptblock check")
    monkeypatch.setenv("PATH", "/opt/gptblock/bin:/usr/bin")
    env = early.environment()
    assert not {"GPTBLOCK_SEEN", "_", "LEARNER_NOTE"} & set(env)
    assert env["PATH"] == "/opt/gptblock/bin:/usr/bin"  # torch needs it: kept


def test_the_runner_helpers_one_line_encode_cache_api_and_record():
    # (the doctest examples of serve/loop.py, moved here)
    assert (loop.one_line(ValueError("bad value. ")), loop.one_line(SystemExit(3))) == (
        "ValueError: bad value",
        "SystemExit: 3 (sys.exit(3) was called)",
    )
    assert loop.encode((2, [torch.float64, None], torch.device("cpu"))) == {
        "tuple": [2, [{"dtype": "float64"}, None], {"device": "cpu"}]
    }

    class Meta(nn.Module):
        def forward(self, x, start_pos=None): ...

    assert (cache_api(Meta()), cache_api(nn.Identity())) == ("start_pos", None)
    meta, _ = loop.record(nn.Linear(4, 4), torch.zeros(2, 3, 4))
    assert [op["func"] for op in meta["ops"]] == [
        "aten::view.default",
        "aten::t.default",
        "aten::addmm.default",
        "aten::view.default",
    ]
