"""A correct modern block's parts as plain numbers, and the block rebuilt from them.

In ``gptblock check`` the modern comparison (``gptblock.check.modern``) runs in the block's own
process, so its PASS is a claim. When it finds the modern block with no mistake, that process
also sends the parts it read (``send``): the q, k, v and output projections, the MLP's matrices
and activation, the norms' eps and gains, the rotary embedding, the qk norm's gains and the head
counts. The checker rebuilds the block from those numbers alone (``receive``) and runs it with
its own code (``ModernParts.run``, the steps of ``gptblock.check.modern_steps``); the verdict
(``gptblock.check.modern_confirm``) then holds them to the values it chose and to the block's
outputs on inputs the block never saw.

Only what the standard forms express is sent: RMSNorm (pre-norm or parallel), a dense or gated
MLP, rotary positions turned by the angle (not minus it, as nanochat's) with a table that fits
their pairing. Anything else (a LayerNorm, a post-norm block, nanochat's direction) sends
nothing, and the PASS stays unverified.

Shapes: B batch, T time, C channels, D = nh * hs, Dkv = nkv * hs, H the MLP's hidden width.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.nn import functional as F

from .modern_parts import DENSE, GATED
from .modern_steps import Modern, Rope, attention, rms
from .plain import NotPlain
from .steps import CORRECT

if TYPE_CHECKING:
    from .modern_parts import MlpRead, NormRead
    from .modern_read import ModernRead

__all__ = ["ModernParts", "receive", "send"]

Tensor = torch.Tensor
LINEARS = ("q", "k", "v", "proj")


@dataclass(frozen=True)
class ModernParts:
    """A modern block as numbers: ``linears`` role -> (weight, bias) for q, k, v, proj and the
    MLP's ``mlp0`` (the gate, or the dense first layer), ``mlp1`` (the up projection, if gated)
    and ``mlp2`` (the last layer); ``gains`` ln1, ln2 (C,) and lnq, lnk (hs,) when the block
    normalises q and k."""

    linears: dict[str, tuple[Tensor, Tensor]]
    gains: dict[str, Tensor]
    eps: tuple[float, float]
    n_head: int
    activation: str
    gated: bool
    parallel: bool
    rope: Rope | None

    def run(self, x: Tensor) -> Tensor:
        """The block on ``x`` (B, T, C) in float64."""
        x = x.to(torch.float64)
        lin = {
            r: (w.double(), b.double()) for r, w, b in ((r, *p) for r, p in self.linears.items())
        }
        g = {r: v.double() for r, v in self.gains.items()}
        qk = (g["lnq"], g["lnk"]) if "lnq" in g else None

        def attn(h: Tensor) -> Tensor:
            q, k, v = (F.linear(h, *lin[r]) for r in ("q", "k", "v"))
            ctx = attention(q, k, v, self.n_head, self.rope, Modern(), CORRECT, qk)  # (B, T, D)
            return F.linear(ctx, *lin["proj"])

        def mlp(h: Tensor) -> Tensor:
            if self.gated:
                u = GATED[self.activation](F.linear(h, *lin["mlp0"])) * F.linear(h, *lin["mlp1"])
            else:
                u = DENSE[self.activation](F.linear(h, *lin["mlp0"]))  # (B, T, H)
            return F.linear(u, *lin["mlp2"])

        ln1 = rms(x, g["ln1"], self.eps[0])
        if self.parallel:  # GPT-J / PaLM: both branches read the stream x
            return x + attn(ln1) + mlp(rms(x, g["ln2"], self.eps[1]))
        x = x + attn(ln1)
        return x + mlp(rms(x, g["ln2"], self.eps[1]))


def _activation(describe: str) -> tuple[str, bool] | None:
    """(activation, gated) from ``MlpRead.describe`` ('swiglu d_ff=..', 'dense gelu d_ff=..')."""
    words = describe.split()
    if words[0] == "swiglu":
        return "silu", True
    if words[0] == "gated" and words[1] in GATED:
        return words[1], True
    if words[0] == "dense" and words[1] in DENSE:
        return words[1], False
    return None


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
    act = _activation(mlp.describe)
    if (
        post or act is None or any(n.form != "rms" or n.gain is None for n in norms)
        or (rope is not None and (rope.sign != 1.0 or rope.table != rope.pairing))
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
    tensors.update(
        {f"ln{i + 1}": n.gain.detach().cpu() for i, n in enumerate(norms) if n.gain is not None}
    )
    if qk_norm is not None:
        tensors.update({"lnq": qk_norm[0].detach().cpu(), "lnk": qk_norm[1].detach().cpu()})
    meta = {
        "eps": [n.eps for n in norms],
        "n_head": read.n_head,
        "activation": act[0],
        "gated": act[1],
        "parallel": read.parallel,
        "rope": None if rope is None else [rope.theta, rope.dim, rope.pairing],
    }
    return meta, tensors


def receive(meta: Any, tensors: dict[str, Tensor], C: int) -> ModernParts:
    """The parts another process sent (``send``), checked to fit together.

    Raises:
        NotPlain: they do not.
    """
    try:
        n_head, gated = meta["n_head"], meta["gated"] is True
        activation, eps = meta["activation"], [float(e) for e in meta["eps"]]
        roles = [*LINEARS, "mlp0", *(["mlp1"] if gated else []), "mlp2"]
        linears = {r: (tensors[f"{r}.w"], tensors[f"{r}.b"]) for r in roles}
        gains: dict[str, Tensor] = {
            r: tensors[r] for r in ("ln1", "ln2", "lnq", "lnk") if r in tensors
        }
        rope = meta["rope"]
    except (KeyError, TypeError, ValueError) as e:
        raise NotPlain(f"the modern parts sent are incomplete ({e})") from None
    if (
        not isinstance(n_head, int)
        or not 1 <= n_head <= 4096
        or activation not in (GATED if gated else DENSE)
        or len(eps) != 2
        or not all(math.isfinite(e) and 0 <= e < 1 for e in eps)
    ):
        raise NotPlain("the modern parts sent do not describe a block")
    D = linears["q"][0].shape[0]
    hs = D // n_head
    ts = [t for w in linears.values() for t in w] + list(gains.values())
    if (
        not all(t.is_floating_point() and bool(torch.isfinite(t).all()) for t in ts)
        or any(w.dim() != 2 or b.shape != w.shape[:1] for w, b in linears.values())
        or D % n_head or linears["k"][0].shape[0] % hs or n_head % (linears["k"][0].shape[0] // hs or 1)
        or {"ln1", "ln2"} - set(gains) or ("lnq" in gains) != ("lnk" in gains)
        or any(g.shape != ((hs,) if r in ("lnq", "lnk") else (C,)) for r, g in gains.items())
    ):  # fmt: skip
        raise NotPlain("the modern parts sent do not fit together")
    made = None
    if rope is not None:
        if not (
            isinstance(rope, list) and len(rope) == 3 and rope[2] in ("halves", "adjacent")
            and isinstance(rope[1], int) and 2 <= rope[1] <= hs and rope[1] % 2 == 0
            and isinstance(rope[0], float) and 1.0 < rope[0] < 1e9
        ):  # fmt: skip
            raise NotPlain("the rotary embedding sent is not one the checker knows")
        made = Rope(rope[0], rope[1], rope[2], rope[2], 1.0)
    parallel = meta.get("parallel") is True
    return ModernParts(linears, gains, (eps[0], eps[1]), n_head, activation, gated, parallel, made)
