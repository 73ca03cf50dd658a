"""What a modern block's norms and MLP compute, told from their traced values.

``norm_of`` says whether a norm is a LayerNorm, an RMSNorm or one of ``steps.NORM_FORMS``'
mistaken forms, with its gain and eps; ``mlp_of`` whether the MLP is dense with one of ``DENSE``'
activations, gated (``act(gate) * up``) or a catalogued mistake of a gated one.

Shapes: B batch, T time, C channels, H the MLP's hidden width.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.nn import functional as F

from ..mistakes.report import CAUGHT
from ..mistakes.search import distance
from ..mistakes.steps import CANDIDATE_ACTIVATIONS, NORM_FORMS, rms
from .modern_read import Linear, ModernRead

__all__ = ["DENSE", "MlpRead", "NormRead", "close", "lin", "mlp_of", "norm_of"]

Tensor = torch.Tensor
EPS = (1e-5, 1e-6, 1e-8, 1e-12, 2.0**-23, 2.0**-52, 1e-4, 1e-3, 1e-2, 0.0)
"""The eps values blocks use (Llama's 1e-5 and 1e-6, ``F.rms_norm``'s default, the finfo eps of
float32 and float64), tried in turn; where two fit, the inputs cannot tell them apart."""
CLOSE = 1e-5  # a part reproduces a traced value to this much of its scale (float32 inside: 1e-7)


def close(a: Tensor, b: Tensor, tol: float = CLOSE) -> bool:
    """Whether ``a`` and ``b`` agree to ``tol`` (``search.distance``) and are undefined at the
    same positions, wherever that is (a root of a negative mean)."""
    return torch.equal(torch.isfinite(a), torch.isfinite(b)) and distance(a, b, 0.0) <= tol


@dataclass(frozen=True)
class NormRead:
    """One norm: its form (``layernorm``, ``none``, ``unknown`` or a key of ``NORM_FORMS``), the
    function the reference uses for it, and its gain and eps where it is an RMS form."""

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
    """What the norm ``f`` computes, on inputs shaped and typed as ``like`` (B, T, C): its gain
    read on large positive inputs (where eps does not matter), its eps on inputs ranging over
    four orders of magnitude (where it decides the output).

    Example:
        >>> w = torch.linspace(0.5, 1.5, 8, dtype=torch.float64)
        >>> f = lambda h: h / (h.pow(2).mean(-1, keepdim=True).sqrt() + 1e-6) * w
        >>> norm_of(f, torch.zeros(2, 3, 8, dtype=torch.float64)).form
        'eps_outside'
    """

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
        for eps in EPS:
            if all(close(out, F.layer_norm(t, (C,), gain, bias, eps)) for t, out in outputs):
                return NormRead(form, f, eps, params, gain, bias)
        return NormRead(form, f, params=params)
    for form in NORM_FORMS:
        gain = (fb / rms(big, 1.0, 0.0, form)).flatten(0, -2).median(dim=0).values  # (C,)
        for eps in EPS:
            if all(close(out, rms(t, gain, eps, form)) for t, out in outputs):
                same = lambda h, g=gain, e=eps, n=form: rms(h, g.to(h.dtype), e, n)  # noqa: E731
                return NormRead(form, same, eps, params, gain)
    return NormRead("unknown", f, params=params)


DENSE: dict[str, Callable[[Tensor], Tensor]] = {
    **CANDIDATE_ACTIVATIONS, "relu2": lambda u: F.relu(u).square(), "silu": F.silu,
}  # fmt: skip
"""The activations of a dense MLP (``relu2``: nanochat's and the speedrun's relu(x)^2)."""

GATED = {name: DENSE[name] for name in ("silu", "gelu", "gelu_tanh")}
"""The activations of a gated MLP's gate: SiLU (SwiGLU, Llama), GELU (GeGLU, Gemma)."""

_GATE, _UP = {"gate", "w1"}, {"up", "w3"}  # Hugging Face's gate_proj / up_proj, Meta's w1 / w3


@dataclass(frozen=True)
class MlpRead:
    """What the MLP computes: a description, its hidden function (first layers -> the last
    layer's input), its catalogued mistakes, and a standard form's activation (``DENSE``' or
    ``GATED``')."""

    describe: str
    hidden: Callable[[Tensor], Tensor]
    mistakes: dict[str, str]
    layers: tuple[Linear, ...] = ()  # the first layer, or the gate's and the up projection's
    activation: str | None = None  # None: a catalogued mistake, no standard form
    gated: bool = False


def lin(h: Tensor, w: Linear) -> Tensor:
    return F.linear(h, w[0].to(h.dtype), w[1].to(h.dtype))


def mlp_of(read: ModernRead) -> MlpRead | None:
    """The MLP's form, if a dense or gated form or a catalogued mistake reproduces its traced
    hidden values. A first layer of 2H rows may be gate and up, in halves or interleaved."""
    h, target, width = read.h2, read.hidden, read.mlp[-1][0].shape[1]
    if len(read.mlp) == 3:
        return _gated_of(h, target, width, read.mlp[:2], read.mlp_names[:2])
    w = read.mlp[0]
    a = lin(h, w)
    for name, act in DENSE.items():
        if close(act(a), target):
            hidden = lambda h, act=act: act(lin(h, w))  # noqa: E731
            return MlpRead(f"dense {name} d_ff={width}", hidden, {}, (w,), name)
    if w[0].shape[0] != 2 * width:
        return None
    halves = (slice(0, width), slice(width, None)), (slice(0, None, 2), slice(1, None, 2))
    found = (_gated_of(h, target, width, [(w[0][r], w[1][r]) for r in o], ["", ""]) for o in halves)
    return next((m for m in found if m is not None), None)


def _gated_of(
    h: Tensor, target: Tensor, width: int, m: list[Linear], names: list[str]
) -> MlpRead | None:
    """A gated MLP of the first layers ``m`` (their parameters ``names``: "" where one matrix
    holds both), or a catalogued mistake of it."""
    u = [lin(h, w) for w in m]  # the two first-layer outputs, (B, T, H) each
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
                g, p = m[gate], m[up]
                hidden = lambda h, g=g, p=p, act=act: act(lin(h, g)) * lin(h, p)  # noqa: E731
                return MlpRead(f"{label} d_ff={width}", hidden, mistakes, (g, p), name, True)
    for label, form in _WRONG.items():
        if close(form(u[0], u[1]), target):
            paired = lambda h, form=form: form(lin(h, m[0]), lin(h, m[1]))  # noqa: E731
            return MlpRead(f"gated d_ff={width}", paired, {"swiglu_silu": label})
    return None


_WRONG: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "SiLU on the product of the two branches: silu(w1 x * w3 x)": lambda a, b: F.silu(a * b),
    "no SiLU at all: w1 x * w3 x": lambda a, b: a * b,
    "SiLU on both branches: silu(w1 x) * silu(w3 x)": lambda a, b: F.silu(a) * F.silu(b),
}
"""SwiGLU with its SiLU on the wrong branch (the catalogue's ``swiglu_silu``)."""
