"""A block's parts as callables: the block's own modules, or functions of given weights.

``fused.block_forward`` is written against parts, so that it runs on a ``FusedBlock``'s modules,
on another form's weights read without copying (the lens's pass over a lesson block, its
gradients reaching that block) and on generation's one-position weight layouts.

Shapes: B batch, T time, I in-features, O out-features, C channels.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, Protocol

import torch
from torch.nn import functional as F

__all__ = ["MLP", "Dense", "DenseMLP", "GatedMLP", "LayerNormFn", "Linear", "Norm"]


class Norm(Protocol):
    """A normalisation over the last dimension: ``nn.LayerNorm`` or ``LayerNormFn``."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...  # (..., C) -> (..., C)


class Linear(Protocol):
    """A linear map with ``nn.Linear``'s weight (O, I) and bias (O,) or None (``head_out`` reads
    them): ``nn.Linear``, ``Dense`` or generation's ``RowLinear``."""

    @property
    def weight(self) -> torch.Tensor: ...

    @property
    def bias(self) -> torch.Tensor | None: ...

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


class Dense(NamedTuple):
    """``F.linear`` with given weights: a ``Linear`` that is not a module.

    Example:
        >>> w, b, x = torch.randn(3, 2), torch.randn(3), torch.randn(4, 2)
        >>> torch.equal(Dense(w, b)(x), F.linear(x, w, b))
        True
    """

    weight: torch.Tensor  # (O, I)
    bias: torch.Tensor | None  # (O,)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)  # (..., I) -> (..., O)


class LayerNormFn(NamedTuple):
    """``F.layer_norm`` over the last dimension with given weights: a ``Norm``.

    Example:
        >>> norm, x = torch.nn.LayerNorm(4), torch.randn(2, 4)
        >>> torch.equal(LayerNormFn(norm.weight, norm.bias, norm.eps)(x), norm(x))
        True
    """

    weight: torch.Tensor  # (C,)
    bias: torch.Tensor | None  # (C,)
    eps: float

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # torch.layer_norm, not F.layer_norm: the same kernel (tensor subclasses are still
        # dispatched), one Python frame less per call in generation's per-token loop.
        return torch.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)  # (..., C)


class MLP(Protocol):
    """The MLP branch, with dropout ``p`` on its hidden layer: ``DenseMLP`` or ``GatedMLP``."""

    def __call__(self, h: torch.Tensor, p: float) -> torch.Tensor: ...  # (B, T, C) -> (B, T, C)

    def relaid(self, linear: Callable[[Linear], Linear]) -> MLP: ...  # each map as linear(it)


def dropped(u: torch.Tensor, p: float) -> torch.Tensor:
    # Only where there is some: outside training a call into PyTorch costs a generation step
    # more than the whole arithmetic of some of its lines.
    return F.dropout(u, p) if p else u


class DenseMLP(NamedTuple):
    """GPT-2's MLP: ``linear2(act(linear1 h))``.

    Example:
        >>> mlp = DenseMLP(Dense(torch.eye(2), None), Dense(2 * torch.eye(2), None), F.relu)
        >>> mlp(torch.tensor([[-1.0, 3.0]]), 0.0)
        tensor([[0., 6.]])
    """

    linear1: Linear  # C -> d_ff
    linear2: Linear  # d_ff -> C
    act: Callable[[torch.Tensor], torch.Tensor]

    def __call__(self, h: torch.Tensor, p: float) -> torch.Tensor:
        return self.linear2(dropped(self.act(self.linear1(h)), p))  # (B, T, d_ff) -> (B, T, C)

    def relaid(self, linear: Callable[[Linear], Linear]) -> DenseMLP:
        return DenseMLP(linear(self.linear1), linear(self.linear2), self.act)


class GatedMLP(NamedTuple):
    """Llama's SwiGLU: ``linear2(silu(linear1 h) * linear3 h)``, ``linear1`` the gate."""

    linear1: Linear  # C -> d_ff, the gate
    linear3: Linear  # C -> d_ff, the linear branch
    linear2: Linear  # d_ff -> C

    def __call__(self, h: torch.Tensor, p: float) -> torch.Tensor:
        u = F.silu(self.linear1(h)) * self.linear3(h)  # (B, T, d_ff)
        return self.linear2(dropped(u, p))  # (B, T, C)

    def relaid(self, linear: Callable[[Linear], Linear]) -> GatedMLP:
        return GatedMLP(linear(self.linear1), linear(self.linear3), linear(self.linear2))
