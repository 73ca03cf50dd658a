"""The roles of a block's parts from what its tensors do in one recorded forward pass
(docs/checker.md, "The roles, from the dataflow"): attention cores, q/k/v, proj, the MLP, and the
norms (whatever computes a scale-free function of a mean over the channels). B batch, T time.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..mistakes.report import CAUGHT
from .trace import Op, Trace, replay
from .walks import (
    data,
    forward_end,
    layout,
    reach,
    source,
    static_names,
    to_layout,
    to_weight,
    weight_input,
)

__all__ = [
    "NORM_OPS", "Core", "Norm", "Role", "Roles", "Unread", "find_norms", "find_roles",
    "order_norms",
]  # fmt: skip

Tensor = torch.Tensor


class Unread(Exception):
    """The forward pass does not show the roles; the message says what is missing."""


@dataclass(frozen=True)
class Core:
    """One attention core: q, k, v as the products read them, and its output."""

    q: int
    k: int
    v: int
    y: int
    groups: int  # G: the batch of the product, B * heads
    time: int  # the length attention runs along (T, or B when the block mixes them up)


@dataclass
class Role:
    """A sub-layer read from the trace."""

    put: int  # the node it reads
    get: list[int]  # the nodes it makes (one per attention core)
    params: list[str]  # the parameters behind it
    factor: float = 1.0  # a scalar factor to take out (q and k only)


@dataclass
class Roles:
    roles: dict[str, Role]  # q k v proj fc1 fc2
    heads: int


def _cores(trace: Trace) -> list[Core]:
    cores = []
    for op in trace.ops:
        moved = data(trace, op)
        if "scaled_dot_product" in op.name and len(moved) >= 3:
            q, k, v = op.inputs[:3]
            time = trace.nodes[q].shape[-2]
        elif op.name in ("bmm", "mm") and len(moved) == 2 and (found := _weighted(trace, moved)):
            A, v, flipped, scores = found
            q, k = data(trace, scores)
            if _keys_first(trace, scores, A, flipped):
                q, k = k, q
            time = trace.nodes[A].shape[-1]
        else:
            continue
        shape = trace.nodes[q].shape
        cores.append(Core(q, k, v, op.outputs[0], math.prod(shape[:-2]), time))
    return cores


def _weighted(trace: Trace, moved: list[int]) -> tuple[int, int, bool, Op] | None:
    """(A, v, whether A is on the right, the scores' product) of ``A @ v`` or ``v^T @ A^T``."""
    for A, v, flipped in ((moved[0], moved[1], False), (moved[1], moved[0], True)):
        value = trace.nodes[A].value
        finite = value[torch.isfinite(value)]
        probabilities = finite.numel() > 0 and 0 <= finite.min() and finite.max() <= 1 + 1e-6
        if value.shape[-1] == value.shape[-2] and probabilities and (scores := _scores(trace, A)):
            return A, v, flipped, scores
    return None


def _keys_first(trace: Trace, scores: Op, A: int, flipped: bool) -> bool:
    """Whether the scores' product has k on its left (``(k @ q^T)^T``): the probabilities rise
    and fall with the scores' transpose along the softmax's axis."""
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


def _scores(trace: Trace, A: int) -> Op | None:
    """The latest product of two data tensors that ``A`` was computed from."""
    found = [
        op
        for n in trace.ancestors(A)
        if (op := trace.producer(n)) is not None
        and op.name in ("bmm", "baddbmm", "mm")
        and len(data(trace, op)) == 2
    ]
    return max(found, key=lambda op: op.index) if found else None


def find_roles(trace: Trace, B: int, T: int) -> Roles:
    """The roles in a recorded forward pass of a block on a (B, T, C) input; Unread (saying
    which) where one is missing or does not fit the lessons' block."""
    cores = _cores(trace)
    if not cores:
        raise Unread("no attention: no product of softmax weights with v in the forward pass")
    roles: dict[str, Role] = {}
    heads = 0
    for core in cores:
        batch = B if core.time == T else T
        if core.groups % batch:
            raise Unread(f"the attention's batch {core.groups} is not a multiple of {batch}")
        heads += core.groups // batch
        for name, node in (("q", core.q), ("k", core.k), ("v", core.v)):
            put, get, factor, params = _projection(trace, node, B, T)
            role = roles.setdefault(name, Role(put, [], [], factor if name != "v" else 1.0))
            if name != "v" and abs(role.factor - factor) > 1e-12 * abs(factor):
                raise Unread(f"the heads' {name} are computed differently")
            role.get.append(get)
            role.params += [p for p in params if p not in role.params]
    first = trace.nodes[roles["q"].put].value
    if any(not torch.equal(trace.nodes[r.put].value, first) for r in roles.values()):
        raise Unread("q, k and v are computed from different tensors")
    used = {f[0].index for r in roles.values() for n in r.get if (f := to_weight(trace, n))}
    moved = [reach(trace, core.y, forward=True) for core in cores]  # (nodes, weight products)
    ops = {found[0].index: found[0] for _, found in moved if found}
    common = set.intersection(*(seen for seen, _ in moved))  # every core's output, merged
    shapes = {n: trace.nodes[n].shape for n in common}
    flat = [n for n, shape in shapes.items() if len(shape) == 3 and layout(shape, B, T)]
    if not all(found for _, found in moved) and flat:  # no projection: the heads join the stream
        roles["proj"] = Role(min(flat), [min(flat)], [])
    elif not all(found for _, found in moved) or len(ops) != 1:
        raise Unread("no single output projection reads the attention's output")
    else:
        ((index, proj),) = ops.items()
        roles["proj"] = _role(trace, proj, B, T, heads=True)
        used.add(index)
    rest = [op for op in trace.ops if weight_input(trace, op) is not None and op.index not in used]
    if len(rest) != 2 or rest[0].outputs[0] not in trace.ancestors(rest[1].outputs[0]):
        raise Unread(
            f"{len(rest)} matrix products with weights outside attention, expected the MLP's two"
        )
    roles["fc1"], roles["fc2"] = _role(trace, rest[0], B, T), _role(trace, rest[1], B, T)
    return Roles(roles, heads)


def _projection(trace: Trace, node: int, B: int, T: int) -> tuple[int, int, float, list[str]]:
    """(input node, output node laid out by position, scalar factor, parameters) of q, k or v."""
    out = to_layout(trace, node, B, T)
    found = to_weight(trace, out) if out is not None else None
    if out is None or found is None:
        raise Unread("q, k or v is not a matrix product of the attention's input with a weight")
    op, factor = found
    moved = weight_input(trace, op)
    put = source(trace, moved, B, T) if moved is not None else None
    if put is None:
        raise Unread("the attention's input is not laid out by position")
    return put, out, factor, static_names(trace, [op])


def _role(trace: Trace, op: Op, B: int, T: int, heads: bool = False) -> Role:
    moved = weight_input(trace, op)
    put = source(trace, moved, B, T, heads) if moved is not None else None
    get = forward_end(trace, op, B, T)
    if put is None or get is None:
        raise Unread(
            f"a matrix product ({op.name}) whose input or output is not laid out by position"
        )
    return Role(put, [get], static_names(trace, [op]))


NORM_OPS = frozenset(["native_layer_norm", "layer_norm", "rms_norm", "_fused_rms_norm"])


@dataclass
class Norm:
    """One call of a norm: what it is (``key``), its output node, and as a function."""

    key: str
    first: int
    out: int
    function: Callable[[Tensor], Tensor]
    end: int = 0  # a norm module's call: the operators first:end ran inside it


def rescaled(
    trace: Trace,
    source: int,
    out: int,
    z: Tensor,
    factors: list[Tensor | float],
    shaped: bool = False,
) -> tuple[Callable[[Tensor], Tensor], Tensor, list[float]] | None:
    """The replay from ``source`` to ``out`` (``shaped``: any shape, dtype), its output on ``z``,
    and how far that moves when ``z`` is multiplied by each of ``factors``; None: not finite."""
    try:
        f = replay(trace, source, out)
        f = _shaped(f, trace.nodes[source].value) if shaped else f
        with torch.no_grad():
            a, *outs = [f(z)] + [f(z * by) for by in factors]
        if not isinstance(a, Tensor) or not torch.isfinite(a).all():
            return None
        scale = float(a.abs().max()) + 1e-12
        return f, a, [float((a - o).abs().max()) / scale for o in outs]
    except CAUGHT:
        return None


def _normalising(
    trace: Trace, source: int, out: int, shaped: bool = False
) -> Callable[[Tensor], Tensor] | None:
    """The replay from ``source`` to ``out`` if it is no identity and ignores scaling its input."""
    like = trace.nodes[source].value
    g = torch.Generator().manual_seed(3)
    z = torch.randn(like.shape, generator=g, dtype=torch.float64).to(like.dtype)
    found = rescaled(trace, source, out, z, [3.0], shaped)
    if found is None or found[1].shape != z.shape or found[2][0] > 1e-3:
        return None
    return None if torch.allclose(found[1], z) else found[0]


def find_norms(trace: Trace, B: int, T: int) -> list[Norm]:
    """Every call of a norm in the trace, in order (of a module holding another, the outer one)."""
    found: list[Norm] = []
    for name, first, end, ins, outs in trace.calls:
        if name not in trace.modules or len(ins) != 1 or len(outs) != 1:
            continue
        held = [shape for p, shape in trace.parameters.items() if p.startswith(name + ".")]
        if (
            trace.nodes[ins[0]].data
            and all(math.prod(shape) == max(shape, default=1) for shape in held)  # no matrix
            and all(weight_input(trace, op) is None for op in trace.ops[first:end])  # no sub-layer
            and layout(trace.nodes[ins[0]].shape, B, T)
            and (f := _normalising(trace, ins[0], outs[0], shaped=True)) is not None
        ):
            found.append(Norm(name, first, outs[0], f, end))
    found = [  # not a norm module inside another (x-transformers' LayerNorm holds nn.LayerNorm)
        n
        for n in found
        if not any(o.first <= n.first < o.end and n.key.startswith(o.key + ".") for o in found)
    ]
    for op in trace.ops:
        inside = any(n.first <= op.index < n.end for n in found)
        if inside or not op.inputs or not trace.nodes[op.inputs[0]].data:
            continue
        source, out = op.inputs[0], op.outputs[0] if op.name in NORM_OPS else None
        if op.name == "mean" and layout(trace.nodes[source].shape, B, T):
            out = _written_norm(trace, op, source)
        if out is not None and (f := _normalising(trace, source, out)) is not None:
            names = static_names(trace, trace.between(source, out))
            key = ", ".join(names) or f"{op.name} #{op.index} (no weights)"
            found.append(Norm(key, op.index, out, f))
    return sorted(found, key=lambda n: n.first)


def _shaped(f: Callable[[Tensor], Tensor], like: Tensor) -> Callable[[Tensor], Tensor]:
    """``f`` (a replay on inputs like ``like``) on another dtype or shape of as many entries."""

    def call(h: Tensor) -> Tensor:
        shape = h.shape
        if h.shape != like.shape and h.numel() == like.numel():
            h = h.reshape(like.shape)
        out = f(h.to(like.dtype))
        return (out.reshape(shape) if out.numel() == math.prod(shape) else out).to(h.dtype)

    return call


def _written_norm(trace: Trace, mean: Op, source: int) -> int | None:
    """The last node of ``source``'s shape after ``mean``, before a matrix product, normalising it."""
    best = None
    for op in trace.ops[mean.index + 1 :]:
        if weight_input(trace, op) is not None or op.name in ("bmm", "_softmax"):
            break
        for n in op.outputs:
            node = trace.nodes[n]
            if node.shape == trace.nodes[source].shape and node.data:
                best = n if _normalising(trace, source, n) is not None else best
    return best


def order_norms(norms: list[Norm], attn_input: int, mlp_input: int) -> list[Norm]:
    """ln1 and ln2: the first two norms to run; of more, those the attention and the MLP read."""
    distinct: dict[str, Norm] = {}
    for n in norms:
        distinct.setdefault(n.key, n)
    order = list(distinct.values())
    if not order:
        raise Unread("no norm in the forward pass (nothing that divides by a root of a variance)")
    if len(order) <= 2:
        return order
    by_out = {n.out: distinct[n.key] for n in norms}
    ln1 = by_out.get(attn_input, order[0])
    ln2 = by_out.get(mlp_input)
    if ln2 is None or ln2.key == ln1.key:
        ln2 = next(n for n in order if n.key != ln1.key)
    return [ln1, ln2]
