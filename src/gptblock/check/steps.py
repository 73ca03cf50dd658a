"""The lessons' pre-norm block computed step by step from its weights, each step replaceable.

``run_steps(params, x, n_head, activation, steps)`` computes the pre-norm block of the lessons
from a plain set of weights (``Params``), in whatever dtype the weights have (the checker uses
float64). ``Steps`` says how each step is done: the causal mask, the score scale, the softmax
axis, which axis attention runs along, and how the sub-layers are wired to the residual stream.
The correct block is ``CORRECT``; each catalogued mistake is a change to one field of it (a
``Deviation`` of ``gptblock.check.variants``). The reports call this block "the reference".

This is deliberately independent of ``gptblock.lesson`` / ``gptblock.mha``: a few lines of
``torch.nn.functional`` that the variants can change step by step. (The project's NumPy oracle,
``gptblock.reference``, was rejected here because the variants need the same code path with one
step swapped, and the checker must run on whatever device the user's block lives on.)

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
    "Params",
    "Steps",
    "SubLayer",
    "Wiring",
    "run_steps",
]

Tensor = torch.Tensor
SubLayer = Callable[[Tensor], Tensor]


@dataclass(frozen=True, repr=False)
class Params:
    """One block's weights in one layout: ``nn.Linear``'s (out, in), q/k/v as separate matrices.

    Heads are contiguous slices of the attention width: head i uses rows ``i*hs:(i+1)*hs`` of
    ``wq``/``wk``/``wv`` and columns ``i*hs:(i+1)*hs`` of ``wo`` (the layout of the lesson's
    concatenated heads, ``nn.MultiheadAttention``'s ``in_proj_weight`` and GPT-2's ``c_attn``).
    Any bias or LayerNorm affine parameter may be ``None``.
    """

    ln1_weight: Tensor | None  # (C,)
    ln1_bias: Tensor | None  # (C,)
    ln1_eps: float
    wq: Tensor  # (D, C)
    bq: Tensor | None  # (D,)
    wk: Tensor  # (D, C)
    bk: Tensor | None  # (D,)
    wv: Tensor  # (D, C)
    bv: Tensor | None  # (D,)
    wo: Tensor  # (C, D)
    bo: Tensor | None  # (C,)
    ln2_weight: Tensor | None  # (C,)
    ln2_bias: Tensor | None  # (C,)
    ln2_eps: float
    w1: Tensor  # (H, C)
    b1: Tensor | None  # (H,)
    w2: Tensor  # (C, H)
    b2: Tensor | None  # (C,)

    def __post_init__(self) -> None:
        C, D, H = self.wo.shape[0], self.wq.shape[0], self.w1.shape[0]
        expected = {
            "wq": (D, C), "wk": (D, C), "wv": (D, C), "wo": (C, D), "w1": (H, C), "w2": (C, H),
            "bq": (D,), "bk": (D,), "bv": (D,), "bo": (C,), "b1": (H,), "b2": (C,),
            "ln1_weight": (C,), "ln1_bias": (C,), "ln2_weight": (C,), "ln2_bias": (C,),
        }  # fmt: skip
        for name, shape in expected.items():
            value = getattr(self, name)
            if value is not None and tuple(value.shape) != shape:
                raise ValueError(
                    f"{name} has shape {tuple(value.shape)}, expected {shape} "
                    f"(C={C}, attention width {D}, MLP width {H})"
                )

    def __repr__(self) -> str:
        return f"Params(C={self.C}, D={self.D}, H={self.w1.shape[0]})"

    @property
    def C(self) -> int:
        """Channels of the residual stream."""
        return int(self.wo.shape[0])

    @property
    def D(self) -> int:
        """Attention width nh * hs (C in every standard block)."""
        return int(self.wq.shape[0])


def _gelu_tanh(x: Tensor) -> Tensor:
    return F.gelu(x, approximate="tanh")


CANDIDATE_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu": F.gelu,  # exact (erf): nn.GELU(), TransformerBlock, nanoGPT
    "gelu_tanh": _gelu_tanh,  # the tanh approximation: Hugging Face GPT-2's gelu_new
    "relu": F.relu,  # the first lesson's FeedForward
}
"""The MLP activations a correct block may use. A black box does not say which it uses, so each
is tried, and none of them is a mistake. (Not ``gptblock.config.ACTIVATIONS``, the activations
gptblock's own blocks offer: a learner's block may use one they do not, such as tanh GELU.)"""


# ----- the correct steps ---------------------------------------------------------------------

Wiring = Callable[[Tensor, SubLayer, SubLayer, SubLayer, SubLayer], Tensor]


def _pre_norm(x: Tensor, attn: SubLayer, mlp: SubLayer, ln1: SubLayer, ln2: SubLayer) -> Tensor:
    x = x + attn(ln1(x))  # lesson 1: x = x + self.sa(self.ln1(x))
    return x + mlp(ln2(x))  # lesson 1: x = x + self.ffwd(self.ln2(x))


def _causal(T: int, device: torch.device) -> Tensor:
    """True = blocked: key j > query i (lesson 2's torch.triu(..., diagonal=1))."""
    return torch.triu(torch.ones(T, T, dtype=torch.bool, device=device), diagonal=1)


@dataclass(frozen=True)
class Steps:
    """How each step of the block is done; ``CORRECT`` is the lessons' block.

    Each field is one step a mistake can change, so a mistaken block is ``CORRECT`` with some
    fields replaced (by the deviations of ``gptblock.check.variants``), never a flag tested
    inside the forward.
    """

    blocked: Callable[[int, torch.device], Tensor]  # T -> bool (T, T) mask, True = blocked
    scale: Callable[[int, int], float]  # (C, hs) -> factor on the scores
    softmax_dim: int  # the axis of the (B, nh, T, T) scores that the softmax normalises
    time_axis: int  # the input axis attention runs along: 1 for (B, T, C), 0 if read as (T, B, C)
    wiring: Wiring  # how the sub-layers and norms connect to the residual stream


CORRECT = Steps(
    blocked=_causal, scale=lambda C, hs: hs**-0.5, softmax_dim=-1, time_axis=1, wiring=_pre_norm
)


def run_steps(
    p: Params, x: Tensor, n_head: int, activation: Callable[[Tensor], Tensor], steps: Steps
) -> Tensor:
    """The block ``steps`` describes, with weights ``p``, on input ``x``.

    A query row that the steps' mask blocks entirely comes out NaN, as it does with
    ``masked_fill(-inf)`` + softmax and with ``nn.MultiheadAttention``; the checker ignores
    such positions when it compares.

    Args:
        p: the weights.
        x: the input.
        n_head: nh; must divide the attention width D.
        activation: the MLP's nonlinearity (one of ``CANDIDATE_ACTIVATIONS``).
        steps: ``CORRECT`` or a variant of it.

    Shape:
        x: (B, T, C); returns (B, T, C).

    Example:
        >>> C, D, H = 8, 8, 32
        >>> g = torch.Generator().manual_seed(0)
        >>> w = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
        >>> p = Params(None, None, 1e-5, w(D, C), None, w(D, C), None, w(D, C), None, w(C, D),
        ...            None, None, None, 1e-5, w(H, C), None, w(C, H), None)
        >>> run_steps(p, w(2, 3, C), 2, F.relu, CORRECT).shape
        torch.Size([2, 3, 8])
    """
    C = p.C

    def ln1(h: Tensor) -> Tensor:
        return F.layer_norm(h, (C,), p.ln1_weight, p.ln1_bias, p.ln1_eps)

    def ln2(h: Tensor) -> Tensor:
        return F.layer_norm(h, (C,), p.ln2_weight, p.ln2_bias, p.ln2_eps)

    def attn(h: Tensor) -> Tensor:
        return _attention(p, h, n_head, steps)

    def mlp(h: Tensor) -> Tensor:
        return F.linear(activation(F.linear(h, p.w1, p.b1)), p.w2, p.b2)  # (B, T, H) -> (B, T, C)

    return steps.wiring(x, attn, mlp, ln1, ln2)


def _attention(p: Params, h: Tensor, n_head: int, steps: Steps) -> Tensor:
    if steps.time_axis == 0:
        h = h.transpose(0, 1)  # (T, B, C) read as a batch of T sequences of length B
    B, T, C = h.shape
    hs = p.D // n_head
    q = F.linear(h, p.wq, p.bq).view(B, T, n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
    k = F.linear(h, p.wk, p.bk).view(B, T, n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
    v = F.linear(h, p.wv, p.bv).view(B, T, n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
    wei = (q @ k.transpose(-2, -1)) * steps.scale(C, hs)  # (B, nh, T, hs) @ (B, nh, hs, T)
    wei = wei.masked_fill(steps.blocked(T, h.device), float("-inf"))  # (B, nh, T, T)
    wei = F.softmax(wei, dim=steps.softmax_dim)
    out = (wei @ v).transpose(1, 2).reshape(B, T, p.D)  # (B, nh, T, hs) -> (B, T, nh * hs)
    out = F.linear(out, p.wo, p.bo)  # (B, T, C)
    return out.transpose(0, 1) if steps.time_axis == 0 else out
