"""The lessons' pre-norm block computed step by step from a block's own parts, each step replaceable.

``run_steps`` computes the lessons' block from ``Parts``: the block's sub-layers as functions, in
the lessons' roles (the two LayerNorms, q/k/v, the output projection, the MLP's two layers),
however the block names or stores them (``roles.mapping`` finds them). ``Steps`` says how each
step in between is done; ``CORRECT`` is the lessons' block, and each catalogued mistake is a
change to fields of it (its ``ways`` in ``catalogue``). The reports call this "the reference".

Deliberately not ``gptblock.lesson`` or the NumPy oracle ``gptblock.reference``: the variants
need one code path with one step swapped, on the block's own device. The parts are functions,
not weights, so that a block's own LayerNorm (the Annotated Transformer's divides by the
unbiased std plus eps), linear layers (Hugging Face's ``Conv1D``) and packing are computed
exactly as the block computes them.

Shapes: B batch, T time, C channels, D = nh * hs attention width (C in every standard block),
H the MLP's hidden width, nh heads, hs head size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.nn import functional as F

__all__ = [
    "CANDIDATE_ACTIVATIONS",
    "CORRECT",
    "QKV",
    "MissingPart",
    "Parts",
    "Steps",
    "SubLayer",
    "Wiring",
    "affine",
    "run_steps",
]

Tensor = torch.Tensor
SubLayer = Callable[[Tensor], Tensor]
QKV = Callable[[Tensor], tuple[Tensor, Tensor, Tensor]]


class MissingPart(ValueError):
    """The steps need a part this block does not have (a second LayerNorm)."""


@dataclass(frozen=True, repr=False)
class Parts:
    """One block's sub-layers as functions, in the roles of the lessons' block.

    Heads are contiguous slices of the attention width: head i is channels ``i*hs:(i+1)*hs`` of
    what ``qkv`` returns and of what ``proj`` takes (the layout of the lesson's concatenated
    heads, ``nn.MultiheadAttention``'s ``in_proj_weight`` and GPT-2's ``c_attn``).
    """

    C: int  # channels of the residual stream
    D: int  # attention width nh * hs
    qkv: QKV  # (B, T, C) -> q, k, v, each (B, T, D)
    proj: SubLayer  # the output projection, (B, T, D) -> (B, T, C)
    fc1: SubLayer  # the MLP's first layer, (B, T, C) -> (B, T, H)
    fc2: SubLayer  # the MLP's second layer, (B, T, H) -> (B, T, C)
    ln1: SubLayer | None  # the attention branch's LayerNorm
    ln2: SubLayer | None  # the MLP branch's; ``None`` when the block has only one

    def __post_init__(self) -> None:
        if self.C < 1 or self.D < 1:
            raise ValueError(f"C and D must be >= 1, got C={self.C}, D={self.D}")

    def __repr__(self) -> str:
        return f"Parts(C={self.C}, D={self.D})"


def affine(weight: Tensor, bias: Tensor | None = None) -> SubLayer:
    """``F.linear`` with these weights ((out, in), as ``nn.Linear`` stores them) as a sub-layer.

    Example:
        >>> f = affine(torch.eye(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64))
        >>> f(torch.zeros(1, 2, dtype=torch.float64))
        tensor([[1., 1.]], dtype=torch.float64)
    """
    return lambda h: F.linear(h, weight, bias)


def _gelu_tanh(x: Tensor) -> Tensor:
    return F.gelu(x, approximate="tanh")


CANDIDATE_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu": F.gelu,  # exact (erf): nn.GELU(), TransformerBlock, nanoGPT
    "gelu_tanh": _gelu_tanh,  # the tanh approximation: Hugging Face GPT-2's gelu_new, minGPT
    "relu": F.relu,  # the first lesson's FeedForward, the Annotated Transformer
}
"""The MLP activations a correct block may use. A black box does not say which it uses, so each
is tried, and none of them is a mistake. (Not ``gptblock.blocks.config.ACTIVATIONS``, the activations
gptblock's own blocks offer: a learner's block may use one they do not, such as tanh GELU.)"""


# ----- the correct steps ---------------------------------------------------------------------

Wiring = Callable[[Tensor, SubLayer, SubLayer, SubLayer, SubLayer], Tensor]
Norms = Callable[[SubLayer | None, SubLayer | None], tuple[SubLayer | None, SubLayer | None]]
Masking = Callable[[Tensor, Tensor, int], Tensor]


def _pre_norm(x: Tensor, attn: SubLayer, mlp: SubLayer, ln1: SubLayer, ln2: SubLayer) -> Tensor:
    x = x + attn(ln1(x))  # lesson 1: x = x + self.sa(self.ln1(x))
    return x + mlp(ln2(x))  # lesson 1: x = x + self.ffwd(self.ln2(x))


def _own_norms(
    ln1: SubLayer | None, ln2: SubLayer | None
) -> tuple[SubLayer | None, SubLayer | None]:
    return ln1, ln2  # each branch its own LayerNorm


def _causal(T: int, device: torch.device) -> Tensor:
    """True = blocked: key j > query i (lesson 2's torch.triu(..., diagonal=1))."""
    return torch.triu(torch.ones(T, T, dtype=torch.bool, device=device), diagonal=1)


def _mask_then_softmax(scores: Tensor, blocked: Tensor, dim: int) -> Tensor:
    # lesson 1: wei.masked_fill(self.tril[:T, :T] == 0, float("-inf")), then F.softmax
    return F.softmax(scores.masked_fill(blocked, float("-inf")), dim=dim)


def _split_heads(t: Tensor, n_head: int) -> Tensor:
    B, T, D = t.shape
    return t.reshape(B, T, n_head, D // n_head).transpose(1, 2)  # (B, T, D) -> (B, nh, T, hs)


def _merge_heads(y: Tensor) -> Tensor:
    B, nh, T, hs = y.shape
    return y.transpose(1, 2).reshape(B, T, nh * hs)  # (B, nh, T, hs) -> (B, T, nh * hs)


@dataclass(frozen=True)
class Steps:
    """How each step of the block is done; ``CORRECT`` is the lessons' block. A mistaken block
    is ``CORRECT`` with some fields replaced, never a flag tested inside the forward."""

    norms: Norms  # (ln1, ln2) -> the norms the attention and MLP branches use
    split: Callable[[Tensor, int], Tensor]  # (B, T, D), nh -> (B, nh, T, hs)
    blocked: Callable[[int, torch.device], Tensor]  # T -> bool (T, T) mask, True = blocked
    scale: Callable[[int, int], float]  # (C, hs) -> factor on the scores
    masking: Masking  # (scores, blocked, softmax_dim) -> attention weights, (B, nh, T, T)
    softmax_dim: int  # the axis of the (B, nh, T, T) scores that the softmax normalises
    merge: Callable[[Tensor], Tensor]  # (B, nh, T, hs) -> (B, T, D)
    time_axis: int  # the input axis attention runs along: 1 for (B, T, C), 0 if read as (T, B, C)
    wiring: Wiring  # how the sub-layers and norms connect to the residual stream
    # the modern block's options a mistake can change (``modern_steps.attention``):
    rotated: str = "qk"  # the tensors rotary positions turn: "qk" (right), "q" or "qkv"
    kv_order: str = "interleave"  # how key/value heads serve query heads (``modern_steps.ORDERS``)
    rope_table: str = "fits"  # the cos/sin table laid out for the rotation's pairing, or "other"


CORRECT = Steps(
    norms=_own_norms,
    split=_split_heads,
    blocked=_causal,
    scale=lambda C, hs: hs**-0.5,
    masking=_mask_then_softmax,
    softmax_dim=-1,
    merge=_merge_heads,
    time_axis=1,
    wiring=_pre_norm,
)


def run_steps(
    parts: Parts, x: Tensor, n_head: int, activation: Callable[[Tensor], Tensor], steps: Steps
) -> Tensor:
    """The block ``steps`` (``CORRECT`` or a variant) describes, with the sub-layers ``parts``,
    ``n_head`` heads (dividing D) and the MLP's ``activation``, on input ``x``. A query row the
    steps' mask blocks entirely comes out NaN, as with ``masked_fill(-inf)`` + softmax; the
    checker ignores such positions when it compares.

    Raises:
        MissingPart: the steps need a second LayerNorm and the block has only one.

    Shape:
        x: (B, T, C); returns (B, T, C).

    Example:
        >>> C, H = 8, 32
        >>> g = torch.Generator().manual_seed(0)
        >>> w = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
        >>> wq, wk, wv = w(C, C), w(C, C), w(C, C)
        >>> qkv = lambda h: (F.linear(h, wq), F.linear(h, wk), F.linear(h, wv))
        >>> norm = lambda h: F.layer_norm(h, (C,))
        >>> parts = Parts(C, C, qkv, affine(w(C, C)), affine(w(H, C)), affine(w(C, H)), norm, norm)
        >>> run_steps(parts, w(2, 3, C), 2, F.relu, CORRECT).shape
        torch.Size([2, 3, 8])
    """
    ln1, ln2 = steps.norms(parts.ln1, parts.ln2)
    if ln1 is None or ln2 is None:
        raise MissingPart("these steps need a LayerNorm per branch; the block has only one")

    def attn(h: Tensor) -> Tensor:
        return _attention(parts, h, n_head, steps)

    def mlp(h: Tensor) -> Tensor:
        return parts.fc2(activation(parts.fc1(h)))  # (B, T, C) -> (B, T, H) -> (B, T, C)

    return steps.wiring(x, attn, mlp, ln1, ln2)


def _attention(parts: Parts, h: Tensor, n_head: int, steps: Steps) -> Tensor:
    if steps.time_axis == 0:
        h = h.transpose(0, 1)  # (T, B, C) read as a batch of T sequences of length B
    T = h.shape[1]
    hs = parts.D // n_head
    q, k, v = (steps.split(t, n_head) for t in parts.qkv(h))  # 3 x (B, nh, T, hs)
    scores = (q @ k.transpose(-2, -1)) * steps.scale(parts.C, hs)  # (B, nh, T, T)
    wei = steps.masking(scores, steps.blocked(T, h.device), steps.softmax_dim)  # (B, nh, T, T)
    out = parts.proj(steps.merge(wei @ v))  # (B, nh, T, hs) -> (B, T, D) -> (B, T, C)
    return out.transpose(0, 1) if steps.time_axis == 0 else out
