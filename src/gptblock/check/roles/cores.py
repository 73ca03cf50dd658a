"""The attention cores of one recorded forward pass: where softmax weights, a product of q and
k, meet v (``A @ v``, written either way round, or a fused ``scaled_dot_product_attention``).
docs/checker.md, "The roles, from the dataflow". B batch, T time, nh heads, hs head size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .trace import Op, Trace

__all__ = ["PRODUCTS", "Core", "cores", "data"]

Tensor = torch.Tensor
PRODUCTS = ("bmm", "baddbmm", "mm")  # of two data operands (baddbmm beta 0: ``data``)


def data(trace: Trace, op: Op) -> list[int]:  # (baddbmm's input, with beta 0, is not read)
    first = 1 if op.name in ("baddbmm", "addmm") and op.kwargs.get("beta", 1) == 0 else 0
    return [n for n in op.inputs[first:] if trace.nodes[n].data]


@dataclass(frozen=True)
class Core:
    q: int
    k: int
    v: int
    y: int
    groups: int  # G: the batch of the product, B * heads
    time: int  # the length attention runs along (T, or B when the block mixes them up)
    A: int | None = None  # the softmax weights the product reads (None: a fused core)
    scores: Op | None = None  # the product of q and k behind them


def cores(trace: Trace) -> list[Core]:
    out, A, scores = [], None, None
    for op in trace.ops:
        moved = data(trace, op)
        if "scaled_dot_product" in op.name and len(moved) >= 3:
            (q, k, v), A, scores = op.inputs[:3], None, None
            time = trace.nodes[q].shape[-2]
        elif op.name in PRODUCTS and len(moved) == 2 and (found := _weighted(trace, moved)):
            A, v, flipped, scores = found
            q, k = data(trace, scores)
            if _keys_first(trace, scores, A, flipped):
                q, k = k, q
            time = trace.nodes[A].shape[-2 if flipped else -1]  # the keys: the product's inner axis
        else:
            continue
        per = time * (trace.nodes[q].shape[-1] if A is None else time)  # (T, hs) of q, (T, T) of A
        groups = trace.nodes[q if A is None else A].value.numel() // per  # A (B, nh * T, T): nh
        out.append(Core(q, k, v, op.outputs[0], groups, time, A, scores))
    return out


def _weighted(trace: Trace, moved: list[int]) -> tuple[int, int, bool, Op] | None:
    """(A, v, whether A is on the right, the scores' product) of ``A @ v`` or ``v^T @ A^T``."""
    for A, v, flipped in ((moved[0], moved[1], False), (moved[1], moved[0], True)):
        value = trace.nodes[A].value
        finite = value[torch.isfinite(value)]
        probabilities = finite.numel() > 0 and 0 <= finite.min() and finite.max() <= 1 + 1e-6
        rows, keys = value.shape[-2:][::-1] if flipped else value.shape[-2:]
        if rows % keys or not probabilities:  # rows: queries, or heads x queries (multi-query)
            continue
        made = filter(None, map(trace.producer, trace.ancestors(A)))  # the scores: the latest
        found = [op for op in made if op.name in PRODUCTS and len(data(trace, op)) == 2]  # of these
        if found:
            return A, v, flipped, max(found, key=lambda op: op.index)
    return None


def _keys_first(trace: Trace, scores: Op, A: int, flipped: bool) -> bool:
    """Whether the scores' product is ``(k @ q^T)^T``: the probabilities follow S^T."""
    S, P = trace.nodes[scores.outputs[0]].value, trace.nodes[A].value
    if S.numel() != P.numel() or S.shape[-1] != S.shape[-2] or S.shape[-1] < 2:
        return False
    n = S.shape[-1]
    S, P = S.reshape(-1, n, n).double(), P.reshape(-1, n, n).double()
    P = P.mT if flipped else P  # A^T: the queries back on the rows
    m = min(n, 32)  # a few heads' first positions tell it: (G, n, n, n) pairs stay small
    S, P = S[:4, :m, :m], P[:4, :m, :m]
    return _agreement(S.mT, P) > _agreement(S, P)


def _agreement(S: Tensor, P: Tensor) -> float:
    """The share of pairs of positive probabilities in a row (or column) ordered as the scores."""
    best = 0.0
    for axis in (-1, -2):
        s, p = S.unsqueeze(axis) - S.unsqueeze(axis - 1), P.unsqueeze(axis) - P.unsqueeze(axis - 1)
        live = (P > 1e-300).unsqueeze(axis) & (P > 1e-300).unsqueeze(axis - 1)
        live = live & (p != 0) & torch.isfinite(s)
        if live.any():
            best = max(best, float(((s > 0) == (p > 0))[live].double().mean()))
    return best
