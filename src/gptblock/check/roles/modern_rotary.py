"""A block's rotary embedding measured from its forward pass: which channels turn, and how fast.

The map from q's projection to the score product is replayed on one channel lit at every
position: at position 1 a rotated channel i leaks into its partner j by ``sin(w_i)``, which gives
the rotated channels (r), their pairing, and frequencies that RoPE makes ``theta ** (-2p / r)``.

Shapes: B batch, T time, nh heads, hs head size, r rotated channels of each head.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from ..mistakes.report import CAUGHT
from ..mistakes.steps import Rope
from .trace import Trace, TraceError, replay

__all__ = ["THETAS", "Turn", "heads", "measure_turn", "ropes"]

Tensor = torch.Tensor
THETAS = (10000.0, 1e6, 500000.0, 100000.0)  # GPT-NeoX / Llama 2, Qwen2, Llama 3, others
"""The bases tried where the block's own cannot be measured (``modern_rotary``)."""


def heads(core: Tensor, B: int, nh: int, T: int, hs: int, key: bool = False) -> Tensor | None:
    """The score product's operand ``core`` as (B, nh, T, hs): laid out (..., T, hs) or, as a
    key written ``q @ k.transpose(2, 3)`` reaches a batched product, (..., hs, T); ``key``
    decides when T == hs. None when it holds another number of entries or neither layout."""
    if core.numel() != B * nh * T * hs or core.dim() < 2:
        return None
    rows, last = core.shape[-2:]
    if (rows, last) == (hs, T) and (key or (rows, last) != (T, hs)):
        core = core.transpose(-2, -1)
    elif (rows, last) != (T, hs):
        return None
    return core.reshape(B, nh, T, hs)


@dataclass(frozen=True)
class Turn:
    """What ``measure_turn`` read: the rotated channels of a head, their base, and whether their
    frequencies are that base's ladder at all."""

    dim: int  # r
    theta: float
    fits: bool
    pairing: str  # "halves", "adjacent" or "other": which channel each one leaks into


def measure_turn(
    trace: Trace, source: int, core: int, B: int, nh: int, T: int, hs: int
) -> Turn | None:
    """The rotation between the projection's output ``source`` and the score product's operand
    ``core`` (q's), measured on head 0; None when it cannot be replayed or nothing turns."""
    if T < 2:
        return None
    try:
        run = replay(trace, source, core)
        like = trace.nodes[source].value
        leaks: dict[int, tuple[int, float]] = {}  # channel of head 0 -> (partner, sin w)
        for c in range(like.shape[-1]):
            lit = torch.zeros_like(like)
            lit[..., c] = 1.0
            with torch.no_grad():
                out = heads(run(lit), B, nh, T, hs)
            if out is None:
                return None
            at0, at1 = out[0, :, 0].double(), out[0, :, 1].double()  # (nh, hs)
            head, i = divmod(int(at0.abs().argmax()), hs)
            if head == 0 and float(at0.abs().max()) != 0.0 and i not in leaks:
                other = at1[0].clone()
                other[i] = 0.0
                j = int(other.abs().argmax())
                leaks[i] = (j, float(other[j].abs() / at0[0, i].abs()))
    except (*CAUGHT, TraceError):
        return None
    turned = {i: (j, s) for i, (j, s) in leaks.items() if s > 1e-9}
    r = len(turned)
    if r < 2 or r % 2:
        return None
    halves = all(j == (i + r // 2) % r for i, (j, _) in turned.items())
    adjacent = all(j == i ^ 1 for i, (j, _) in turned.items())
    pairing = "halves" if halves else "adjacent" if adjacent else "other"
    theta = _ladder(sorted({round(math.asin(min(s, 1.0)), 12) for _, s in turned.values()}), r)
    return Turn(r, theta or 0.0, theta is not None, pairing)


def _ladder(w: list[float], r: int) -> float | None:
    """theta when the frequencies ``w`` are ``theta ** (-2p / r)``, else None."""
    distinct: list[float] = []
    for x in reversed(w):  # fast to slow; within 1e-6 of each other, one (float32 tables)
        if not distinct or abs(distinct[-1] - x) > 1e-6 * distinct[-1]:
            distinct.append(x)
    if len(distinct) != r // 2 or abs(distinct[0] - 1.0) > 1e-4:
        return None
    if r == 2:
        return 10000.0  # one pair turns one radian per position whatever the base
    each = [math.exp(-math.log(x) * r / (2 * p)) for p, x in enumerate(distinct) if p]
    theta = sorted(each)[len(each) // 2]
    if any(abs(t - theta) > 1e-3 * theta for t in each):
        return None
    rounded = (float(f"{theta:.{digits}e}") for digits in range(6))  # 8e6, 10000
    return next((near for near in rounded if abs(near - theta) <= 1e-4 * theta), theta)


def ropes(hs: int, rotated: bool, turn: Turn | None = None) -> list[Rope | None]:
    """Every rotary embedding a correct block may use: with the rotated channels and base
    measured from the block (``turn``), the pairings and directions; without, the common bases
    and widths (``THETAS``: the fallback); ``[None]`` when nothing turns, or the frequencies
    measured are not a base's (a qk norm at most, then)."""
    if not rotated or (turn is not None and not turn.fits):
        return [None]
    dims = [d for d in (hs, hs // 2, hs // 4) if d >= 2 and d % 2 == 0]
    dims, thetas = ([turn.dim], [turn.theta]) if turn else (dims, list(THETAS))
    found = itertools.product(dims, ("halves", "adjacent"), (1.0, -1.0), thetas)
    # what happens between projection and scores may be a qk norm only: None last
    return [*(Rope(theta, dim, pair, pair, sign) for dim, pair, sign, theta in found), None]
