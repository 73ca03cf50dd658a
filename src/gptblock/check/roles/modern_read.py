"""A modern block's parts read from one recorded forward pass: what is there, and every weight.

The attention core is found as ``roles.dataflow`` finds it; q, k and v are each followed back to
the *nearest* matrix product with a weight behind them and read at its output (before any
rotation or repeat of key/value heads, ``weights.measure``). What makes a block modern (RMSNorm,
rotary positions, grouped heads, a gated MLP) and how each shows in the dataflow: the table in
docs/checker.md, "The modern block". ``read_modern`` returns ``None`` for a block with none of
them (the lessons' block: ``roles.readings`` reads it).

Shapes: B batch, T time, C channels, D attention width, Dkv key/value width, H MLP width.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..mistakes.report import CAUGHT
from .dataflow import Core, Role, Roles, Unread, _cores, _moved_to, _role, find_norms, order_norms
from .modern_rotary import Turn, heads, measure_turn
from .trace import Op, Trace, replay
from .walks import static_names, to_layout, to_weight, weight_input
from .weights import _rows, measure

__all__ = [
    "ModernRead", "Source", "qk_gains", "read_modern",
]  # fmt: skip

Tensor = torch.Tensor
Linear = tuple[Tensor, Tensor]  # weight (out, in), bias (out,)


@dataclass
class ModernRead:
    """What ``read_modern`` read: the parts' weights, the traced values each sub-layer met, and
    the norms as the block computes them."""

    x: Tensor  # (B, T, C): the traced input
    y: Tensor  # (B, T, C): the block's output for it
    n_head: int
    q: Linear
    k: Linear
    v: Linear
    proj: Linear
    mlp: list[Linear]  # fc1 (and the second first-layer matrix, if gated), then the last layer
    mlp_names: list[str]  # the parameters each of ``mlp`` was read from
    h1: Tensor  # (B, T, C): the attention's input, as traced
    h2: Tensor  # (B, T, C): the MLP's input
    ctx: Tensor  # (B, T, D): the heads as the block merged them (the output projection's input)
    hidden: Tensor  # (B, T, H): the MLP's last layer's input
    norm1: Callable[[Tensor], Tensor]  # the stream -> h1, as the block computes it
    norm2: Callable[[Tensor], Tensor]  # the stream the MLP reads -> h2
    parallel: bool  # the MLP reads the block's input, not the stream after attention
    rotated: bool  # q or k reach the core through more than reshapes and scalar factors
    names: dict[str, str]  # role -> parameters, for the report
    norm_params: tuple[tuple[str, ...], tuple[str, ...]]  # what each norm reads
    core_q: Tensor  # (B, nh, T, hs) where so laid out: q as the score product reads it
    core_k: Tensor  # k likewise (its key/value heads repeated), (B, nh, T, hs) where so
    norms: list[Callable[[Tensor], Tensor]]  # the block's norms where they run, ln1 and ln2
    turn: Turn | None  # the rotation measured on q (``modern_rotary``), None: not measured
    trace: Trace  # the forward pass, for what the comparison cannot explain (``modern_scope``)
    core: Core
    ends: tuple[int, int, int]  # the nodes q's projection, the output projection and the MLP's
    # last layer make


def _one(trace: Trace, node: int, what: str) -> Op:
    """The one matrix product with a weight nearest behind ``node`` on every path back."""
    found: dict[int, Op] = {}
    todo, seen = [node], {node}
    while todo:
        op = trace.producer(todo.pop())
        if op is None:
            continue
        if weight_input(trace, op) is not None:
            found[op.index] = op
            continue
        for n in op.inputs:
            if trace.nodes[n].data and n not in seen:
                seen.add(n)
                todo.append(n)
    if len(found) != 1:
        raise Unread(f"{what} is made by {len(found)} matrix products with weights, expected one")
    return next(iter(found.values()))


def _role_of(trace: Trace, op: Op, B: int, T: int) -> Role:
    """``dataflow._role``, its output read before anything grows it: a key/value head repeated
    for its query heads (``expand``, ``repeat``) is read once, as the projection made it."""
    role = _role(trace, op, B, T)
    size = trace.nodes[op.outputs[0]].value.numel()
    node, last = op.outputs[0], role.get[0]
    while node != last:
        users = [u for u in trace.consumers(node) if u.outputs]
        if len(users) != 1 or trace.nodes[users[0].outputs[0]].value.numel() != size:
            break
        node = users[0].outputs[0]
    if node != last:
        found = to_layout(trace, node, B, T)
        role.get = [found if found is not None else op.outputs[0]]
    return role


def _residual(trace: Trace, after: int, mlp_in: int) -> int:
    """The stream the MLP's norm reads: the latest sum of two data tensors shaped as the input
    that the attention's output ``after`` reaches and the MLP's input comes from (or ``after``
    itself, where attention overwrote the stream); the block's input when the MLP's input does
    not come from the attention's output at all (a parallel block)."""
    behind = trace.ancestors(mlp_in)
    if after not in behind:
        return trace.input
    shape = trace.nodes[trace.input].shape
    best = after
    for n in sorted(behind):
        op = trace.producer(n)
        if (
            op is not None and op.base == "add" and trace.nodes[n].shape == shape
            and sum(trace.nodes[i].data for i in op.inputs) == 2 and after in trace.ancestors(n)
        ):  # fmt: skip
            best = n
    return best


def _path_params(trace: Trace, source: int, target: int) -> tuple[str, ...]:
    """The parameters the operators between ``source`` and ``target`` read."""
    start = trace.nodes[source].op
    ops = {trace.nodes[n].op for n in trace.ancestors(target) if trace.nodes[n].op > start}
    return tuple(static_names(trace, [trace.ops[i] for i in sorted(ops)]))


def _norms(trace: Trace, B: int, T: int, h1: int, h2: int) -> list[Callable[[Tensor], Tensor]]:
    """ln1 and ln2 as ``gptblock.check.roles.norms`` finds them (for a post-norm block, whose norms
    do not make the sub-layers' inputs); none where it finds none."""
    try:
        return [n.function for n in order_norms(find_norms(trace, B, T), h1, h2)]
    except Unread:
        return []


def _packed(out: Tensor, cores: list[Tensor], heads: int) -> list[list[int]]:
    """The rows of a packed q/k/v projection that make q, k and v, head by head: the row whose
    output at position 0 (where no rotation turns anything) is proportional, over the batch, to
    each channel of each head the score product reads. ``[q | k | v]`` (gpt-fast's ``wqkv``),
    per head ``[q_h k_h v_h]`` (GPT-NeoX) and per group (lit-gpt) all read so; key/value heads
    are kept once each, in the order the query heads first use them.

    Shape:
        out (B, O): the packed output at position 0; cores: (B * nh, T, hs) or (B, nh, T, hs).

    Raises:
        Unread: a channel matches no row (a qk norm rescales each position: then q's and k's
            rows cannot be told by proportion, and ``read_modern`` takes ``[q | k | v]`` if v's
            rows are where that puts them).
    """
    unit = out / out.norm(dim=0, keepdim=True).clamp_min(1e-30)  # (B, O)
    found: list[list[int]] = []
    for core in cores:
        hs = core.shape[-1]
        seen = core.reshape(out.shape[0], heads, -1, hs)[:, :, 0]  # (B, nh, hs) at position 0
        per_head: list[list[int]] = []
        for head in range(heads):
            v = seen[:, head]  # (B, hs)
            cos = (v / v.norm(dim=0, keepdim=True).clamp_min(1e-30)).T @ unit  # (hs, O)
            best = cos.abs().max(dim=1)
            if not bool((best.values > 1 - 1e-6).all()):
                raise Unread("q, k, v are packed in one matrix in a way the checker cannot read")
            rows = best.indices.tolist()
            if rows not in per_head:
                per_head.append(rows)
        found.append([r for rows in per_head for r in rows])
    return found


def _heads(trace: Trace, node: int, B: int, nh: int, T: int, hs: int, key: bool) -> Tensor:
    """The score product's operand at ``node`` as (B, nh, T, hs) (``modern_rotary.heads``), or
    as traced where it is not laid out so (fewer key/value heads, as SDPA's ``enable_gqa``)."""
    value = trace.nodes[node].value
    found = heads(value, B, nh, T, hs, key)
    return value if found is None else found


def _shifts(f: Callable[[Tensor], Tensor], like: Tensor) -> bool:
    """Whether a norm moves when a constant is added to every channel, and is no identity: an
    RMSNorm (a LayerNorm subtracts the mean first); a norm that fails on the probe is not one."""
    z = torch.randn(like.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    z = z.to(like.dtype)
    try:
        with torch.no_grad():
            a, b = f(z), f(z + 3.0)
    except CAUGHT:
        return False
    scale = float(a.abs().nan_to_num(0.0).max()) + 1e-12
    return not torch.allclose(a, z) and float((a - b).abs().nan_to_num(1.0).max()) > 1e-6 * scale


@dataclass(frozen=True)
class Source:
    """What the modern comparison asks of the block: a recorded forward pass (``trace_of``),
    an output (``call``), its cache driven (``cache``, ``loop.drive_cache``'s answer). In this
    process, of a module; in ``gptblock check``, requests to the block's process, whose
    answers are data: every reading is made here, by replaying the traces."""

    trace_of: Callable[[Tensor], Trace]
    call: Callable[[Tensor], object]
    cache: Callable[[Tensor], tuple[dict[str, Any], dict[str, Tensor]]]


def read_modern(trace: Trace) -> ModernRead | None:
    """A recorded forward pass (wherever it was recorded) read as a modern block, every weight
    by replaying it; ``None`` when it is the lessons' block (no RMSNorm, rotary positions,
    grouped heads or gated MLP).

    Raises:
        Unread: it is a modern block, but its parts cannot be read; the message says why.
        TraceError: the trace cannot be replayed.
    """
    x = trace.nodes[trace.input].value
    B, T, C = x.shape
    cores = _cores(trace)
    if len(cores) != 1:
        return None  # one core per head (or none): the lessons' reading
    core = cores[0]
    q_op, k_op, v_op = (_one(trace, n, r) for n, r in ((core.q, "q"), (core.k, "k"), (core.v, "v")))
    proj_op = _moved_to(trace, core.y)[1]
    if proj_op is None:
        raise Unread("no output projection reads the attention's output")
    attn_ops = {q_op.index, k_op.index, v_op.index, proj_op.index}
    rest = [
        op for op in trace.ops if weight_input(trace, op) is not None and op.index not in attn_ops
    ]
    if len(rest) not in (2, 3):
        raise Unread(f"{len(rest)} matrix products with weights outside attention, expected 2 or 3")
    last = rest[-1]
    first = rest[:-1]
    roles = {f"fc{i + 1}": _role(trace, op, B, T) for i, op in enumerate(first)}
    roles["down"] = _role(trace, last, B, T)
    roles["proj"] = _role(trace, proj_op, B, T, heads=True)
    shared = q_op.index == k_op.index == v_op.index
    for name, op in (("q", q_op), ("k", k_op), ("v", v_op)):
        if not shared or name == "q":
            roles[name] = _role_of(trace, op, B, T)
    heads = core.groups // (B if core.time == T else T)
    h1, h2 = roles["q"].put, roles["fc1"].put
    stream = _residual(trace, roles["proj"].get[0], h2)
    norm1, norm2 = replay(trace, trace.input, h1), replay(trace, stream, h2)
    rotated = any(
        (found := to_weight(trace, n)) is None or found[0].index != op.index
        for n, op in ((core.q, q_op), (core.k, k_op))
    )
    norms = _norms(trace, B, T, h1, h2)
    width = {r: trace.nodes[op.outputs[0]].shape[-1] for r, op in (("q", q_op), ("k", k_op))}
    grouped = width["q"] != heads * trace.nodes[core.q].shape[-1] * (3 if shared else 1)
    grouped = grouped or (not shared and width["k"] < width["q"])
    like = trace.nodes[trace.input].value
    if not (
        rotated or grouped or rest[2:] or any(_shifts(f, like) for f in (norm1, norm2, *norms))
    ):
        return None  # the lessons' block: read by gptblock.check.roles.readings, weights and all
    read = measure(trace, Roles(roles, heads), B, T)
    hs = trace.nodes[core.q].shape[-1]
    oriented = {
        r: _heads(trace, n, B, heads, T, hs, r == "k")
        for r, n in (("q", core.q), ("k", core.k), ("v", core.v))
    }
    if shared:  # q, k, v packed in one matrix: which rows are which, from the core
        w, b = read["q"][:2]
        h = _rows(trace.nodes[roles["q"].put].value, B, T).double().reshape(B, T, -1)[:, 0]
        operands = [oriented[r] for r in ("q", "k", "v")]
        try:
            packed = _packed(h @ w.T + b, operands, heads)
        except Unread:  # a qk norm rescales q and k: [q | k | v] if v is where that puts it
            D = heads * operands[0].shape[-1]
            kv = (w.shape[0] - D) // 2
            if _packed(h @ w.T + b, operands[2:], heads)[0] != list(range(D + kv, w.shape[0])):
                raise
            packed = [list(range(D)), list(range(D, D + kv)), list(range(D + kv, w.shape[0]))]
        read["q"], read["k"], read["v"] = ((w[i], b[i], 0.0) for i in packed)
    D = read["q"][0].shape[0]
    if D % heads or read["k"][0].shape[0] != read["v"][0].shape[0] or D % read["k"][0].shape[0]:
        raise Unread(
            f"q, k, v map to {D}, {read['k'][0].shape[0]}, {read['v'][0].shape[0]} channels: "
            f"not {heads} query heads and a divisor of them as key/value heads"
        )
    value = {n: trace.nodes[n].value for n in {r.put for r in roles.values()}}

    def rows(node: int) -> Tensor:
        return _rows(value[node], B, T).double().reshape(B, T, -1)

    names = {
        r: ", ".join(static_names(trace, [op]))
        for r, op in (("q", q_op), ("k", k_op), ("v", v_op), ("proj", proj_op))
    }
    mlp_names = [", ".join(static_names(trace, [op])) for op in rest]
    mlp = [read[f"fc{i + 1}"][:2] for i in range(len(first))] + [read["down"][:2]]
    return ModernRead(
        x.double(), trace.nodes[trace.output].value.double(), heads,
        read["q"][:2], read["k"][:2], read["v"][:2], read["proj"][:2], mlp, mlp_names,
        rows(h1), rows(h2), rows(roles["proj"].put), rows(roles["down"].put),
        norm1, norm2, stream == trace.input, rotated, names,
        (_path_params(trace, trace.input, h1), _path_params(trace, stream, h2)),
        oriented["q"].double(), oriented["k"].double(), norms,
        measure_turn(trace, q_op.outputs[0], core.q, B, heads, T, hs) if rotated else None,
        trace, core, (q_op.outputs[0], proj_op.outputs[0], last.outputs[0]),
    )  # fmt: skip


def qk_gains(read: ModernRead, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor] | None:
    """The gains of a qk norm (an RMSNorm over each head's hs on q and on k), read at position
    0, where no rotation turns anything; None when the scores' operands are not laid out as
    (B, heads, T, hs)."""
    B, T, _ = q.shape
    hs = q.shape[-1] // read.n_head
    gains = []
    for lin, core in ((q, read.core_q), (k, read.core_k)):
        if core.numel() != B * read.n_head * T * hs or core.shape[-2:] != (T, hs):
            return None
        heads = lin.reshape(B, T, -1, hs)[:, 0]  # (B, h, hs) at position 0
        base = heads * torch.rsqrt(heads.pow(2).mean(-1, keepdim=True) + 1e-6)
        seen = core.reshape(B, read.n_head, T, hs)[:, : heads.shape[1], 0]  # (B, h, hs)
        gains.append((seen[:, :1] / base[:, :1]).flatten(0, 1).median(dim=0).values)  # (hs,)
    return gains[0], gains[1]
