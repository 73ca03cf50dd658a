"""RMSNorm (Zhang & Sennrich 2019), ``x / sqrt(mean(x^2) + eps) * weight`` with eps inside the
root (as Llama, Mistral, Qwen and T5), over the last dimension C, as a function and a module.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
from torch.autograd.function import once_differentiable

from ..errors import UserTypeError, UserValueError
from .checks import check_norm_eps

__all__ = ["RMSNorm", "RMSNormFunction", "compute_dtype", "inverse_rms", "rms_backward", "rmsnorm"]


def rmsnorm(x: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last dimension: x (..., C), the gain
    ``weight`` (C,) or None -> (..., C).

    Example:
        >>> x = torch.tensor([[3.0, 4.0]])
        >>> rmsnorm(x, torch.ones(2), eps=0.0)  # rms = sqrt((9 + 16) / 2)
        tensor([[0.8485, 1.1314]])
    """
    out: torch.Tensor = RMSNormFunction.apply(x, weight, eps)  # type: ignore[no-untyped-call, unused-ignore]
    return out


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the hand-written Functions compute in: float32 for half precision.

    Example:
        >>> compute_dtype(torch.bfloat16), compute_dtype(torch.float64)
        (torch.float32, torch.float64)
    """
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def inverse_rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``1 / sqrt(mean(x^2) + eps)`` over the last dimension, (..., 1), by one reduction pass
    (a norm), where ``mean(x^2)`` would be a product and then a sum."""
    rms = torch.linalg.vector_norm(x, dim=-1, keepdim=True)  # sqrt(sum x^2)
    return rms.square_().div_(x.shape[-1]).add_(eps).rsqrt_()


def rms_backward(
    dy: torch.Tensor, n: torch.Tensor, r: torch.Tensor, gain: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """RMSNorm's backward for G groups of C channels, each with its own gain: with ``n = x r``
    and ``dn = dy * gain``, ``dx = r (dn - n mean(dn n))`` (overwriting ``dy``) and ``dgain =
    sum(dy n)`` over the rows. Both sums come from ``p = dy n``, the per-group one through a
    product with the gains laid out block-diagonally (a CPU's reductions over short rows are
    slow). dy, n (..., G, C), r (..., G, 1), gain (G, C) or None."""
    G, C = n.shape[-2:]
    p = (dy * n).view(-1, G * C)  # (N, G C)
    blocks = torch.eye(G, dtype=n.dtype, device=n.device).repeat_interleave(C, dim=0)  # (G C, G)
    dgain = None
    if gain is not None:
        dgain = p.sum(0).view(G, C)
        blocks.mul_(gain.reshape(G * C, 1))
        dy.mul_(gain)
    dot = (p @ blocks).div_(C).view(*n.shape[:-1], 1)  # (..., G, 1): mean(dn n) per group
    return dy.addcmul_(n, dot, value=-1).mul_(r), dgain


class RMSNormFunction(torch.autograd.Function):
    """``rmsnorm`` with its backward written out (``rms_backward``): autograd's graph of the
    formula was three times LayerNorm's fused kernel on a CPU; this is six passes over x
    instead of about fourteen. In float32 for half-precision inputs, whatever autocast would
    choose; the output's dtype is ``x * weight``'s."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
        with torch.autocast(x.device.type, enabled=False):
            C = x.shape[-1]
            x2 = x.reshape(-1, 1, C).to(compute_dtype(x.dtype))  # (N, 1, C): one group
            r = inverse_rms(x2, eps)  # (N, 1, 1)
            n = x2 * r  # (N, 1, C)
            y = n if weight is None else n * weight
            out_dtype = x.dtype if weight is None else torch.result_type(x, weight)
            ctx.save_for_backward(n, r, weight)
            ctx.x_dtype = x.dtype
            return y.to(out_dtype).view(x.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        n, r, weight = ctx.saved_tensors
        with torch.autocast(grad.device.type, enabled=False):
            g = grad.reshape(n.shape).to(n.dtype, copy=True)  # (N, 1, C), overwritten
            gain = None if weight is None else weight.to(n.dtype).view(1, -1)
            dx, dw = rms_backward(g, n, r, gain)
            if dw is not None:  # weight is not None
                dw = dw.view(-1).to(weight.dtype) if ctx.needs_input_grad[1] else None
            return dx.to(ctx.x_dtype).view(grad.shape), dw, None


class RMSNorm(nn.Module):
    """RMSNorm over the last dimension, with a gain ``weight`` of ones: Hugging Face's
    ``LlamaRMSNorm`` (``eps`` is its ``variance_epsilon``).

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
