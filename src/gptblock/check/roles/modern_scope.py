"""The parts of a block the references do not model, found by what the block computes.

Where no variant reproduces a block, ``unmodelled`` looks in its forward pass for positive
evidence of such a part (soft-capped logits, a bias on the scores, a sliding window, sandwich
norms, a qk norm over the whole width, a rotation off RoPE's ladder): then the block is out of
scope (``UNVERIFIED``), not ``FAIL``. docs/checker.md, "Out of scope is not FAIL", tables them.

Shapes: B batch, T time, C channels, G = B * nh the score product's batch.
"""

from __future__ import annotations

import torch

from ..mistakes.report import CAUGHT
from ..mistakes.steps import Rope
from .dataflow import _cores, _scores
from .modern_read import ModernRead
from .modern_rotary import Turn
from .trace import Op, Trace, TraceError, replay

__all__ = ["attention_scope", "measured", "unmodelled"]

Tensor = torch.Tensor
SATURATING = {"tanh": "tanh", "atan": "atan", "sigmoid": "sigmoid", "erf": "erf",
              "clamp": "clamp", "clamp_min": "clamp", "clamp_max": "clamp", "hardtanh": "clamp"}  # fmt: skip
MASKED = -1e4  # a score at or below this is masked (-inf, finfo.min, -1e9), not biased; an
# additive mask's entries are 0 or at least this large (- 1e10 * (1 - b), as OpenAI's GPT-2)


def attention_scope(trace: Trace) -> list[str]:
    """What the attention of a lessons' block computes that the references do not model, in any
    of its cores (one per head, or one for all)."""
    found: list[str] = []
    try:
        for core in _cores(trace):
            found += [p for p in _in_core(trace, core.y) if p not in found]
    except CAUGHT:  # the checker's own limit: nothing found
        return []
    return found


def _in_core(trace: Trace, y: int) -> list[str]:
    found: list[str] = []
    path = _score_path(trace, y)
    capped = [SATURATING[op.base] for op in path if op.base in SATURATING]
    if capped:
        found.append(
            f"the attention logits are soft-capped ({capped[0]} between the score product and "
            "the softmax, as Gemma 2's tanh(s / c) * c)"
        )
    if any(_bias(trace, op) for op in path):
        found.append(
            "a bias that varies with the positions is added to the attention scores (ALiBi or "
            "a relative position bias)"
        )
    window = _window(trace, y)
    if window:
        found.append(f"a sliding-window mask: each position attends to the last {window} only")
    return found


def unmodelled(read: ModernRead) -> list[str]:
    """What ``read``'s block computes that the references do not model, one line each."""
    trace = read.trace
    found = _in_core(trace, read.core.y)
    q_out, proj_out, down_out = read.ends
    for what, end in (("attention", proj_out), ("MLP", down_out)):
        if _normed_branch(trace, end):
            found.append(
                f"a norm after the {what} inside its residual branch (a sandwich norm, as "
                "Gemma 2's and OLMo 2's)"
            )
    if _width_norm(trace, q_out, read.core.q, read.n_head):
        found.append("q and k normalised over the whole width (OLMo 2's qk norm), not per head")
    if read.turn is not None and not read.turn.fits:
        found.append(
            "a rotary embedding whose frequencies are not theta^(-2i/r) (scaled positions, as "
            "Llama 3.1's or YaRN's)"
        )
    return found


def _score_path(trace: Trace, y: int) -> list[Op]:
    """The operators between the score product and the probabilities that multiply v."""
    made = trace.producer(y)
    if made is None or made.name not in ("bmm", "mm"):
        return []  # a fused attention: no scores to look at
    A = next(n for n in made.inputs if trace.nodes[n].data)
    scores = _scores(trace, A)
    if scores is None:
        return []
    behind = trace.ancestors(A)
    inside, path = set(scores.outputs), []
    for op in trace.ops[scores.index + 1 : trace.nodes[A].op + 1]:
        if any(n in inside for n in op.inputs) and any(n in behind for n in op.outputs):
            inside.update(op.outputs)
            path.append(op)
    return path


def _bias(trace: Trace, op: Op) -> bool:
    """Whether ``op`` adds a static tensor with more than one finite, unmasked value."""
    static = [trace.nodes[n].value for n in op.inputs if not trace.nodes[n].data]
    kept = [  # a mask's entries are 0 or huge
        t[torch.isfinite(t) & (t.abs() < -MASKED)]
        for t in static if op.base in ("add", "sub") and t.dim() >= 2 and t.is_floating_point()
    ]  # fmt: skip
    return any(k.numel() and bool((k != k.flatten()[0]).any()) for k in kept)


def _window(trace: Trace, y: int) -> int:
    """w when exactly the keys t - w < s <= t are attended to at every query t of every head and
    sequence, with w < T (from the probabilities of an unfused core, or a fused one's static
    ``attn_mask``); else 0 (causal, or another pattern: a catalogued mask mistake's)."""
    made = trace.producer(y)
    if made is None:
        return 0
    if "scaled_dot_product" in made.name:
        if len(made.inputs) < 4 or trace.nodes[made.inputs[3]].data:
            return 0
        mask = trace.nodes[made.inputs[3]].value
        allowed = mask if mask.dtype == torch.bool else mask > MASKED
        if allowed.dim() < 2:
            return 0
        allowed = allowed.reshape(-1, *allowed.shape[-2:]).all(0)
    else:
        A = trace.nodes[next(n for n in made.inputs if trace.nodes[n].data)].value
        if A.dim() < 2 or A.shape[-1] != A.shape[-2]:
            return 0
        allowed = (A.reshape(-1, *A.shape[-2:]) != 0).any(0)
    t = torch.arange(allowed.shape[-1])
    back = t[:, None] - t[None, :]  # (T, T): how far key s is behind query t
    found = (w for w in range(1, len(t)) if torch.equal(allowed.cpu(), (back >= 0) & (back < w)))
    return next(found, 0)


def _moves(trace: Trace, source: int, target: int, factors: list[Tensor | float]) -> list[float]:
    """How far the replayed map from ``source`` to ``target`` moves when its traced input is
    multiplied by each of ``factors``, of its output's scale; ``[]`` where it cannot tell."""
    z = trace.nodes[source].value
    try:
        f = replay(trace, source, target)
        with torch.no_grad():
            a, *outs = [f(z).double()] + [f(z * by).double() for by in factors]
    except (*CAUGHT, TraceError):
        return []
    scale = float(a.abs().max())
    return [float((a - o).abs().max()) / scale for o in outs] if scale > 0 else []


def _normed_branch(trace: Trace, end: int) -> bool:
    """Whether a sub-layer's output ``end`` reaches the residual sum through a norm: a map that
    does not scale with it."""
    shape = trace.nodes[trace.input].shape
    for op in trace.ops[trace.nodes[end].op + 1 :]:
        data = [n for n in op.inputs if trace.nodes[n].data]
        if op.base != "add" or len(data) != 2 or trace.nodes[op.outputs[0]].shape != shape:
            continue
        mine = [n for n in data if end in trace.ancestors(n)]
        if len(mine) == 1:
            moved = _moves(trace, end, mine[0], [3.0]) if mine[0] != end else []
            return bool(moved) and moved[0] <= 1e-3  # float32 norms: 1e-5
    return False


def _width_norm(trace: Trace, q_out: int, q_core: int, nh: int) -> bool:
    """Whether the map from q's projection to the scores is invariant to scaling q as a whole
    but not to scaling one head (a norm over the whole width, not per head)."""
    z = trace.nodes[q_out].value
    D = z.shape[-1]
    if D % nh or z.dim() < 2:
        return False
    one = torch.ones(nh, D // nh, dtype=z.dtype, device=z.device)
    one[0] = 3.0
    moved = _moves(trace, q_out, q_core, [3.0, one.flatten()])
    return bool(moved) and moved[0] <= 1e-3 and moved[1] > 1e-2  # a float32 norm: 1e-5


def measured(turn: Turn | None, hs: int) -> str:
    """What turns q and k where the attention as a whole was not matched."""
    if turn is None or not turn.fits or turn.pairing == "other":
        return "something between the projections and the scores (not identified)"
    rope = Rope(turn.theta, turn.dim, turn.pairing, turn.pairing, 1.0).describe(hs)
    return f"{rope.replace('rope (', 'rope as measured (', 1)}, the attention not identified"
