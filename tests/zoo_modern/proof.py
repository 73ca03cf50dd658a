"""The proof that a modern zoo block computes the modern oracle with its weights.

``max_error(spec, block)`` runs ``gptblock.reference.modern.modern_forward`` with
``ModernOptions(**spec.REFERENCE)`` and the arrays ``spec.weights(block)`` names in the oracle's
layout, and the block itself, on one float64 input; the tests require the difference to be
rounding (``spec.TOLERANCE``, 1e-10 unless the style computes in float32 on purpose).

Shapes: B batch, T time, C channels.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

from gptblock.reference.modern import ModernOptions, modern_forward


def max_error(spec, block: nn.Module, B: int = 2, T: int = 5, seed: int = 1) -> float:
    """The largest difference between ``block`` and the oracle with its weights, relative to the
    largest entry of the oracle's output."""
    params = {k: v.detach().double().numpy() for k, v in spec.weights(block).items()}
    C = params["self_attn.out_proj.weight"].shape[0]
    x = torch.randn(B, T, C, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    want, _ = modern_forward(params, x.numpy(), ModernOptions(**spec.REFERENCE))
    with torch.no_grad():
        y = block(x.clone()).numpy()
    return float(np.abs(y - want).max() / np.abs(want).max())
