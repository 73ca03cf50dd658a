"""The gated MLP, SwiGLU (Shazeer 2020): ``w2(silu(w1 x) * w3 x)``, as a function and a module.

Llama's three F x C matrices (C channels, F = d_ff ~ 8C/3) cost what GPT-2's two 4C x C do.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .aliases import rename_state
from .config import check_positive_int
from .parts import Dense, GatedMLP

__all__ = ["META_NAMES", "SwiGLU", "swiglu"]

META_NAMES = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}  # Meta's Llama -> HF's


def swiglu(
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    w3: torch.Tensor,
    b1: torch.Tensor | None = None,
    b2: torch.Tensor | None = None,
    b3: torch.Tensor | None = None,
) -> torch.Tensor:
    """``w2(silu(w1 x) * w3 x)`` of x (..., C) -> (..., C), with ``nn.Linear``'s weight layout:
    the gate ``w1`` (F, C) (Hugging Face's ``gate_proj``), the output ``w2`` (C, F)
    (``down_proj``), the linear branch ``w3`` (F, C) (``up_proj``), optional biases.

    Example:
        >>> x, w1, w3, w2 = torch.randn(2, 4), torch.randn(6, 4), torch.randn(6, 4), torch.randn(4, 6)
        >>> torch.allclose(swiglu(x, w1, w2, w3), (nn.functional.silu(x @ w1.T) * (x @ w3.T)) @ w2.T, atol=1e-6)
        True
    """
    return GatedMLP(Dense(w1, b1), Dense(w3, b3), Dense(w2, b2))(x, 0.0)  # (..., C)


class SwiGLU(nn.Module):
    """The SwiGLU MLP with Hugging Face's Llama names: ``gate_proj``, ``up_proj``, ``down_proj``;
    a state_dict in Meta's Llama names (``w1`` the gate, ``w3`` up, ``w2`` down) loads too.

    Args:
        d_model: C.
        d_ff: F, the hidden size.
        bias: biases on the three projections (Llama has none).

    Shape:
        (..., C) -> (..., C).

    Example:
        >>> mlp = SwiGLU(8, 12)
        >>> sorted(mlp.state_dict())
        ['down_proj.weight', 'gate_proj.weight', 'up_proj.weight']
        >>> x = torch.randn(2, 3, 8)
        >>> torch.equal(mlp(x), swiglu(x, mlp.gate_proj.weight, mlp.down_proj.weight, mlp.up_proj.weight))
        True
        >>> meta = {"w1.weight": torch.randn(12, 8), "w2.weight": torch.randn(8, 12),
        ...         "w3.weight": torch.randn(12, 8)}
        >>> mlp.load_state_dict(meta)
        <All keys matched successfully>
        >>> torch.equal(mlp(x), swiglu(x, meta["w1.weight"], meta["w2.weight"], meta["w3.weight"]))
        True
    """

    def __init__(self, d_model: int, d_ff: int, *, bias: bool = False) -> None:
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("d_ff", d_ff)
        self.gate_proj = nn.Linear(d_model, d_ff, bias=bias)  # w1
        self.up_proj = nn.Linear(d_model, d_ff, bias=bias)  # w3
        self.down_proj = nn.Linear(d_ff, d_model, bias=bias)  # w2
        rename_state(self, {}, META_NAMES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return GatedMLP(self.gate_proj, self.up_proj, self.down_proj)(x, 0.0)  # (..., C)
