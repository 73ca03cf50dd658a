"""Following a node of a recorded forward pass to where a role reads or writes it.

Code reshapes, transposes, slices, scales and adds biases around a sub-layer's matrix product;
these walks step over exactly those operators to the tensor laid out by position (``layout``)
that the lessons' block has in that place: q, k, v before the heads are split, the heads as the
block merged them, an MLP layer's input and output.

Shapes: B batch, T time, C channels, D attention width, nh heads, hs head size.
"""

from __future__ import annotations

import torch

from .trace import Op, Trace

__all__ = [
    "GATHER_OPS", "SHAPE_OPS", "SLICING_OPS", "WEIGHT_OPS", "forward_end", "gathered", "layout",
    "merged_input", "source", "static_names", "to_layout", "to_weight", "weight_input",
]  # fmt: skip

Tensor = torch.Tensor

SHAPE_OPS = frozenset([
    "view", "_unsafe_view", "reshape", "transpose", "t", "permute", "expand", "unsqueeze",
    "squeeze", "contiguous", "clone", "slice", "select", "split", "split_with_sizes", "unbind",
    "chunk", "alias", "detach", "_to_copy", "unflatten", "flatten", "narrow", "as_strided",
    "movedim", "_reshape_alias", "view_as", "expand_as", "lift_fresh", "repeat",
])  # fmt: skip
WEIGHT_OPS = frozenset(
    ["mm", "addmm", "bmm", "baddbmm", "convolution", "_convolution", "mv", "addmv", "linear"]
)
SLICING_OPS = frozenset(
    ["select", "slice", "split", "split_with_sizes", "unbind", "chunk", "narrow"]
)
GATHER_OPS = frozenset(["cat", "stack", "concat", "concatenate", "hstack", "vstack", "dstack"])


def layout(shape: tuple[int, ...], B: int, T: int, strict: bool = True) -> tuple[int, int] | None:
    """The axes (batch, time) along which a node of ``shape`` holds one row per position:
    strictly, (B, T, ...), (T, B, ...) or channels-first (B, F, T) (unit axes allowed between,
    (B, F, 1, T)); else any axes of sizes B and T,
    or one axis of size B * T holding them flattened b-major (given twice).

    Example:
        >>> layout((5, 7, 4, 8), 5, 7), layout((7, 5, 32), 5, 7), layout((5, 32, 7), 5, 7)
        ((0, 1), (1, 0), (0, 2))
        >>> layout((5, 4, 7, 8), 5, 7), layout((5, 4, 7, 8), 5, 7, strict=False)
        (None, (0, 2))
        >>> layout((5, 32, 1, 7), 5, 7)
        (0, 3)
    """
    if B == 1 and len(shape) >= 2 and shape[0] == T:
        return (0, 0)  # one sequence, the batch axis dropped: (T, ...)
    if len(shape) < 3 or (B == T and shape[:2] != (B, T)):
        return None
    if shape[:2] == (B, T):
        return (0, 1)
    if shape[:2] == (T, B):
        return (1, 0)
    if len(shape) == 3 and shape[0] == B and shape[2] == T:
        return (0, 2)
    if shape[0] == B and shape[-1] == T and sum(n != 1 for n in shape[1:-1]) == 1:
        return (0, len(shape) - 1)  # channels-first with unit axes: a 1x1 conv's (B, F, 1, T)
    if strict:
        return None
    if B in shape and T in shape and shape.index(B) != shape.index(T):
        return shape.index(B), shape.index(T)
    if B * T in shape:  # positions flattened b-major, (nh, B * T, hs): the axis twice
        return shape.index(B * T), shape.index(B * T)
    return None


def weight_input(trace: Trace, op: Op) -> int | None:
    """The data operand of a matrix product with a weight (a static operand of >= 2 dims)."""
    if op.name not in WEIGHT_OPS:
        return None
    data = [n for n in op.inputs if trace.nodes[n].data]
    static = [n for n in op.inputs if not trace.nodes[n].data and trace.nodes[n].value.dim() >= 2]
    return data[0] if len(data) == 1 and static else None


def _scalar(trace: Trace, op: Op, node: int) -> float | None:
    """The factor a mul / div by a scalar applies to ``node``, or None if it is no such op."""
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
    """``node`` and the nodes it is a reshape (or with ``slices``, a slice) of, nearest first."""
    chain = [node]
    while (op := trace.producer(chain[-1])) is not None:
        data = [n for n in op.inputs if trace.nodes[n].data]
        moved = op.base in SHAPE_OPS if slices else op.name in SHAPE_OPS - SLICING_OPS
        if not moved or len(data) != 1:
            break
        chain.append(data[0])
    return chain


def gathered(trace: Trace, op: Op) -> int | None:
    """The one tensor whose elements a cat / stack only rearranges: every piece is a reshape or
    slice of it and together they hold as many elements (heads split by ``stack(t.split(hs,
    -1), 1)`` or merged by ``cat(y.unbind(1), -1)``: data movement, as a view would be)."""
    data = [n for n in op.inputs if trace.nodes[n].data]
    if op.base not in GATHER_OPS or not data or len(data) != len(op.inputs):
        return None
    chains = [_reshaped(trace, n, slices=True) for n in data]
    common = [n for n in chains[0] if all(n in c for c in chains[1:])]
    if not common or len(data) < 2:
        return None
    size = trace.nodes[op.outputs[0]].value.numel()
    return common[0] if trace.nodes[common[0]].value.numel() == size else None


def _back(trace: Trace, node: int) -> tuple[int, float] | None:
    """One step back from ``node`` over a reshape, a slice, a rearranging cat / stack, a scalar
    factor or a bias."""
    op = trace.producer(node)
    if op is None:
        return None
    moved = gathered(trace, op)
    if moved is not None:
        return moved, 1.0
    data = [n for n in op.inputs if trace.nodes[n].data]
    if len(data) != 1:
        return None
    if op.base in SHAPE_OPS:
        return data[0], 1.0
    factor = _scalar(trace, op, data[0])
    if factor is not None:
        return data[0], factor
    if op.base == "add" or (op.base == "sub" and op.inputs[0] == data[0]):
        return data[0], 1.0  # a bias
    return None


def to_layout(trace: Trace, node: int, B: int, T: int) -> int | None:
    """``node``, or the nearest node behind it, that holds one row per position (B, T, ...).

    The walk stops where a slice took the node out of a larger one (q out of a packed qkv), or a
    bias was added (per head, after the split): then the node itself is read along whichever
    axes have sizes B and T ((B, nh, T, hs) heads)."""
    while layout(trace.nodes[node].shape, B, T) is None:
        op = trace.producer(node)
        stop = op is not None and (op.name in SLICING_OPS or op.base in ("add", "sub"))
        step = None if stop else _back(trace, node)
        if step is None:  # or made by a product: (nh, B * T, hs) from a 3-D weight
            return node if layout(trace.nodes[node].shape, B, T, strict=False) else None
        node = step[0]
    return node


def source(trace: Trace, node: int, B: int, T: int) -> int | None:
    """The earliest node laid out by position that ``node`` is a reshape of: the tensor a
    sub-layer reads, however many views of it the code (an einsum) made."""
    laid = [n for n in _reshaped(trace, node) if layout(trace.nodes[n].shape, B, T)]
    return laid[-1] if laid else None


def merged_input(trace: Trace, node: int, B: int, T: int) -> int | None:
    """What the output projection reads: the heads as the block itself merged them, the deepest
    (B, T, D) tensor behind ``node`` through reshapes; if the block never holds one (an einsum
    contracting heads and head size with a 3-D W_O), the heads (B, nh, T, hs) themselves."""
    chain = _reshaped(trace, node)
    shapes = [trace.nodes[n].shape for n in chain]
    flat = [n for n, s in zip(chain, shapes, strict=True) if len(s) == 3 and layout(s, B, T)]
    heads = [n for n, s in zip(chain, shapes, strict=True) if layout(s, B, T, strict=False)]
    found = flat or heads
    return found[-1] if found else None


def static_names(trace: Trace, ops: list[Op]) -> list[str]:
    """The parameters (and buffers) the static operands of ``ops`` were made from."""
    names: list[str] = []
    for op in ops:
        for n in op.inputs:
            if not trace.nodes[n].data:
                names += [trace.nodes[a].name for a in sorted(trace.ancestors(n))]
    return list(dict.fromkeys(n for n in names if n))


def to_weight(trace: Trace, node: int) -> tuple[Op, float] | None:
    """The matrix product with a weight behind ``node``, and the scalar factors on the way."""
    factor = 1.0
    while True:
        op = trace.producer(node)
        if op is not None and weight_input(trace, op) is not None:
            return op, factor
        step = _back(trace, node)
        if step is None:
            return None
        node, factor = step[0], factor * step[1]


def forward_end(trace: Trace, op: Op, B: int, T: int) -> int | None:
    """The last node laid out by position on the single-consumer chain of reshapes, biases,
    scalar factors and sums that follows ``op``'s output."""
    node, last = op.outputs[0], None
    while True:
        if layout(trace.nodes[node].shape, B, T) is not None:
            last = node
        users = trace.consumers(node)
        if len(users) != 1 or len(users[0].outputs) != 1:
            return last
        user = users[0]
        data = [n for n in user.inputs if trace.nodes[n].data]
        if len(data) != 1:
            return last
        linear = user.base in SHAPE_OPS or user.name == "sum" or _scalar(trace, user, node)
        if not (linear or user.base == "add"):
            return last
        node = user.outputs[0]
