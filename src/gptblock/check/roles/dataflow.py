"""The roles of a block's parts, found from what its tensors do in one recorded forward pass.

``find_roles(trace, B, T)`` reads a ``trace.Trace`` as docs/checker.md ("The roles, from the
dataflow") describes: the attention cores (a product of probabilities with v), q, k and v
followed back to the weight products that made them, the output projection as the first weight
product the cores' outputs reach, and the two other weight products as the MLP's. ``Roles``
names, per role, the node it reads (``put``) and the nodes it makes (``get``); ``weights`` reads
each weight by replacing the first with basis vectors. The norms are ``norms``'.

Shapes: B batch, T time, C channels, D attention width, H the MLP's hidden width, G = B * nh.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .trace import Op, Trace
from .walks import (
    GATHER_OPS,
    SHAPE_OPS,
    forward_end,
    layout,
    merged_input,
    source,
    static_names,
    to_layout,
    to_weight,
    weight_input,
)

__all__ = ["Core", "Role", "Roles", "Unread", "find_roles"]

Tensor = torch.Tensor


class Unread(Exception):
    """The forward pass does not show the roles; the message says what is missing."""


@dataclass(frozen=True)
class Core:
    """One attention core: the nodes of q, k, v (as the product reads them) and its output."""

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


def _probabilities(value: Tensor) -> bool:
    finite = value[torch.isfinite(value)]
    return finite.numel() > 0 and bool((finite >= 0).all()) and bool((finite <= 1 + 1e-6).all())


def _cores(trace: Trace) -> list[Core]:
    cores = []
    for op in trace.ops:
        data = [n for n in op.inputs if trace.nodes[n].data]
        if "scaled_dot_product" in op.name and len(data) >= 3:
            q, k, v = op.inputs[:3]
            time = trace.nodes[q].shape[-2]
        elif op.name in ("bmm", "mm") and len(data) == 2 and (found := _weighted(trace, data)):
            A, v, flipped, scores = found
            q, k = [n for n in scores.inputs if trace.nodes[n].data]
            if _keys_first(trace, scores, A, flipped):
                q, k = k, q
            time = trace.nodes[A].shape[-1]
        else:
            continue
        shape = trace.nodes[q].shape
        cores.append(Core(q, k, v, op.outputs[0], math.prod(shape[:-2]), time))
    return cores


def _weighted(trace: Trace, data: list[int]) -> tuple[int, int, bool, Op] | None:
    """(A, v, whether A is on the right, the scores' product) of a product of probabilities A
    with v: ``A @ v``, or the same written transposed, ``v^T @ A^T`` (channels first)."""
    for A, v, flipped in ((data[0], data[1], False), (data[1], data[0], True)):
        shape = trace.nodes[A].shape
        if shape[-1] != shape[-2] or not _probabilities(trace.nodes[A].value):
            continue
        scores = _scores(trace, A)
        if scores is not None:
            return A, v, flipped, scores
    return None


def _keys_first(trace: Trace, scores: Op, A: int, flipped: bool) -> bool:
    """Whether the scores' product has k on its left: ``(k @ q^T)^T``, a product written
    transposed. The probabilities rise and fall with the scores along the axis the softmax
    normalised; that holds for the scores as the product made them or for their transpose, and
    the one it holds for tells which operand stands for the queries."""
    S, P = trace.nodes[scores.outputs[0]].value, trace.nodes[A].value
    if S.numel() != P.numel() or S.shape[-1] != S.shape[-2] or S.shape[-1] < 2:
        return False
    n = S.shape[-1]
    S, P = S.reshape(-1, n, n).double(), P.reshape(-1, n, n).double()
    if flipped:  # A^T: put the queries back on the rows
        P = P.mT
    m = min(n, 32)  # a few heads' first positions tell it: (G, n, n, n) pairs stay small
    S, P = S[:4, :m, :m], P[:4, :m, :m]
    return _agreement(S.mT, P) > _agreement(S, P)


def _agreement(S: Tensor, P: Tensor) -> float:
    """The share of pairs of positive probabilities in one row (or one column) that are ordered
    as the scores in the same places are, along whichever axis agrees best."""
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
        and sum(trace.nodes[i].data for i in op.inputs) == 2
    ]
    return max(found, key=lambda op: op.index) if found else None


def _moved_to(trace: Trace, node: int) -> tuple[set[int], Op | None]:
    """The nodes reshapes and cat make of ``node``, and the first matrix product with a weight
    that reads one of them."""
    todo, seen = [node], {node}
    found: list[Op] = []
    while todo:
        for op in trace.consumers(todo.pop()):
            if weight_input(trace, op) is not None:
                found.append(op)
            elif op.name in SHAPE_OPS or op.name in GATHER_OPS:
                todo += [n for n in op.outputs if n not in seen]
                seen.update(op.outputs)
    return seen, min(found, key=lambda op: op.index) if found else None


def find_roles(trace: Trace, B: int, T: int) -> Roles:
    """The roles in a recorded forward pass of a block on a (B, T, C) input.

    Raises:
        Unread: a role is missing or does not fit the lessons' block; the message says which.
    """
    cores = _cores(trace)
    if not cores:
        raise Unread("no attention: no product of softmax weights with v in the forward pass")
    qkv: dict[str, Role] = {}
    heads = 0
    for core in cores:
        batch = B if core.time == T else T
        if core.groups % batch:
            raise Unread(f"the attention's batch {core.groups} is not a multiple of {batch}")
        heads += core.groups // batch
        for role, node in (("q", core.q), ("k", core.k), ("v", core.v)):
            _add(qkv, role, *_projection(trace, node, B, T), scaled=role != "v")
    first = trace.nodes[qkv["q"].put].value
    if any(not torch.equal(trace.nodes[r.put].value, first) for r in qkv.values()):
        raise Unread("q, k and v are computed from different tensors")
    roles = dict(qkv)
    made = [to_weight(trace, n) for r in qkv.values() for n in r.get]
    used = {found[0].index for found in made if found is not None}
    moved = [_moved_to(trace, core.y) for core in cores]
    found = [op for _, op in moved]
    ops = [op for op in found if op is not None]
    common = set.intersection(*(seen for seen, _ in moved))  # every core's output, merged
    flat = [
        n for n in common if len(trace.nodes[n].shape) == 3 and layout(trace.nodes[n].shape, B, T)
    ]
    heads_out = min(flat) if flat else None
    if len(ops) < len(found) and heads_out is not None:
        roles["proj"] = Role(heads_out, [heads_out], [])  # no projection: the heads join the stream
    elif len(ops) < len(found) or len({op.index for op in ops}) != 1:
        raise Unread("no single output projection reads the attention's output")
    else:
        roles["proj"] = _role(trace, ops[0], B, T, heads=True)
        used.add(ops[0].index)
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
    data = weight_input(trace, op)
    put = source(trace, data, B, T) if data is not None else None
    if put is None:
        raise Unread("the attention's input is not laid out by position")
    return put, out, factor, static_names(trace, [op])


def _add(
    roles: dict[str, Role], name: str, put: int, get: int, factor: float, params: list[str],
    scaled: bool,
) -> None:  # fmt: skip
    factor = factor if scaled else 1.0
    role = roles.setdefault(name, Role(put, [], [], factor))
    if abs(role.factor - factor) > 1e-12 * abs(factor):
        raise Unread(f"the heads' {name} are computed differently")
    role.get.append(get)
    role.params += [p for p in params if p not in role.params]


def _role(trace: Trace, op: Op, B: int, T: int, heads: bool = False) -> Role:
    data = weight_input(trace, op)
    find = merged_input if heads else source
    put = find(trace, data, B, T) if data is not None else None
    get = forward_end(trace, op, B, T)
    if put is None or get is None:
        raise Unread(
            f"a matrix product ({op.name}) whose input or output is not laid out by position"
        )
    return Role(put, [get], static_names(trace, [op]))
