"""A correct modern block's parts as plain numbers, and the block rebuilt from them.

The modern comparison's PASS is a claim of the block's process, which therefore sends the parts
it read (``send``: projections, the MLP's matrices and activation, the norms' forms, eps and
gains, the rotary embedding, the qk norm's gains, the head counts). The checker rebuilds the
block from those numbers alone (``receive``), holds each number to the values it chose
(``unpack_modern``, as ``plain`` holds the lessons' readings) and runs it with its own code
(``ModernParts.run``) against the block on fresh inputs (``compare.verdict``). Only the standard
forms are sent (docs/checker.md, "Where it runs, and what that means for PASS"); anything else
sends nothing, and the PASS stays unverified.

Shapes: B batch, T time, C channels, D = nh * hs, Dkv = nkv * hs, H the MLP's hidden width.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch
from torch.nn import functional as F

from ..mistakes.steps import CORRECT, Parts, Rope, SubLayer, affine, parallel, rms, run_steps
from .modern_parts import DENSE, GATED
from .plain import NotPlain
from .provenance import Traced, snap, trace

if TYPE_CHECKING:
    from .modern_parts import MlpRead, NormRead
    from .modern_read import ModernRead

__all__ = ["READ", "SNAP", "ModernParts", "receive", "send", "unpack_modern"]

Tensor = torch.Tensor
LINEARS = ("q", "k", "v", "proj")
SNAP = 1e-3  # a gain read as a ratio is this close (x its scale) to the value the checker chose
READ = 1e-6  # a matrix measured from traced values (a float32 step on the way) is this close


@dataclass(frozen=True)
class ModernParts:
    """A modern block as numbers: ``linears`` role -> (weight, bias) for q, k, v, proj and the
    MLP's ``mlp0`` (the gate, or the dense first layer), ``mlp1`` (the up projection, if gated)
    and ``mlp2`` (the last layer); ``gains`` ln1, ln2 -> (gain (C,),) for an RMSNorm, (gain,
    bias) for a LayerNorm (``forms``), and lnq, lnk -> (gain (hs,),) when the block normalises
    q and k; ln2 is absent when a parallel block's two branches read one norm (``shared``)."""

    linears: dict[str, tuple[Tensor, Tensor]]
    gains: dict[str, tuple[Tensor, ...]]
    eps: tuple[float, float]
    n_head: int
    activation: str
    gated: bool
    parallel: bool
    rope: Rope | None
    forms: tuple[str, str] = ("rms", "rms")  # "rms" or "layernorm", before attention and MLP
    shared: bool = False

    def run(self, x: Tensor) -> Tensor:
        """The block on ``x`` (B, T, C) in float64 (``steps.run_steps``)."""
        lin = {r: affine(w.double(), b.double()) for r, (w, b) in self.linears.items()}
        g = {r: [t.double() for t in v] for r, v in self.gains.items()}
        qk = (g["lnq"][0], g["lnk"][0]) if "lnq" in g else None

        def norm(i: int) -> SubLayer:
            ps, eps = g["ln1" if self.shared else f"ln{i + 1}"], self.eps[i]
            if self.forms[i] == "layernorm":  # (h - mean) / sqrt(var + eps) * gain + bias
                return lambda h: F.layer_norm(h, h.shape[-1:], ps[0], ps[1], eps)
            return lambda h: rms(h, ps[0], eps)

        def qkv(h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            return lin["q"](h), lin["k"](h), lin["v"](h)

        act = (GATED if self.gated else DENSE)[self.activation]
        if self.gated:
            hidden: SubLayer = lambda h: act(lin["mlp0"](h)) * lin["mlp1"](h)  # noqa: E731
        else:
            hidden = lambda h: act(lin["mlp0"](h))  # noqa: E731
        C, D = x.shape[-1], self.linears["q"][0].shape[0]
        parts = Parts(C, D, qkv, lin["proj"], hidden, lin["mlp2"], norm(0), norm(1))
        steps = replace(CORRECT, wiring=parallel) if self.parallel else CORRECT
        return run_steps(parts, x.to(torch.float64), self.n_head, None, steps, self.rope, qk)


def _plain_gain(t: Tensor) -> Tensor:
    """A gain read as a ratio, with entries within 1e-9 of 1 sent as exactly 1 (a norm without a
    weight: the checker takes exact 1s as no weight, and 1 + 1e-16 for a value it chose)."""
    t = t.detach().cpu()
    return torch.where((t - 1.0).abs() < 1e-9, torch.ones_like(t), t)


def send(
    read: ModernRead,
    norms: list[NormRead],
    mlp: MlpRead,
    rope: Rope | None,
    qk_norm: tuple[Tensor, Tensor] | None,
    post: bool,
) -> tuple[dict[str, Any], dict[str, Tensor]] | None:
    """The parts of a block the modern comparison found correct, as (meta, tensors), or None
    when a standard form cannot express them: ``rope`` and ``qk_norm`` are the attention's
    match (``modern.AttnMatch``), one without changes."""
    if (
        post or mlp.activation is None
        or any(n.form not in ("rms", "layernorm") or n.gain is None for n in norms)
        or any(n.form == "layernorm" and n.bias is None for n in norms)
        or (rope is not None and rope.table != rope.pairing)
        or (read.rotated and rope is None)  # turned by something the forms do not name
    ):  # fmt: skip
        return None
    layers = [*mlp.layers, read.mlp[-1]]
    linears = dict(zip(LINEARS, (read.q, read.k, read.v, read.proj), strict=True))
    linears.update({f"mlp{i if i < len(layers) - 1 else 2}": w for i, w in enumerate(layers)})
    tensors = {
        f"{r}.{p}": t.detach().cpu()
        for r, w in linears.items()
        for p, t in zip("wb", w, strict=True)
    }
    # GPT-J's one norm read by both branches: sent once (the same values twice would be read
    # as one parameter read for two roles)
    shared = read.parallel and _same(norms[0], norms[1])
    for i, n in enumerate(norms[:1] if shared else norms):
        if n.gain is not None:
            tensors[f"ln{i + 1}"] = _plain_gain(n.gain)
        if n.bias is not None:
            tensors[f"ln{i + 1}.b"] = n.bias.detach().cpu()
    if qk_norm is not None:
        tensors.update({"lnq": _plain_gain(qk_norm[0]), "lnk": _plain_gain(qk_norm[1])})
    meta = {
        "eps": [n.eps for n in norms],
        "forms": [n.form for n in norms],
        "shared": shared,
        "n_head": read.n_head,
        "activation": mlp.activation,
        "gated": mlp.gated,
        "parallel": read.parallel,
        "rope": None if rope is None else [rope.theta, rope.dim, rope.pairing, rope.sign],
    }
    return meta, tensors


def _same(a: NormRead, b: NormRead) -> bool:
    """Whether two norms read are one: the same parameters, or the same values read."""

    def equal(x: Tensor | None, y: Tensor | None) -> bool:
        return (x is None and y is None) or (x is not None and y is not None and torch.equal(x, y))

    if a.params and a.params == b.params:
        return True
    return a.form == b.form and a.eps == b.eps and equal(a.gain, b.gain) and equal(a.bias, b.bias)


def receive(meta: Any, tensors: dict[str, Tensor], C: int) -> ModernParts:
    """The parts another process sent (``send``), checked to fit together.

    Raises:
        NotPlain: they do not.
    """
    try:
        n_head, gated = meta["n_head"], meta["gated"] is True
        activation, eps = meta["activation"], [float(e) for e in meta["eps"]]
        forms = tuple(meta.get("forms") or ("rms", "rms"))
        parallel, shared = meta.get("parallel") is True, meta.get("shared") is True
        roles = [*LINEARS, "mlp0", *(["mlp1"] if gated else []), "mlp2"]
        linears = {r: (tensors[f"{r}.w"], tensors[f"{r}.b"]) for r in roles}
        norms = ("ln1",) if shared else ("ln1", "ln2")
        gains: dict[str, tuple[Tensor, ...]] = {
            r: (tensors[r], *([tensors[f"{r}.b"]] if forms[i] == "layernorm" else []))
            for i, r in enumerate(norms)
        }
        gains.update({r: (tensors[r],) for r in ("lnq", "lnk") if r in tensors})
        rope = meta["rope"]
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise NotPlain(f"the modern parts sent are incomplete ({e})") from None
    if (
        not isinstance(n_head, int)
        or not 1 <= n_head <= 4096
        or activation not in (GATED if gated else DENSE)
        or len(eps) != 2
        or not all(math.isfinite(e) and 0 <= e < 1 for e in eps)
        or len(forms) != 2
        or not all(f in ("rms", "layernorm") for f in forms)
        or (shared and (not parallel or forms[0] != forms[1] or eps[0] != eps[1]))
    ):
        raise NotPlain("the modern parts sent do not describe a block")
    D = linears["q"][0].shape[0]
    hs = D // n_head
    ts = [t for w in [*linears.values(), *gains.values()] for t in w]
    if (
        not all(t.is_floating_point() and bool(torch.isfinite(t).all()) for t in ts)
        or any(w.dim() != 2 or b.shape != w.shape[:1] for w, b in linears.values())
        or D % n_head or linears["k"][0].shape[0] % hs or n_head % (linears["k"][0].shape[0] // hs or 1)
        or ("lnq" in gains) != ("lnk" in gains)
        or any(t.shape != ((hs,) if r in ("lnq", "lnk") else (C,)) for r, g in gains.items() for t in g)
    ):  # fmt: skip
        raise NotPlain("the modern parts sent do not fit together")
    made = None
    if rope is not None:
        if not (
            isinstance(rope, list) and len(rope) == 4 and rope[2] in ("halves", "adjacent")
            and isinstance(rope[1], int) and 2 <= rope[1] <= hs and rope[1] % 2 == 0
            and isinstance(rope[0], float) and 1.0 < rope[0] < 1e9 and rope[3] in (1.0, -1.0)
        ):  # fmt: skip
            raise NotPlain("the rotary embedding sent is not one the checker knows")
        made = Rope(rope[0], rope[1], rope[2], rope[2], float(rope[3]))
    return ModernParts(
        linears, gains, (eps[0], eps[1]), n_head, activation, gated, parallel, made,
        (forms[0], forms[1]), shared,
    )  # fmt: skip


def unpack_modern(
    modern: Mapping[str, Any], C: int, dtype: torch.dtype, chosen: Mapping[str, Tensor]
) -> tuple[ModernParts, Traced] | str:
    """The parts a modern block's process sent (``send``), received, each number snapped to the
    nearest value the checker chose (within ``READ`` of its scale for a matrix measured from
    traced values, ``SNAP`` for a norm's gain read as a ratio, plus 1 for a gain stored as
    ``gain - 1``) and traced to them (``provenance``); else why they cannot be."""
    if not modern.get("parts"):
        return "its process sent no parts the checker can rebuild it from"
    try:
        parts = receive(modern["parts"], dict(modern.get("tensors") or {}), C)
    except NotPlain as e:
        return str(e)
    values = torch.cat([v.to(dtype).to(torch.float64).flatten() for v in chosen.values()])
    values = values.sort().values
    if not values.numel():
        return "the checker gave the block no values to trace its weights to"
    roles: dict[str, list[Tensor]] = {}
    for role, ts in [*parts.linears.items(), *parts.gains.items()]:
        gain = role.startswith("ln")  # (gain,) or a LayerNorm's (gain, bias): read as ratios
        snapped = [
            snap(t, values, (SNAP if gain else READ) * _scale(t) + 1e-300,
                 (0.0, 1.0) if gain and i == 0 else (0.0,))
            for i, t in enumerate(ts)
        ]  # fmt: skip
        if any(s is None for s in snapped):
            return f"the weights read for {role} are not the values the checker gave the block"
        roles[role] = [s for s in snapped if s is not None]
    hs = parts.linears["q"][0].shape[0] // parts.n_head
    heads = {r: parts.linears[r][0].shape[0] // hs for r in ("q", "k", "v")}
    traced = trace(roles, chosen, dtype, heads)
    if traced.why:
        return traced.why
    linears = {r: (w[0], w[1]) for r, w in roles.items() if not r.startswith("ln")}
    gains = {r: tuple(w) for r, w in roles.items() if r.startswith("ln")}
    return ModernParts(**{**parts.__dict__, "linears": linears, "gains": gains}), traced


def _scale(t: Tensor) -> float:
    return float(t.abs().max()) if t.numel() else 0.0
