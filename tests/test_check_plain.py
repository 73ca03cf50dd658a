"""What crosses from the block's process is plain numbers, read exactly and checked on arrival.

``plain`` reads each sub-layer into numbers where the block runs (a linear map's weight and bias;
a norm's kind, eps, gain and bias) and builds them back where the verdict is decided;
``provenance`` refuses weights that are not the values the checker chose; ``loop``'s frames carry
JSON and raw tensors and refuses anything else.
"""

import os

import pytest
import torch
import torch.nn as nn
from torch.nn import functional as F

from gptblock.check.mistakes.steps import Parts, affine
from gptblock.check.roles.modern_parts import norm_function
from gptblock.check.roles.plain import LESSON, NotPlain, _norm, decode, to_plain
from gptblock.check.roles.provenance import choose, trace, unread
from gptblock.check.serve import loop
from gptblock.check.serve.loop import Reader, send

C = 16
G = torch.Generator().manual_seed(0)


def _randn(*shape):
    return torch.randn(*shape, generator=G, dtype=torch.float64)


class _Norm(nn.Module):
    def __init__(self, f):
        super().__init__()
        self.w, self.b, self.f = nn.Parameter(1 + 0.1 * _randn(C)), nn.Parameter(_randn(C)), f

    def forward(self, h):
        return self.f(self, h)


NORMS = {  # kind expected -> the norm as a block writes it
    "layer": lambda m, h: F.layer_norm(h, (C,), m.w, m.b, 1e-5),
    "unbiased": lambda m, h: (
        m.w * (h - h.mean(-1, keepdim=True)) / torch.sqrt(h.var(-1, keepdim=True) + 1e-6) + m.b
    ),
    "std": lambda m, h: (
        m.w * (h - h.mean(-1, keepdim=True)) / (h.std(-1, keepdim=True) + 1e-6) + m.b
    ),
    "rms": lambda m, h: m.w * h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6),
}


@pytest.mark.parametrize("kind", NORMS)
def test_a_norm_is_read_as_its_kind_with_the_blocks_own_gain(kind):
    m = _Norm(NORMS[kind])
    x = _randn(5, 7, C)
    known = torch.cat([p.detach().flatten() for p in m.parameters()]).sort().values
    n = _norm("ln1", m, x, known)
    assert n.form == kind
    assert torch.equal(n.gain, m.w.detach())  # exactly the parameter, not a fit of it
    with torch.no_grad():
        ours, theirs = norm_function(kind, n.gain, n.bias, n.eps)(x), m(x)
    assert (ours - theirs).abs().max() <= 1e-12 * theirs.abs().max()


def test_a_gain_stored_minus_one_is_read_as_the_blocks_own():
    m = _Norm(lambda m, h: F.layer_norm(h, (C,)) * (1 + m.w) + m.b)  # Gemma's RMSNorm does so
    known = torch.cat([p.detach().flatten() for p in m.parameters()]).sort().values
    w = _norm("ln1", m, _randn(5, 7, C), known).gain
    assert torch.allclose(w - 1, m.w.detach(), rtol=0, atol=1e-15)  # 1 + the parameter


def test_a_sublayer_that_is_not_linear_is_not_read():
    parts = Parts(C, C, lambda h: (h, h, h), torch.tanh, affine(_randn(4 * C, C)), affine(_randn(C, 4 * C)), torch.relu, None)  # fmt: skip
    with pytest.raises(NotPlain, match="proj is not what its numbers say"):
        to_plain(parts, _randn(5, 7, C), "0")


def _lesson_parts():
    ln = nn.LayerNorm(C).double()
    w = {r: (_randn(C, C), _randn(C)) for r in ("q", "k", "v", "proj")}
    fc1, fc2 = (_randn(4 * C, C), _randn(4 * C)), (_randn(C, 4 * C), _randn(C))

    def qkv(h):
        return tuple(F.linear(h, *w[r]) for r in ("q", "k", "v"))

    return Parts(C, C, qkv, affine(*w["proj"]), affine(*fc1), affine(*fc2), ln, ln), w


def test_numbers_come_back_as_the_same_parts():
    parts, w = _lesson_parts()
    x = _randn(5, 7, C)
    meta, tensors = to_plain(parts, x, "0")
    back = decode(meta, tensors, "0", C, LESSON).parts()
    assert torch.allclose(tensors["0.q.weight"], w["q"][0], atol=1e-13)
    assert torch.allclose(back.proj(x), parts.proj(x), atol=1e-12)
    assert torch.allclose(back.ln2(x), parts.ln2(x), atol=1e-12)


@pytest.mark.parametrize(
    "edit, why",
    [
        (lambda m, t: t.update({"0.q.weight": t["0.q.weight"][:, :3]}), "0.q.weight: expected"),
        (lambda m, t: t["0.fc1.weight"].__setitem__((0, 0), float("nan")), "finite"),
        (lambda m, t: m.update(C=C + 1), "width"),
        (lambda m, t: m["ln1"].update(kind="pickle"), "a norm kind expected"),
        (lambda m, t: m["ln1"].update(eps=-1.0), "eps"),
    ],
)
def test_numbers_that_do_not_fit_the_width_are_refused(edit, why):
    meta, tensors = to_plain(_lesson_parts()[0], _randn(5, 7, C), "0")
    edit(meta, tensors)
    with pytest.raises(NotPlain, match=why):
        decode(meta, tensors, "0", C, LESSON).parts()


def test_only_the_values_the_checker_chose_pass_as_weights():
    chosen = choose({"attn.w": torch.zeros(3 * C, C), "ln.w": torch.ones(C)}, C, G)
    wq, wk = chosen["attn.w"][:C], chosen["attn.w"][C : 2 * C]
    zero, gain = torch.zeros(C, dtype=torch.float64), chosen["ln.w"]
    assert trace({"q": [wq, zero], "k": [wk.T, zero], "ln1": [gain, zero]}, chosen, torch.float64).why == ""  # fmt: skip
    assert "q are not" in trace({"q": [wq * 8**0.5, zero]}, chosen, torch.float64).why
    assert "q are not" in trace({"q": [wq + 1e-7, zero]}, chosen, torch.float64).why
    shared = trace({"ln1": [gain, zero], "ln2": [gain.clone(), zero]}, chosen, torch.float64).why
    assert shared == "ln1 and ln2 were read from the same parameters"


def test_frames_carry_json_and_tensors_and_nothing_else(monkeypatch):
    monkeypatch.setattr(loop, "MAX_HEADER", 100)  # (a real one is 1 MiB: more than a pipe holds)
    r, w = os.pipe()
    try:
        send(w, {"id": 1, "ok": {"a": [1, 2]}}, {"y": torch.arange(6.0).reshape(2, 3)})
        header, tensors = Reader(r).next(deadline=None)
        assert header["ok"] == {"a": [1, 2]} and torch.equal(tensors["y"], torch.arange(6.0).reshape(2, 3))  # fmt: skip
        os.write(w, b'{"bytes": 5}\ncos\nsystem\n')  # a pickle's opcodes as "tensors": not loaded
        with pytest.raises(ValueError, match="tensors that do not load"):
            Reader(r).next(deadline=None)
        os.write(w, b"x" * 200)
        with pytest.raises(ValueError, match="a line of over"):
            Reader(r).next(deadline=None)
    finally:
        os.close(r)
        os.close(w)


def test_a_value_the_dtype_rounds_together_with_a_read_one_counts_as_read():
    # two chosen values one float32 apart (hf-proj/inplace, 1 run in 100): which one a float32
    # read came from cannot be told, so neither may be called a parameter that never acts
    a = torch.tensor([0.3], dtype=torch.float64)
    chosen = {"k.bias": a, "other": a + 1e-9}
    traced = trace({"k": [a.float().double()]}, chosen, torch.float32)
    assert traced.why == "" and unread(chosen, traced.used, torch.float32) == {}
    far = {"k.bias": a, "other": a + 1e-3}  # told apart: the other is unread
    traced = trace({"k": [a.float().double()]}, far, torch.float32)
    assert list(unread(far, traced.used, torch.float32)) == ["other"]


def test_a_value_only_near_a_read_one_is_not_counted_as_read():
    # UnusedLinearBlock (1 seed in 5): a gate value 7e-10 from a read float64 one was counted read
    # (within 2 x the tolerance), so only "4095 of its 4096 values" never acted; a read exact to
    # the last bit tells its value from any other, one with an error from those farther than it
    a, step = torch.tensor([0.25], dtype=torch.float64), 2.0**-33  # binary fractions: exact
    chosen = {"k.bias": a, "other": a + 4 * step}
    traced = trace({"k": [a.clone()]}, chosen, torch.float64)
    assert traced.why == "" and list(unread(chosen, traced.used, torch.float64)) == ["other"]
    traced = trace({"k": [a + 3 * step]}, chosen, torch.float64)  # nearer the other: it was read
    assert list(unread(chosen, traced.used, torch.float64)) == ["k.bias"]
    traced = trace({"k": [a + 2 * step]}, chosen, torch.float64)  # halfway: either was read
    assert unread(chosen, traced.used, torch.float64) == {}
