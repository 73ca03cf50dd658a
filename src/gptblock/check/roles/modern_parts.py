"""What a modern block's parts compute, told from their traced values: ``norm_of``, ``mlp_of``,
and ``unmodelled`` (the parts no reference models). docs/checker.md, "The modern block" ("Out of
scope is not FAIL"). B batch, T time, C channels, H MLP width.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import torch
from torch.nn import functional as F

from ..mistakes.report import CAUGHT
from ..mistakes.search import distance
from ..mistakes.steps import CANDIDATE_ACTIVATIONS, NORM_FORMS, Rope, affine, rms
from .dataflow import Core, cores
from .modern_read import Linear, ModernRead, Turn
from .trace import Op, Trace
from .weights import rescaled

__all__ = [
    "DENSE", "GATED", "MlpRead", "NormRead", "attention_scope", "close", "measured",
    "mlp_of", "norm_of", "unmodelled",
]  # fmt: skip

Tensor = torch.Tensor
EPS = (1e-5, 1e-6, 1e-8, 1e-12, 2.0**-23, 2.0**-52, 1e-4, 1e-3, 1e-2, 0.0)
"""Llama's, ``F.rms_norm``'s, float32's and float64's eps..., in turn (then ``_solved``); where
two fit, both do."""


def _solved(t: Tensor, out: Tensor, gain: Tensor, bias: Tensor | None) -> tuple[float, ...]:
    """The eps of a norm's output ``out`` on ``t`` (its 4 smallest rows), rounded and as solved:
    ms(t) / (ms(t) + eps) = ms(out / gain), centred for a LayerNorm."""
    r = (out if bias is None else out - bias) / gain
    if bias is not None:
        t, r = t - t.mean(-1, keepdim=True), r - r.mean(-1, keepdim=True)
    ms, ms_r = t.pow(2).mean(-1).flatten(), r.pow(2).mean(-1).flatten()
    rows = ms.argsort()[:4]
    eps = float((ms[rows] * (1 / ms_r[rows] - 1)).median())
    return (float(f"{eps:.2g}"), eps) if 0 <= eps < 1 else ()


CLOSE = 1e-5  # a part reproduces a traced value to this much of its scale (float32 inside: 1e-7)


def close(a: Tensor, b: Tensor, tol: float = CLOSE) -> bool:
    return torch.equal(torch.isfinite(a), torch.isfinite(b)) and distance(a, b, 0.0) <= tol


@dataclass(frozen=True)
class NormRead:
    """A norm's form (``layernorm``, ``none``, ``unknown`` or a key of ``NORM_FORMS``)."""

    form: str
    function: Callable[[Tensor], Tensor]
    eps: float = 0.0
    params: tuple[str, ...] = field(default=())  # the parameters it reads, for shared_norm
    gain: Tensor | None = None  # (C,): an RMS form's weight, or a LayerNorm's, as read
    bias: Tensor | None = None  # (C,): a LayerNorm's bias, as read (None: not read)

    def describe(self) -> str:
        if self.form in NORM_FORMS:
            return f"rmsnorm (eps {self.eps:.3g})" if self.form == "rms" else "rmsnorm (mistaken)"
        return self.form


def norm_of(f: Callable[[Tensor], Tensor], like: Tensor, params: tuple[str, ...] = ()) -> NormRead:
    """The gain read on large inputs (eps does not matter), eps on inputs over 4 magnitudes."""

    def run(t: Tensor) -> Tensor:
        with torch.no_grad():
            return f(t.to(like.dtype)).double()

    g, shape = torch.Generator().manual_seed(5), like.shape
    z = torch.randn(shape, generator=g, dtype=torch.float64)
    big = 100.0 * (1.0 + torch.rand(shape, generator=g, dtype=torch.float64))  # all positive
    scales = 10.0 ** -torch.linspace(0, 4, shape[0] * shape[1], dtype=torch.float64)
    small = torch.randn(shape, generator=g, dtype=torch.float64) * scales.reshape(*shape[:2], 1)
    C, form = shape[-1], "unknown"
    try:
        fz = run(z)
        if close(fz, z, 1e-12):
            return NormRead("none", lambda h: h, params=params)
        if close(run(z + 3.0), fz, 1e-6):  # a LayerNorm: it subtracts the mean first
            form = "layernorm"
            bias = run(torch.zeros_like(z)).flatten(0, -2).median(dim=0).values  # (C,): at 0
            gain = ((run(big) - bias) / F.layer_norm(big, (C,))).flatten(0, -2).median(dim=0).values
        fb, outputs = run(big), [(t, run(t)) for t in (z, small)]
    except CAUGHT:
        return NormRead(form, f, params=params)
    if form == "layernorm":  # used as the block computes it; gain, bias and eps for plain.send
        for eps in (*EPS, *_solved(*outputs[1], gain, bias)):
            if all(close(out, F.layer_norm(t, (C,), gain, bias, eps)) for t, out in outputs):
                return NormRead(form, f, eps, params, gain, bias)
        return NormRead(form, f, params=params)
    for form in NORM_FORMS:
        gain = (fb / rms(big, 1.0, 0.0, form)).flatten(0, -2).median(dim=0).values  # (C,)
        for eps in (*EPS, *(_solved(*outputs[1], gain, None) if form == "rms" else ())):
            if all(close(out, rms(t, gain, eps, form)) for t, out in outputs):
                same = lambda h, g=gain, e=eps, n=form: rms(h, g.to(h.dtype), e, n)  # noqa: E731
                return NormRead(form, same, eps, params, gain)
    return NormRead("unknown", f, params=params)


DENSE: dict[str, Callable[[Tensor], Tensor]] = {
    **CANDIDATE_ACTIVATIONS, "relu2": lambda u: F.relu(u).square(), "silu": F.silu,
}  # fmt: skip
# relu2: nanochat's and the speedrun's relu(x)^2

GATED = {name: DENSE[name] for name in ("silu", "gelu", "gelu_tanh")}
# a gate's: SiLU (SwiGLU, Llama), GELU (GeGLU, Gemma)

_GATE, _UP = {"gate", "w1"}, {"up", "w3"}  # Hugging Face's gate_proj / up_proj, Meta's w1 / w3


@dataclass(frozen=True)
class MlpRead:
    describe: str
    hidden: Callable[[Tensor], Tensor]
    mistakes: dict[str, str]
    layers: tuple[Linear, ...] = ()  # the first layer, or the gate's and the up projection's
    activation: str | None = None  # None: a catalogued mistake, no standard form
    gated: bool = False


def mlp_of(read: ModernRead) -> MlpRead | None:
    """The form or catalogued mistake that reproduces the MLP's traced hidden values; a first
    layer of 2H rows may be gate and up, in halves or interleaved."""
    h, target, width = read.rows("fc1"), read.rows("fc2"), read.mlp[-1][0].shape[1]
    if len(read.mlp) == 3:
        names = [", ".join(read.roles[r].params) for r in ("fc1", "fc3")]
        return _gated_of(h, target, width, read.mlp[:2], names)
    w, first = read.mlp[0], affine(*read.mlp[0])
    for name, act in DENSE.items():
        if close(act(first(h)), target):
            hidden = lambda h, act=act: act(first(h))  # noqa: E731
            return MlpRead(f"dense {name} d_ff={width}", hidden, {}, (w,), name)
    if w[0].shape[0] != 2 * width:
        return None
    halves = (slice(0, width), slice(width, None)), (slice(0, None, 2), slice(1, None, 2))
    found = (_gated_of(h, target, width, [(w[0][r], w[1][r]) for r in o], ["", ""]) for o in halves)
    return next((m for m in found if m is not None), None)


def _gated_of(
    h: Tensor, target: Tensor, width: int, m: list[Linear], names: list[str]
) -> MlpRead | None:  # names: the parameters of m, "" where packed
    f = [affine(*w) for w in m]
    u = [layer(h) for layer in f]  # the two first-layer outputs, (B, T, H) each
    said = [set(re.split(r"[._]", name)) for name in names]
    for gate, up in ((0, 1), (1, 0)):
        for name, act in GATED.items():
            if close(act(u[gate]) * u[up], target):
                mistakes = {}
                if names[gate] and said[gate] & _UP and said[up] & _GATE:
                    mistakes["swiglu_swapped"] = (
                        f"{name} is applied to the up projection ({names[gate]}) and the gate "
                        f"projection ({names[up]}) is the linear branch: act(up(x)) * gate(x) "
                        "instead of act(gate(x)) * up(x)"
                    )
                label = "swiglu" if name == "silu" else f"gated {name}"
                g, p = f[gate], f[up]
                hidden = lambda h, g=g, p=p, act=act: act(g(h)) * p(h)  # noqa: E731
                layers = m[gate], m[up]
                return MlpRead(f"{label} d_ff={width}", hidden, mistakes, layers, name, True)
    for label, form in _WRONG.items():
        if close(form(u[0], u[1]), target):
            paired = lambda h, form=form: form(f[0](h), f[1](h))  # noqa: E731
            return MlpRead(f"gated d_ff={width}", paired, {"swiglu_silu": label})
    return None


_WRONG: dict[str, Callable[[Tensor, Tensor], Tensor]] = {  # swiglu_silu
    "SiLU on the product of the two branches: silu(w1 x * w3 x)": lambda a, b: F.silu(a * b),
    "no SiLU at all: w1 x * w3 x": lambda a, b: a * b,
    "SiLU on both branches: silu(w1 x) * silu(w3 x)": lambda a, b: F.silu(a) * F.silu(b),
}


SATURATING = {"tanh": "tanh", "atan": "atan", "sigmoid": "sigmoid", "erf": "erf",
              "clamp": "clamp", "clamp_min": "clamp", "clamp_max": "clamp", "hardtanh": "clamp"}  # fmt: skip
MASKED = -1e4  # a score at or below this is masked (-inf, finfo.min, -1e9), not biased; an
# additive mask's entries are 0 or at least this large (- 1e10 * (1 - b), as OpenAI's GPT-2)


def attention_scope(trace: Trace) -> list[str]:
    found: list[str] = []
    try:
        for core in cores(trace):
            found += [p for p in _in_core(trace, core) if p not in found]
    except CAUGHT:  # the checker's own limit: nothing found
        return []
    return found


def _in_core(trace: Trace, core: Core) -> list[str]:
    made, A, scores = cast(Op, trace.producer(core.y)), core.A, core.scores  # fused, or A @ v
    path: list[Op] = []  # the ops from the scores to A
    if A is not None and scores is not None:
        inside, behind = set(scores.outputs), trace.ancestors(A)
        for op in trace.ops[scores.index + 1 : trace.nodes[A].op + 1]:
            if any(n in inside for n in op.inputs) and any(n in behind for n in op.outputs):
                inside.update(op.outputs)
                path.append(op)
    capped = [SATURATING[op.base] for op in path if op.base in SATURATING]
    window = _window(trace, made, A)
    found = [
        capped and f"the attention logits are soft-capped ({capped[0]} between the score product "
        "and the softmax, as Gemma 2's tanh(s / c) * c)",
        any(_bias(trace, op) for op in path) and "a bias that varies with the positions is added "
        "to the attention scores (ALiBi or a relative position bias)",
        window and f"a sliding-window mask: each position attends to the last {window} only",
    ]  # fmt: skip
    return [f for f in found if f]


def unmodelled(read: ModernRead) -> list[str]:
    trace, (q_out, proj_out, down_out) = read.trace, read.ends
    found = _in_core(trace, read.core) + [
        f"a norm after the {what} inside its residual branch (a sandwich norm, as Gemma 2's and "
        "OLMo 2's)" for what, end in (("attention", proj_out), ("MLP", down_out))
        if _normed_branch(trace, end)
    ]  # fmt: skip
    if _width_norm(trace, q_out, read.core.q, read.n_head):
        found.append("q and k normalised over the whole width (OLMo 2's qk norm), not per head")
    if read.turn is not None and not read.turn.fits:
        found.append(
            "a rotary embedding whose frequencies are not theta^(-2i/r) (scaled positions, as "
            "Llama 3.1's or YaRN's)"
        )
    return found


def _bias(trace: Trace, op: Op) -> bool:
    static = [trace.nodes[n].value for n in op.inputs if not trace.nodes[n].data]
    kept = [  # a mask's entries are 0 or huge
        t[torch.isfinite(t) & (t.abs() < -MASKED)]
        for t in static if op.base in ("add", "sub") and t.dim() >= 2 and t.is_floating_point()
    ]  # fmt: skip
    return any(k.numel() and bool((k != k.flatten()[0]).any()) for k in kept)


def _window(trace: Trace, made: Op, A: int | None) -> int:
    """w < T where exactly the keys t - w < s <= t are attended to at every query t (by ``A``,
    or a fused core's static ``attn_mask``); else 0."""
    if A is None:
        if len(made.inputs) < 4 or trace.nodes[made.inputs[3]].data:
            return 0
        mask = trace.nodes[made.inputs[3]].value
        allowed = mask if mask.dtype == torch.bool else mask > MASKED
        if allowed.dim() < 2:
            return 0
        allowed = allowed.reshape(-1, *allowed.shape[-2:]).all(0)
    else:
        P = trace.nodes[A].value
        if P.dim() < 2 or P.shape[-1] != P.shape[-2]:
            return 0
        allowed = (P.reshape(-1, *P.shape[-2:]) != 0).any(0)
    t = torch.arange(allowed.shape[-1])
    back = t[:, None] - t[None, :]  # (T, T): how far key s is behind query t
    found = (w for w in range(1, len(t)) if torch.equal(allowed.cpu(), (back >= 0) & (back < w)))
    return next(found, 0)


def _normed_branch(trace: Trace, end: int) -> bool:
    shape = trace.nodes[trace.input].shape
    for op in trace.ops[trace.nodes[end].op + 1 :]:
        data = [n for n in op.inputs if trace.nodes[n].data]
        if op.base != "add" or len(data) != 2 or trace.nodes[op.outputs[0]].shape != shape:
            continue
        mine = [n for n in data if end in trace.ancestors(n)]
        if len(mine) == 1:
            z = trace.nodes[end].value
            moved = None if mine[0] == end else rescaled(trace, end, mine[0], z, [3.0])
            return moved is not None and moved[2][0] <= 1e-3  # float32 norms: 1e-5
    return False


def _width_norm(trace: Trace, q_out: int, q_core: int, nh: int) -> bool:  # OLMo 2's qk norm
    z = trace.nodes[q_out].value
    D = z.shape[-1]
    if D % nh or z.dim() < 2:
        return False
    one = torch.ones(nh, D // nh, dtype=z.dtype, device=z.device)
    one[0] = 3.0
    moved = rescaled(trace, q_out, q_core, z, [3.0, one.flatten()])
    return moved is not None and moved[2][0] <= 1e-3 and moved[2][1] > 1e-2  # float32: 1e-5


def measured(turn: Turn | None, hs: int) -> str:
    if turn is None or not turn.fits or turn.pairing == "other":
        return "something between the projections and the scores (not identified)"
    rope = Rope(turn.theta, turn.dim, turn.pairing, turn.pairing, 1.0).describe(hs)
    return f"{rope.replace('rope (', 'rope as measured (', 1)}, the attention not identified"
