"""The norms of a block, found from what they compute in a recorded forward pass: a module call,
an ``F.layer_norm`` or tensor code from a mean over the channels whose output does not change
when its input is scaled (``_normalising``), whatever it is called. Of a norm module that holds
another (x-transformers' ``LayerNorm``), the outer one is the norm.

Shapes: B batch, T time, C channels.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..mistakes.report import CAUGHT
from .dataflow import Unread
from .trace import Op, Trace, replay
from .walks import layout, static_names, weight_input

__all__ = ["NORM_OPS", "Norm", "find_norms", "order_norms"]

Tensor = torch.Tensor
NORM_OPS = frozenset(["native_layer_norm", "layer_norm", "rms_norm", "_fused_rms_norm"])


@dataclass
class Norm:
    """One call of a norm: what it is (``key``), its input and output nodes, and as a function."""

    key: str
    first: int
    source: int
    out: int
    function: Callable[[Tensor], Tensor]
    end: int = 0  # a norm module's call: the operators first:end ran inside it


def _normalising(
    trace: Trace, source: int, out: int, shaped: bool = False
) -> Callable[[Tensor], Tensor] | None:
    """The replay from ``source`` to ``out`` (``shaped``: for inputs of other shapes and dtypes)
    if it normalises: its output does not move when its input is scaled by 3, and is not it."""
    like = trace.nodes[source].value
    g = torch.Generator().manual_seed(3)
    z = torch.randn(like.shape, generator=g, dtype=torch.float64).to(like.dtype)
    try:
        f = replay(trace, source, out)
        f = _shaped(f, like) if shaped else f
        with torch.no_grad():
            a, b = f(z), f(3.0 * z)
    except CAUGHT:  # not a norm, then
        return None
    if not isinstance(a, Tensor) or a.shape != z.shape or not torch.isfinite(a).all():
        return None
    scale = float(a.abs().max()) + 1e-12
    same = float((a - b).abs().max()) <= 1e-3 * scale and not torch.allclose(a, z)
    return f if same else None


def find_norms(trace: Trace, B: int, T: int) -> list[Norm]:
    """Every call of a norm in the trace, in the order they ran (a norm module's call replayed
    from the trace, never the block's code)."""
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
            found.append(Norm(name, first, ins[0], outs[0], f, end))
    # a norm module that holds another (x-transformers' LayerNorm: nn.LayerNorm and a gain)
    found = [n for n in found if not any(_inside(n, o) for o in found)]
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
            found.append(Norm(key, op.index, source, out, f))
    return sorted(found, key=lambda n: n.first)


def _shaped(f: Callable[[Tensor], Tensor], like: Tensor) -> Callable[[Tensor], Tensor]:
    """``f`` (a replay, for inputs like ``like``) on an input of another dtype, or of the same
    positions in another shape ((B, T, C) for a norm traced on (B * T, C))."""

    def call(h: Tensor) -> Tensor:
        shape = h.shape
        if h.shape != like.shape and h.numel() == like.numel():
            h = h.reshape(like.shape)
        out = f(h.to(like.dtype))
        return (out.reshape(shape) if out.numel() == math.prod(shape) else out).to(h.dtype)

    return call


def _inside(inner: Norm, outer: Norm) -> bool:
    return outer.first <= inner.first < outer.end and inner.key.startswith(outer.key + ".")


def _written_norm(trace: Trace, mean: Op, source: int) -> int | None:
    """The last node of ``source``'s shape that tensor code computes from it after ``mean``,
    before the next matrix product, that normalises it."""
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
    """ln1 and ln2 (their first calls): the first two norms to run (a post-norm block's MLP
    reads ln1's output); of more than two, those the attention and the MLP read."""
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
