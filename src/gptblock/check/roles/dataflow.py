"""The roles of a block's parts (q/k/v, proj, the MLP, around the attention ``cores``) from one
recorded forward pass, each followed over reshapes, slices, scalar factors and biases to a tensor
laid out by position. docs/checker.md, "The roles, from the dataflow". B batch, T time, nh heads,
hs head size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .cores import Core, cores, data
from .trace import Op, Trace

__all__ = [
    "Role", "Unread", "as_rows", "back", "find_roles", "layout", "static_names", "to_weight",
    "weight_input",
]  # fmt: skip

Tensor = torch.Tensor
SHAPE_OPS = frozenset([
    "view", "_unsafe_view", "reshape", "transpose", "t", "permute", "expand", "unsqueeze",
    "squeeze", "contiguous", "clone", "slice", "select", "split", "split_with_sizes", "unbind",
    "chunk", "alias", "detach", "_to_copy", "unflatten", "flatten", "narrow", "as_strided",
    "movedim", "_reshape_alias", "view_as", "expand_as", "lift_fresh", "repeat", "index",
])  # fmt: skip
WEIGHT_OPS = frozenset(
    ["mm", "addmm", "bmm", "baddbmm", "convolution", "_convolution", "mv", "addmv", "linear"]
)
SLICING_OPS = frozenset(
    ["select", "slice", "split", "split_with_sizes", "unbind", "chunk", "narrow", "index"]
)  # (index: by constant positions, Falcon's qkv[..., [-2], :]; by data it moves no one tensor)
GATHER_OPS = frozenset(["cat", "stack", "concat", "concatenate", "hstack", "vstack", "dstack"])


def layout(shape: tuple[int, ...], B: int, T: int, strict: bool = True) -> tuple[int, int] | None:
    """The (batch, time) axes of ``shape``; not ``strict``: any axes of sizes B and T, or B * T."""
    if B == 1 and len(shape) >= 2 and shape[0] == T:
        return (0, 0)  # one sequence, the batch axis dropped: (T, ...)
    if not strict and len(shape) == 2 and shape[0] == B * T:
        return (0, 0)  # positions flattened b-major: an addmm's (B * T, F)
    if len(shape) < 3 or (B == T and shape[:2] != (B, T)):
        return None
    if shape[:2] in ((B, T), (T, B)):
        return (0, 1) if shape[:2] == (B, T) else (1, 0)
    middle = shape[1:-1]
    if shape[0] == B and shape[-1] == T and (len(middle) == 1 or sum(n != 1 for n in middle) == 1):
        return (0, len(shape) - 1)  # channels-first, with unit axes: a 1x1 conv's (B, F, 1, T)
    if strict:
        return None
    if B in shape and T in shape and shape.index(B) != shape.index(T):
        return shape.index(B), shape.index(T)
    if B * T in shape:  # positions flattened b-major, (nh, B * T, hs): the axis twice
        return shape.index(B * T), shape.index(B * T)
    return None


def as_rows(value: Tensor, B: int, T: int, shape: tuple[int, ...] = ()) -> Tensor:
    """A node's value as rows (B * T, F), b-major; with ``shape``, such rows back to it."""
    axes = layout(shape or tuple(value.shape), B, T, strict=False)
    if axes is None:
        raise Unread(f"a tensor of shape {shape or tuple(value.shape)} is not laid out by position")
    if not shape:
        flat = value.movedim(axes[0], 0) if axes[0] == axes[1] else value.movedim(axes, (0, 1))
        return flat.reshape(B * T, -1)
    rest = [s for i, s in enumerate(shape) if i not in axes]
    if axes[0] == axes[1]:  # (..., B * T, ...)
        return value.reshape(B * T, *rest).movedim(0, axes[0]).contiguous()
    return value.reshape(B, T, *rest).movedim((0, 1), axes).contiguous()


def weight_input(trace: Trace, op: Op) -> int | None:
    """The data operand of a matrix product with a weight (a static operand of >= 2 dims, not
    one square matrix a position: a rotation's, ``x @ R[positions]``)."""
    if op.name not in WEIGHT_OPS:
        return None
    T, moved = trace.nodes[trace.input].shape[1], data(trace, op)
    static = [trace.nodes[n].value for n in op.inputs if not trace.nodes[n].data]
    weights = [  # not (T, d, d) of a matrix a position, a rotation's (one expanded is a weight)
        v
        for v in static
        if v.dim() >= 2
        and not (
            "bmm" in op.name
            and v.shape[0] == T > 1
            and v.shape[1:] == (v.shape[-1],) * 2
            and bool((v != v[:1]).any())
        )
    ]
    return moved[0] if len(moved) == 1 and weights else None


def _scalar(trace: Trace, op: Op, node: int) -> float | None:
    """The factor a mul / div by a scalar applies to ``node``, else None."""
    if op.base not in ("mul", "div") or (op.inputs[:1] != [node] and op.base == "div"):
        return None
    others = [n for n in op.inputs if n != node]
    if any(trace.nodes[n].data or trace.nodes[n].value.numel() != 1 for n in others):
        return None
    values = [float(trace.nodes[n].value) for n in others] + op.scalars()
    if len(values) != 1 or values[0] == 0:
        return None
    return values[0] if op.base == "mul" else 1.0 / values[0]


def _reshaped(trace: Trace, node: int, slices: bool = False) -> list[int]:
    """``node`` and the nodes it is a reshape (``slices``: or slice) of, nearest first."""
    chain = [node]
    while (op := trace.producer(chain[-1])) is not None and len(data(trace, op)) == 1:
        if not (op.base in SHAPE_OPS if slices else op.name in SHAPE_OPS - SLICING_OPS):
            break
        chain.append(data(trace, op)[0])
    return chain


def gathered(trace: Trace, op: Op) -> int | None:
    """The one tensor a cat / stack only rearranges (``stack(t.split(hs, -1), 1)``)."""
    pieces = data(trace, op)
    if op.base not in GATHER_OPS or len(pieces) < 2 or len(pieces) != len(op.inputs):
        return None
    chains = [_reshaped(trace, n, slices=True) for n in pieces]
    common = [n for n in chains[0] if all(n in c for c in chains[1:])]
    size = trace.nodes[op.outputs[0]].value.numel()
    return common[0] if common and trace.nodes[common[0]].value.numel() == size else None


def back(trace: Trace, node: int) -> tuple[int, float] | None:
    """One step back from ``node`` over a reshape, a scalar factor (its factor) or a bias."""
    op = trace.producer(node)
    if op is None:
        return None
    moved, pieces = gathered(trace, op), data(trace, op)
    if moved is not None or len(pieces) != 1:
        return None if moved is None else (moved, 1.0)
    # (``copy_``: into a KV cache's buffer, read back from it: ``Trace.producer``)
    factor = 1.0 if op.base in SHAPE_OPS or op.name == "copy_" else _scalar(trace, op, pieces[0])
    if factor is None and (op.base == "add" or (op.base == "sub" and op.inputs[0] == pieces[0])):
        factor = 1.0  # a bias
    return None if factor is None else (pieces[0], factor)


def to_layout(trace: Trace, node: int, B: int, T: int) -> int | None:
    """``node`` or the nearest node behind it laid out by position; a slice (q of a packed qkv)
    or a bias (per head) stops it, read there along the axes of sizes B and T."""
    while layout(trace.nodes[node].shape, B, T) is None:
        op = trace.producer(node)
        stop = op is not None and (op.name in SLICING_OPS or op.base in ("add", "sub"))
        step = None if stop else back(trace, node)
        if step is None:  # or made by a product: (nh, B * T, hs) from a 3-D weight
            return node if layout(trace.nodes[node].shape, B, T, strict=False) else None
        node = step[0]
    return _in_order(trace, node, B, T)


def _in_order(trace: Trace, node: int, B: int, T: int) -> int:
    """``node``, or the first node laid out by position it is a reshape of: its rows hold the
    channels in the product's order. Heads permuted to (B, T, hs, nh) and back (s72) are read
    there, and heads split strided, view(B, T, hs, nh), too: as made, for the split to show (s85)."""
    at, size = node, trace.nodes[node].value.numel()
    while (op := trace.producer(at)) is not None and op.base in SHAPE_OPS:
        if len(pieces := data(trace, op)) != 1 or trace.nodes[pieces[0]].value.numel() != size:
            break
        at = pieces[0]
        node = at if layout(trace.nodes[at].shape, B, T) is not None else node
    return node


def source(trace: Trace, op: Op, B: int, T: int, heads: bool = False) -> int | None:
    """The earliest laid-out node that product ``op`` reads a reshape of (``heads``: 3-D)."""
    if (node := weight_input(trace, op)) is None:
        return None
    shapes = {n: trace.nodes[n].shape for n in _reshaped(trace, node)}
    found = [n for n, s in shapes.items() if layout(s, B, T) and (len(s) == 3 or not heads)]
    if heads and not found:
        found = [n for n, s in shapes.items() if layout(s, B, T, strict=False)]
    return found[-1] if found else None


def static_names(trace: Trace, ops: list[Op]) -> list[str]:
    static = [n for op in ops for n in op.inputs if not trace.nodes[n].data]
    names = (trace.nodes[a].name for n in static for a in sorted(trace.ancestors(n)))
    return list(dict.fromkeys(n for n in names if n))


def to_weight(trace: Trace, node: int) -> tuple[Op, float] | None:
    factor = 1.0
    while (op := trace.producer(node)) is None or weight_input(trace, op) is None:
        step = back(trace, node)
        if step is None:
            return None
        node, factor = step[0], factor * step[1]
    return op, factor


def reach(trace: Trace, node: int, forward: bool) -> tuple[set[int], list[Op]]:
    """The nearest matrix products with a weight on every path, and the nodes on the way."""
    todo, seen, found = [node], {node}, {}
    into = {w.index: base for base, ops in trace.written.items() for w in ops}  # out[b] = y
    while todo:
        n = todo.pop()
        for op in trace.consumers(n) if forward else filter(None, [trace.producer(n)]):
            if weight_input(trace, op) is not None:
                found[op.index] = op
            elif not forward or op.name in SHAPE_OPS | GATHER_OPS or op.index in into:
                outs = [into[op.index]] if op.index in into else op.outputs
                new = [m for m in (outs if forward else data(trace, op)) if m not in seen]
                todo += new
                seen.update(new)
    return seen, [found[i] for i in sorted(found)]


def forward_end(trace: Trace, node: int, B: int, T: int, in_order: bool = False) -> int | None:
    """The last node laid out by position on the single-consumer chain from ``node``; with
    ``in_order``, of those whose rows hold the channels in the first one's order (not heads
    permuted to (B, T, hs, nh) on their way back)."""
    last = None
    while True:
        laid = layout(trace.nodes[node].shape, B, T) is not None
        if laid and not (in_order and last is not None and _reordered(trace, last, node, B, T)):
            last = node
        users = trace.consumers(node)
        if len(users) != 1 or len(users[0].outputs) != 1 or len(data(trace, users[0])) != 1:
            return last
        user = users[0]
        moved = user.base in SHAPE_OPS or user.base == "add" or user.name == "sum"
        if not (moved or _scalar(trace, user, node)):
            return last
        node = user.outputs[0]


def _reordered(trace: Trace, a: int, b: int, B: int, T: int) -> bool:
    """Whether ``b`` holds ``a``'s channels of a position in another order (not new values: a
    bias added)."""
    x, y = (as_rows(trace.nodes[n].value, B, T) for n in (a, b))
    same = x.shape == y.shape and torch.equal(x.sort(-1).values, y.sort(-1).values)
    return same and not torch.equal(x, y)


class Unread(Exception):
    """The forward pass does not show the roles; the message says what is missing."""


@dataclass
class Role:
    put: int  # the node it reads
    get: list[int]  # the nodes it makes (one per attention core)
    params: list[str]  # the parameters behind it
    factor: float = 1.0  # a scalar factor to take out (q and k only)
    turned: bool = False  # more than reshapes and scalar factors before the core (a rotation)


def find_roles(trace: Trace, B: int, T: int) -> tuple[dict[str, Role], int]:
    """The roles (q k v proj fc1 (fc3) fc2) and the head count; Unread where one is missing."""
    attention = cores(trace)
    if not attention:
        raise Unread("no attention: no product of softmax weights with v in the forward pass")
    roles: dict[str, Role] = {}
    heads = 0
    for core in attention:
        batch = B if core.time == T else T
        if core.groups % batch:
            raise Unread(f"the attention's batch {core.groups} is not a multiple of {batch}")
        heads += core.groups // batch
        for name, node in (("q", core.q), ("k", core.k), ("v", core.v)):
            put, get, factor, params, turned = _projection(trace, node, B, T, core)
            role = roles.setdefault(name, Role(put, [], [], factor if name != "v" else 1.0, turned))
            if not torch.equal(trace.nodes[role.put].value, trace.nodes[put].value):
                raise Unread(  # (``x[..., i * hs:(i + 1) * hs]`` a head: a block-diagonal weight)
                    f"the heads' {name} read different inputs (each its own slice of the "
                    "channels?), where the lessons' heads each read all C of them"
                )
            if name != "v" and abs(role.factor - factor) > 1e-12 * abs(factor):
                raise Unread(f"the heads' {name} are computed differently")
            role.get.append(get)
            role.params += [p for p in params if p not in role.params]
    first = trace.nodes[roles["q"].put].value
    if any(not torch.equal(trace.nodes[r.put].value, first) for r in roles.values()):
        raise Unread("q, k and v are computed from different tensors")
    used = {f[0].index for r in roles.values() for n in r.get if (f := to_weight(trace, n))}
    moved = [reach(trace, core.y, forward=True) for core in attention]  # (nodes, weight products)
    ops = {found[0].index: found[0] for _, found in moved if found}
    common = set.intersection(*(seen for seen, _ in moved))  # every core's output, merged
    flat = [n for n in common if len(s := trace.nodes[n].shape) == 3 and layout(s, B, T)]
    if not all(found for _, found in moved) and flat:  # no projection: the heads join the stream
        roles["proj"] = Role(min(flat), [min(flat)], [])
    elif not all(found for _, found in moved) or len(ops) != 1:
        raise Unread("no single output projection reads the attention's output")
    else:
        ((index, proj),) = ops.items()
        roles["proj"] = _role(trace, proj, proj.outputs[0], B, T, heads=True)
        used.add(index)
    acts = trace.ancestors(trace.output)  # not an auxiliary head's (a halting probability)
    rest = {  # the MLP's outputs -> their products; its first layer packed with q, k, v (PaLM's)
        op.outputs[0]: op for op in trace.ops
        if weight_input(trace, op) is not None and op.index not in used and op.outputs[0] in acts
    }  # fmt: skip
    behind = set().union(*(trace.ancestors(n) for c in attention for n in (c.q, c.k, c.v)))
    merged, later = trace.ancestors(roles["proj"].get[0]), set().union(*map(trace.ancestors, rest))
    rest |= {  # a slice of their product that the attention does not read and the MLP does
        n: made[0] for op in trace.ops if op.name in SLICING_OPS and op.inputs[0] in behind
        for n in op.outputs if n not in merged and n in later
        and (made := to_weight(trace, n)) and made[0].index in used
    }  # fmt: skip
    outs = sorted(rest, key=lambda n: rest[n].index)  # (the slice: where its product runs)
    if len(rest) not in (2, 3) or outs[0] not in trace.ancestors(outs[-1]):
        routed = any(op.name == "topk" for op in trace.ops)  # experts chosen per token
        raise Unread(
            f"{len(rest)} matrix products with weights outside attention, expected the MLP's two"
            + " (a top-k routing: a mixture of experts, which no reference models)" * routed
        )
    for name, n in zip([*["fc1", "fc3"][: len(outs) - 1], "fc2"], outs, strict=True):
        roles[name] = _role(trace, rest[n], n, B, T)
    return roles, heads


def _projection(
    trace: Trace, node: int, B: int, T: int, core: Core
) -> tuple[int, int, float, list[str], bool]:
    """Turned (a rotation, a qk norm between) or repeated: its one nearest product, read before
    key/value heads are repeated, at its own slice of a packed product."""
    out = to_layout(trace, node, B, T)
    found = to_weight(trace, out) if out is not None else None
    turned, size = found is None, trace.nodes[node].value.numel()
    grows, at = False, out  # heads repeated: larger than the product, or grown on the way to it
    while not grows and at is not None and (step := back(trace, at)) is not None:
        grows, at = trace.nodes[step[0]].value.numel() < trace.nodes[at].value.numel(), step[0]
    if found is None or grows or size > trace.nodes[found[0].outputs[0]].value.numel():
        near = reach(trace, node, forward=False)[1]
        if len(near) != 1:
            raise Unread("q, k or v is not a matrix product of the attention's input with a weight")
        found, out = (near[0], 1.0), _unrepeated(trace, near[0], node, core, B, T)
    op, factor = found
    if (put := source(trace, op, B, T)) is None or out is None:
        raise Unread("the attention's input is not laid out by position")
    return put, out, factor, static_names(trace, [op]), turned


def _unrepeated(trace: Trace, op: Op, node: int, core: Core, B: int, T: int) -> int:
    """``op``'s output as ``forward_end`` reads it, but before a repeat of key/value heads (a
    change of size), and of a packed product the nodes behind ``node`` alone."""
    at = op.outputs[0]
    end, size = forward_end(trace, at, B, T, in_order=True), trace.nodes[at].shape
    while at != end:
        users = [u for u in trace.consumers(at) if u.outputs]
        if len(users) != 1 or math.prod(trace.nodes[users[0].outputs[0]].shape) != math.prod(size):
            at = to_layout(trace, at, B, T) or op.outputs[0]
            break
        at = users[0].outputs[0]
    behind, mine = [trace.ancestors(n) for n in (core.q, core.k, core.v)], trace.ancestors(node)
    own = [n for n in reach(trace, at, True)[0] if n in mine and sum(n in b for b in behind) == 1]
    if not own:
        raise Unread("q, k, v are packed in one matrix in a way the checker cannot read")
    return min(own)


def _role(trace: Trace, op: Op, out: int, B: int, T: int, heads: bool = False) -> Role:
    put, get = source(trace, op, B, T, heads), forward_end(trace, out, B, T)  # out: op's, a slice
    if put is None or get is None:
        raise Unread(
            f"a matrix product ({op.name}) whose input or output is not laid out by position"
        )
    return Role(put, [get], static_names(trace, [op]))
