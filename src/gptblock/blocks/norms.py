"""RMSNorm (Zhang & Sennrich 2019), as a function of given weights and as a module.

LayerNorm subtracts the mean and divides by the standard deviation; RMSNorm only divides by
the root mean square, ``x / sqrt(mean(x^2) + eps) * weight``, with eps inside the root (as
Llama, Mistral, Qwen and T5 compute it). No bias.

Shapes: C channels (the last dimension).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..errors import UserTypeError, UserValueError
from .config import check_norm_eps

__all__ = ["RMSNorm", "rmsnorm"]


def rmsnorm(x: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last dimension.

    Args:
        x: any tensor; normalised over its last dimension C.
        weight: the gain (C,), or None for none.
        eps: added to the mean of squares, inside the square root.

    Shape:
        x (..., C), weight (C,) -> (..., C).

    Example:
        >>> x = torch.tensor([[3.0, 4.0]])
        >>> rmsnorm(x, torch.ones(2), eps=0.0)  # rms = sqrt((9 + 16) / 2)
        tensor([[0.8485, 1.1314]])
    """
    y = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)  # (..., C)
    return y if weight is None else y * weight


class RMSNorm(nn.Module):
    """RMSNorm over the last dimension, with a gain ``weight`` initialised to ones.

    Its state_dict is ``{"weight"}``, as Hugging Face's ``LlamaRMSNorm``; ``eps`` is
    ``variance_epsilon`` there.

    Args:
        dim: C, the normalised dimension.
        eps: inside the square root; Llama's default is 1e-6.

    Shape:
        (..., C) -> (..., C).

    Example:
        >>> norm = RMSNorm(4)
        >>> x = torch.randn(2, 3, 4)
        >>> torch.equal(norm(x), rmsnorm(x, norm.weight, norm.eps))
        True
        >>> list(norm.state_dict())
        ['weight']
    """

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise UserValueError(f"dim must be a positive int, got {dim!r}")
        self.eps = check_norm_eps(eps)
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise UserTypeError(f"expected a torch.Tensor, got {type(x).__name__}")
        if x.shape[-1:] != self.weight.shape:
            raise UserValueError(
                f"RMSNorm({self.weight.shape[0]}) expects a last dimension of "
                f"{self.weight.shape[0]}, got shape {tuple(x.shape)}"
            )
        return rmsnorm(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"
