"""What a modern block's parts compute, told from their traced values: ``norm_of`` (any block's
norms: ``plain`` sends the lessons' so) and ``mlp_of``; ``scope`` finds the parts no reference
models. docs/checker.md, "The modern block". B batch, T time, C channels, H MLP width.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import cast

import torch
from torch.nn import functional as F

from ..mistakes.report import CAUGHT
from ..mistakes.search import distance
from ..mistakes.steps import CANDIDATE_ACTIVATIONS, NORM_FORMS, SubLayer, affine, rms
from .modern_read import Linear, ModernRead
from .provenance import snap

__all__ = [
    "DENSE", "GATED", "MODERN_ONLY", "NORM_KINDS", "MlpRead", "NormRead", "close", "mlp_of",
    "norm_function", "norm_of", "ones", "other_activation",
]  # fmt: skip

Tensor = torch.Tensor
NORM_KINDS = ("layer", "unbiased", "std", "rms")  # the norms a block may send as numbers
EPS = (1e-5, 1e-6, 1e-8, 1e-12, 2.0**-23, 2.0**-52, 1e-4, 1e-3, 1e-2, 0.0)
"""Llama's, ``F.rms_norm``'s, float32's and float64's eps..., in turn (then ``_solved``); where
two fit, both do."""


def norm_function(kind: str, weight: Tensor | float, bias: Tensor | None, eps: float) -> SubLayer:
    """``std``: ``(h - mean) / (std + eps)``; ``unbiased``: with the unbiased variance; a key of
    ``NORM_FORMS``: that form of RMSNorm (``steps.rms``)."""

    def norm(h: Tensor) -> Tensor:
        w = weight.to(h.dtype) if isinstance(weight, Tensor) else weight
        b = 0.0 if bias is None else bias.to(h.dtype)
        if kind not in ("layer", "unbiased", "std"):  # RMSNorm, or a form of it
            return rms(h, w, eps, kind) + b
        centred = h - h.mean(-1, keepdim=True)
        if kind == "std":
            return w * centred / (centred.std(-1, keepdim=True) + eps) + b
        var = centred.pow(2).mean(-1, keepdim=True)  # (B, T, 1)
        if kind == "unbiased":
            var = var * h.shape[-1] / (h.shape[-1] - 1)
        return w * centred / torch.sqrt(var + eps) + b

    return norm


def _solved(
    kind: str, t: Tensor, out: Tensor, gain: Tensor, bias: Tensor | None
) -> tuple[float, ...]:
    """The eps of a norm's output ``out`` on ``t`` (its 4 smallest rows; a mistaken form's, over
    its entries), rounded and as solved from its divisor d: ms(t) / d^2 = ms(out / gain), centred
    but for an RMSNorm."""
    r = (out if bias is None else out - bias) / gain
    if kind not in NORM_KINDS:  # a mistaken form: its divisor over its own axes (s92: 1e-9)
        d, d0 = t / r, t / rms(t, 1.0, 0.0, kind)  # its divisor, and without eps
        est = (d - d0 if kind == "eps_outside" else d * d - d0 * d0).flatten()
        est = est[torch.isfinite(est)]
        eps = float(est.median()) if est.numel() else -1.0
        return (float(f"{eps:.2g}"), eps) if 0 <= eps < 1 else ()
    if kind != "rms":
        t, r = t - t.mean(-1, keepdim=True), r - r.mean(-1, keepdim=True)
    ms, ms_r = t.pow(2).mean(-1).flatten(), r.pow(2).mean(-1).flatten()
    rows = ms.argsort()[:4]
    ms, d = ms[rows], (ms[rows] / ms_r[rows]).sqrt()  # d: the divisor at each row
    k = t.shape[-1] / (t.shape[-1] - 1)  # the unbiased variance over the biased
    eps = float(
        {"std": d - (k * ms).sqrt(), "unbiased": d * d - k * ms}.get(kind, d * d - ms).median()
    )
    return (float(f"{eps:.2g}"), eps) if 0 <= eps < 1 else ()


CLOSE = 1e-5  # a part reproduces a traced value to this much of its scale (float32 inside: 1e-7)


def _off(a: Tensor, b: Tensor) -> float:  # how far, relative to b; inf: not finite alike
    return distance(a, b, 0.0) if torch.equal(torch.isfinite(a), torch.isfinite(b)) else math.inf


def close(a: Tensor, b: Tensor, tol: float = CLOSE) -> bool:
    return _off(a, b) <= tol


@dataclass(frozen=True)
class NormRead:
    """A norm's form: one of ``NORM_KINDS`` or ``NORM_FORMS``' keys, ``none`` or ``unknown``."""

    form: str
    function: Callable[[Tensor], Tensor]
    eps: float = 0.0
    params: tuple[str, ...] = field(default=())  # the parameters it reads, for shared_norm
    gain: Tensor | None = None  # (C,): its weight, as read (None: not read)
    bias: Tensor | None = None  # (C,): its bias, as read (None: not read, or an RMSNorm's none)

    def describe(self) -> str:
        if self.form in NORM_FORMS:
            return f"rmsnorm (eps {self.eps:.3g})" if self.form == "rms" else "rmsnorm (mistaken)"
        return "layernorm" if self.form == "layer" else self.form


def norm_of(
    f: SubLayer, like: Tensor, params: tuple[str, ...] = (), known: Tensor | None = None,
    kinds: tuple[str, ...] = ("layer", *NORM_FORMS),
) -> NormRead:  # fmt: skip
    """The gain read on large inputs (eps does not matter), eps on inputs over 4 magnitudes. Of
    kinds that fit alike (``layer`` and ``unbiased``; any with eps 0), the first whose gain (or 1 +
    it, Gemma's) is among ``known`` (the block's values, sorted), else the first."""

    def run(t: Tensor) -> Tensor:
        with torch.no_grad():
            return f(t.to(like.dtype)).double()

    g, shape = torch.Generator().manual_seed(5), like.shape
    z = torch.randn(shape, generator=g, dtype=torch.float64)
    big = 100.0 * (1.0 + torch.rand(shape, generator=g, dtype=torch.float64))  # all positive
    scales = 10.0 ** -torch.linspace(0, 4, shape[0] * shape[1], dtype=torch.float64)
    small = torch.randn(shape, generator=g, dtype=torch.float64) * scales.reshape(*shape[:2], 1)
    centred = False
    try:
        fz = run(z)
        if close(fz, z.to(like.dtype).double(), 1e-12):  # the identity, in the block's dtype
            return NormRead("none", lambda h: h, params=params)
        centred = close(run(z + 3.0), fz, 1e-6)  # a LayerNorm: it subtracts the mean first
        odd = _channels((fz + run(-z)) / 2)  # (C,): the bias of a norm odd but for it
        fb, outputs = run(big), [(t, run(t)) for t in (z, small)]
    except CAUGHT:
        return NormRead("layer" if centred else "unknown", f, params=params)
    odd = torch.where(odd.abs() <= 1e-9 * float(fz.abs().max()), 0.0, odd)
    first: NormRead | None = None  # the first kind that fits (none with a gain among ``known``)
    # only a LayerNorm's kinds subtract the mean (centred): the others cannot fit, nor are tried
    for kind in (k for k in kinds if (k in NORM_KINDS[:3]) == centred):
        bias = odd if kind in NORM_KINDS and (kind != "rms" or odd.any()) else None
        moved = fb - (0.0 if bias is None else bias)
        gain = _channels(moved / norm_function(kind, 1.0, None, 0.0)(big))
        solved = _solved(kind, *outputs[1], gain, bias)
        for eps in (*EPS, *solved):  # the kind's first eps that fits, with the gain read at it
            gain = ones(_channels(moved / norm_function(kind, 1.0, None, eps)(big)))
            same = norm_function(kind, gain, bias, eps)
            if (error := max(_off(same(t), out) for t, out in outputs)) <= CLOSE:
                # a LayerNorm as the block computes it; a mistaken one too, its rounding not
                # amplified in ours (mean(x)^2 near 0 turns float32's 1e-7 into 1e-4)
                same = same if kind in ("unbiased", "std", "rms") else f
                n = NormRead(kind, same, eps, params, gain, bias)
                if (own := _own(n, known, error)) is not None:
                    return own
                first = first or n
                break
    return first or NormRead("layer" if centred else "unknown", f, params=params)


def _own(n: NormRead, known: Tensor | None, error: float) -> NormRead | None:
    """``n``, its gain (or 1 + it, Gemma's) and bias as among ``known``; else ``None``."""
    if known is None or not len(known):
        return n
    gain = cast(Tensor, n.gain)
    tol = max(1e-9, 10 * error) * float(gain.abs().max())  # the fit's own precision
    for offset in (0.0, 1.0):
        if (own := snap(gain - offset, known, tol)) is not None:
            b = None if n.bias is None else snap(n.bias, known, tol)
            return replace(n, gain=own[0] + offset, bias=n.bias if b is None else b[0])
    return None


def ones(t: Tensor) -> Tensor:
    """Entries within 1e-6 of 1 as exactly 1, which the checker takes as no weight (a weightless
    norm in float32 reads 1 to 1e-7)."""
    return torch.where((t - 1.0).abs() <= 1e-6, torch.ones_like(t), t)


def _channels(t: Tensor) -> Tensor:  # (..., C) -> (C,): the median of each channel
    return t.flatten(0, -2).median(dim=0).values


DENSE: dict[str, Callable[[Tensor], Tensor]] = {
    **CANDIDATE_ACTIVATIONS, "relu2": lambda u: F.relu(u).square(), "silu": F.silu,
    "quick_gelu": lambda u: u * torch.sigmoid(1.702 * u),
}  # fmt: skip
# relu2: nanochat's and the speedrun's relu(x)^2; quick_gelu: OpenAI CLIP's approximate GELU
MODERN_ONLY = frozenset(DENSE) - frozenset(CANDIDATE_ACTIVATIONS)  # the lessons' has not

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


_NAMED: dict[str, Callable[[Tensor], Tensor]] = {
    "tanh": torch.tanh, "sigmoid": torch.sigmoid, "elu": F.elu, "selu": F.selu, "celu": F.celu,
    "leaky_relu": F.leaky_relu, "softplus": F.softplus, "mish": F.mish, "hardswish": F.hardswish,
    "relu6": F.relu6, "softsign": F.softsign,
}  # fmt: skip


def _between(z: Tensor, u: Tensor, t: Tensor) -> Tensor:
    """The function through the points (``u``, ``t``) (``u`` ascending) at ``z``, linear
    between (and beyond) them."""
    at = torch.searchsorted(u, z.contiguous()).clamp(1, len(u) - 1)
    u0, u1, t0, t1 = u[at - 1], u[at], t[at - 1], t[at]
    return t0 + (z - u0) / (u1 - u0).clamp_min(1e-12) * (t1 - t0)


def other_activation(read: ModernRead) -> tuple[str, MlpRead | None]:
    """The dense MLP's activation where it is one function of each first-layer output, neither
    linear (no activation: a mistake) nor one of ``DENSE``, and the MLP with that function as
    traced (the rest of the block is compared: its mistakes named, never a PASS); "" otherwise."""
    first = affine(*read.mlp[0])
    u, t = first(read.rows("fc1")).flatten(), read.rows("fc2").flatten()
    if len(read.mlp) != 2 or u.shape != t.shape or not torch.isfinite(torch.cat([u, t])).all():
        return "", None  # (gate and up packed: twice as wide; NaN rows: a mask the wrong way)
    order = u.argsort()
    u, t = u[order], t[order]  # (N,): every other value, interpolated from its two neighbours
    left, mid, right = slice(0, -2, 2), slice(1, -1, 2), slice(2, None, 2)
    share = ((u[mid] - u[left]) / (u[right] - u[left]).clamp_min(1e-12)).clamp(0, 1)
    scale = float(t.abs().max()) + 1e-12
    if float((t[left] + share * (t[right] - t[left]) - t[mid]).abs().max()) > 1e-2 * scale:
        return "", None  # not one function of each value: a per-channel part, mixed channels
    line = torch.linalg.lstsq(torch.stack([u, torch.ones_like(u)], 1), t[:, None]).solution
    if float((u * line[0] + line[1] - t).abs().max()) <= 1e-6 * scale:
        return "", None
    name = next((n for n, f in _NAMED.items() if close(f(u), t)), "an elementwise function")
    hidden = lambda h: _between(first(h), u, t)  # noqa: E731  (exact at the traced values)
    width = read.mlp[-1][0].shape[1]
    said = f"the activation {name} (not GELU, ReLU, SiLU, ReLU squared or quick GELU)"
    return said, MlpRead(f"dense {name} d_ff={width}", hidden, {}, (read.mlp[0],), "measured")


def _gated_of(
    h: Tensor, target: Tensor, width: int, m: list[Linear], names: list[str]
) -> MlpRead | None:  # names: the parameters of m, "" where packed
    f = [affine(*w) for w in m]
    u = [layer(h) for layer in f]  # the two first-layer outputs, (B, T, H) each
    said = [set(re.split(r"[._]", name.lower())) for name in names]  # (W1: w1)
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
                hidden = lambda h, g=f[gate], p=f[up], act=act: act(g(h)) * p(h)  # noqa: E731
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
