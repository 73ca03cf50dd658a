"""What no reference models, read as positive evidence from a recorded forward pass: in the
attention (``attention_scope``: soft-capped logits, a bias on the scores, a sliding window, a gate
on its output), a branch's gain, an activation, and around a modern block's parts (``unmodelled``:
sandwich norms, qk norms and rotations of other forms). docs/checker.md, "Out of scope is not FAIL".
"""

from __future__ import annotations

from typing import cast

import torch

from ..mistakes.report import CAUGHT
from .cores import Core, cores
from .dataflow import SHAPE_OPS, as_rows, static_names, weight_input
from .modern_parts import close
from .modern_read import ModernRead, heads
from .trace import Op, Trace, replay
from .weights import rescaled

__all__ = ["MASKED", "attention_scope", "unmodelled"]

Tensor = torch.Tensor
SATURATING = {"tanh": "tanh", "atan": "atan", "sigmoid": "sigmoid", "erf": "erf",
              "clamp": "clamp", "clamp_min": "clamp", "clamp_max": "clamp", "hardtanh": "clamp"}  # fmt: skip
MASKED = -1e4  # a score at or below this is masked (-inf, finfo.min, -1e9), not biased; an
# additive mask's entries are 0 or at least this large (- 1e10 * (1 - b), as OpenAI's GPT-2)
OTHER_ACTIVATIONS = ("leaky_relu", "elu", "softplus", "mish", "hardswish", "_prelu_kernel")


def _activation(trace: Trace) -> list[str]:  # (at the dispatch level, SELU and CELU are elu's)
    other = [op.base for op in trace.ops if op.base in OTHER_ACTIVATIONS]
    return [f"the activation {other[0]} (not GELU, ReLU, SiLU or ReLU squared)"] if other else []


def attention_scope(trace: Trace) -> list[str]:
    """What its attention computes that no reference models, and an activation or branch gain."""
    try:
        found = _activation(trace) + _gained(trace) + _shifted(trace)
        for core in cores(trace):
            found += [p for p in _in_core(trace, core) if p not in found]
    except CAUGHT:  # the checker's own limit: nothing found
        return []
    return found


def _shifted(trace: Trace) -> list[str]:
    """A tensor of the block's own added to its input before anything else reads it (a position
    table: s84 unseen set), laid out again at most."""
    todo = [trace.input]
    while todo:
        for op in trace.consumers(todo.pop()):
            if op.base in SHAPE_OPS:
                todo += op.outputs
            elif op.base in ("add", "sub") and any(
                not trace.nodes[n].data and bool(trace.nodes[n].value.ne(0).any()) for n in op.inputs
            ):  # fmt: skip
                names = ", ".join(static_names(trace, [op])) or "a constant"
                return [f"a tensor of the block's own ({names}) is added to its input before its "
                        "branches read it (an absolute position table)"]  # fmt: skip
    return []


def _in_core(trace: Trace, core: Core) -> list[str]:
    made, A, scores = cast(Op, trace.producer(core.y)), core.A, core.scores  # fused, or A @ v
    path: list[Op] = []  # the ops from the scores to A
    if A is not None and scores is not None:
        inside, behind = set(scores.outputs), trace.ancestors(A)
        for op in trace.ops[scores.index + 1 : trace.nodes[A].op + 1]:
            if any(n in inside for n in op.inputs) and any(n in behind for n in op.outputs):
                inside.update(op.outputs)
                path.append(op)
    capped = [SATURATING[op.base] for op in path if op.base in SATURATING]
    window = _window(trace, made, A)
    found = [
        capped and f"the attention logits are soft-capped ({capped[0]} between the score product "
        "and the softmax, as Gemma 2's tanh(s / c) * c)",
        any(_bias(trace, op) for op in [scores, *path] if op) and "a bias that varies with the positions is added "
        "to the attention scores (ALiBi or a relative position bias)",
        window and f"a sliding-window mask: each position attends to the last {window} only",
        _gated(trace, core.y) and "the attention's output is gated per channel before its "
        "projection (sigmoid(g(x)) * attention, as Qwen3-Next's gated attention)",
    ]  # fmt: skip
    return [f for f in found if f]


def _gated(trace: Trace, y: int) -> bool:
    """The attention's output ``y`` multiplied by values of another branch (not a norm's
    factor, made from ``y``: BitNet's sub-norm), before a weight."""
    todo, seen = [y], {y}
    while todo:
        for op in trace.consumers(todo.pop()):
            other = [
                n for n in op.inputs
                if n not in seen and trace.nodes[n].data and y not in trace.ancestors(n)
            ]  # fmt: skip
            if op.base == "mul" and any(trace.nodes[n].value.numel() > 1 for n in other):
                return True
            if op.base in SHAPE_OPS:  # (never a product with a weight)
                todo += [n for n in op.outputs if n not in seen]
                seen.update(op.outputs)
    return False


def unmodelled(read: ModernRead) -> list[str]:
    trace, (q_out, proj_out, down_out) = read.trace, read.ends
    found = _activation(trace) + _gained(trace) + _in_core(trace, read.core) + [
        f"a norm after the {what} inside its residual branch (a sandwich norm, as Gemma 2's and "
        "OLMo 2's)" for what, end in (("attention", proj_out), ("MLP", down_out))
        if _normed_branch(trace, end)
    ]  # fmt: skip
    turn = read.turn
    turned = turn is not None and turn.pairing != "other"  # a rotation, if scaled or spread
    found += [qk] if (qk := _qk_norm(trace, q_out, read.core.q, read.n_head, turned)) else []
    if turn is not None and turn.pairing == "spread":
        pairs = ", ".join(map(str, turn.pairs[:2]))
        found.append(
            f"a rotary embedding that turns the channel pairs {pairs}, ... of a head of "
            f"{read.q[0].shape[0] // read.n_head}, not halves nor adjacent pairs of its first r "
            "channels (as modded-nanogpt's half-truncated rotary)"
        )
    elif turn is not None and not turn.fits and not qk:  # (measured through a norm: no)
        found.append(
            "a rotary embedding whose frequencies are not theta^(-2i/r) (scaled positions, as "
            "Llama 3.1's or YaRN's; or a rotation applied at other positions than each token's, "
            "as a reshape of (B, T, nh, hs) to (B * nh, T, hs) without moving the heads first)"
        )
    return found


def _bias(trace: Trace, op: Op) -> bool:
    static = [trace.nodes[n].value for n in op.inputs if not trace.nodes[n].data]
    added = op.base in ("add", "sub") or (op.base == "baddbmm" and op.kwargs.get("beta", 1) != 0)
    kept = [  # a mask's entries are 0 or huge
        t[torch.isfinite(t) & (t.abs() < -MASKED)]
        for t in static if added and t.dim() >= 2 and t.is_floating_point()
    ]  # fmt: skip
    return any(k.numel() and bool((k != k.flatten()[0]).any()) for k in kept)


def _window(trace: Trace, made: Op, A: int | None) -> int:
    """w < T where exactly the keys t - w < s <= t are attended to at every query t (by ``A``,
    or a fused core's static ``attn_mask``); else 0."""
    if A is None and (len(made.inputs) < 4 or trace.nodes[made.inputs[3]].data):
        return 0
    if A is None:
        mask = trace.nodes[made.inputs[3]].value
        allowed = mask if mask.dtype == torch.bool else mask > MASKED
    else:
        allowed = trace.nodes[A].value != 0
    if allowed.dim() < 2 or allowed.shape[-1] != allowed.shape[-2]:
        return 0
    allowed = allowed.reshape(-1, *allowed.shape[-2:])  # (heads, T, T)
    allowed = allowed.all(0) if A is None else allowed.any(0)  # the mask: in all; A: in any
    t = torch.arange(allowed.shape[-1])
    back = t[:, None] - t[None, :]  # (T, T): how far key s is behind query t
    found = (w for w in range(1, len(t)) if torch.equal(allowed.cpu(), (back >= 0) & (back < w)))
    return next(found, 0)


def _gained(trace: Trace) -> list[str]:
    """A branch multiplied by a gain before its residual sum (LayerScale, ReZero): the map from
    its last matrix product to the sum is linear (3 z gives 3 times as much), not the identity."""
    shape, found = trace.nodes[trace.input].shape, list[str]()  # each gain's parameters
    streams = {trace.input}  # and the residual sums' outputs
    for op in trace.ops:
        data = [n for n in op.inputs if trace.nodes[n].data]
        if op.base != "add" or len(data) != 2 or trace.nodes[op.outputs[0]].shape != shape:
            continue
        if not any(_moved_from(trace, n) in streams for n in data):
            continue  # two branches' sum, not a residual sum: LoRA's W x + s * B A x (s100)
        streams.add(op.outputs[0])
        for n in data:
            end, made = n, trace.producer(n)
            while made is not None and weight_input(trace, made) is None:
                ins = [m for m in made.inputs if trace.nodes[m].data]
                end, made = (ins[0], trace.producer(ins[0])) if len(ins) == 1 else (n, None)
            if made is None or end == n:
                continue  # the stream, a sum, or a product's output as it is
            between = trace.between(end, n)
            if all(op.base in SHAPE_OPS for op in between):
                continue  # moved, not scaled: (T * B, C) laid out as (B, T, C)
            z = torch.randn(trace.nodes[end].shape, generator=torch.Generator().manual_seed(3))
            try:
                run, z = replay(trace, end, n), z.to(trace.nodes[end].value)
                a, b = run(z), run(3.0 * z)
            except CAUGHT:
                continue
            if close(b, 3.0 * a, 1e-6) and not close(a.flatten(), z.flatten(), 1e-6):
                found.append(", ".join(static_names(trace, between)) or "a constant")
    said = f"a branch's output times a gain ({'; '.join(found)}) before its residual sum"
    return [f"{said} (LayerScale, ReZero)"] if found else []


def _moved_from(trace: Trace, n: int) -> int:
    """The tensor ``n`` is, before data movement (a reshape, a copy)."""
    while (made := trace.producer(n)) is not None and made.base in SHAPE_OPS:
        ins = [m for m in made.inputs if trace.nodes[m].data]
        if len(ins) != 1:
            break
        n = ins[0]
    return n


def _normed_branch(trace: Trace, end: int) -> bool:
    shape = trace.nodes[trace.input].shape
    for op in trace.ops[trace.nodes[end].op + 1 :]:
        data = [n for n in op.inputs if trace.nodes[n].data]
        if op.base != "add" or len(data) != 2 or trace.nodes[op.outputs[0]].shape != shape:
            continue
        mine = [n for n in data if end in trace.ancestors(n)]
        if len(mine) == 1:
            z = trace.nodes[end].value
            moved = None if mine[0] == end else rescaled(trace, end, mine[0], z, [3.0])
            return moved is not None and moved[2][0] <= 1e-3  # float32 norms: 1e-5
    return False


def _qk_norm(trace: Trace, q_out: int, q_core: int, nh: int, turned: bool) -> str:
    """q normalised (the scores' q as q's product times 3 is), over the whole width (OLMo 2's:
    head 0 alone times 3 moves it), or per head in a form not modelled: where no rotation was
    measured through it (``turned``), as one is after an RMSNorm (a channel lit alone stays
    one channel, times its gain, then turns)."""
    z = trace.nodes[q_out].value
    D = z.shape[-1]
    if D % nh or z.dim() < 2:
        return ""
    one = torch.ones(nh, D // nh, dtype=z.dtype, device=z.device)
    one[0] = 3.0  # head 0 three times, its heads contiguous (nh, hs) or strided (hs, nh)
    moved = rescaled(trace, q_out, q_core, z, [3.0, one.flatten(), one.T.flatten()])
    per_head = moved is not None and min(moved[2][1:]) <= 1e-2
    # turned: a rotation measured through it, an RMSNorm before it (its rotation scaled?)
    if moved is None or moved[2][0] > 1e-3 or (turned and per_head):  # float32: 1e-5
        return ""
    if not per_head:
        return "q and k normalised over the whole width (OLMo 2's qk norm), not per head"
    if _rms_alone(trace, q_out, q_core, nh, strided=moved[2][2] < moved[2][1]):
        return ""  # the references' qk norm: what fails is elsewhere (s86: a rotation by head)
    return (
        "q and k normalised per head other than by an RMSNorm before the rotation (a LayerNorm, "
        "a bias, or a norm after the rotation)"
    )


def _rms_alone(trace: Trace, q_out: int, q_core: int, nh: int, strided: bool) -> bool:
    """Head 0 of the scores' q is its channels of q's product through an RMSNorm times a gain
    and nothing else (no rotation there, which turns head 0 too; no LayerNorm, no bias)."""
    B, T = trace.nodes[trace.input].shape[:2]
    try:
        rows = as_rows(trace.nodes[q_out].value, B, T).double()  # (B * T, D)
        core = heads(trace.nodes[q_core].value, B, nh, T, rows.shape[-1] // nh)  # (B, nh, T, hs)
    except CAUGHT:  # (Unread: not laid out by position)
        return False
    if core is None:
        return False
    z = rows[:, 0::nh] if strided else rows[:, : core.shape[-1]]  # head 0's: (B * T, hs)
    r = z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + 1e-6)
    y = core[:, 0].reshape(r.shape).double()
    gain = (y * r).sum(0) / (r * r).sum(0).clamp_min(1e-30)  # least squares, per channel
    return bool((y - r * gain).abs().max() <= 1e-3 * y.abs().max())
