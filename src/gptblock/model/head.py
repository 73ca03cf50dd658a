"""The GPT's logits after its unembedding: soft-capped (Gemma 2, modded-nanogpt), or as they are.

``cap * tanh(logits / cap)`` is the identity near zero but bounds every logit, so a few confident
tokens cannot take over the loss early on. (Rejected: clamping, whose zero gradient past the cap
would never let a saturated logit come back.)

Shapes: B batch, T time, V = vocab_size.
"""

from __future__ import annotations

import torch

__all__ = ["soft_cap"]


def soft_cap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    """``cap * tanh(logits / cap)`` (any shape); ``logits`` unchanged when ``cap`` is None.

    Example:
        >>> soft_cap(torch.tensor([0.0, 1.0, 100.0]), 15.0)
        tensor([ 0.0000,  0.9985, 15.0000])
        >>> soft_cap(torch.tensor([100.0]), None)
        tensor([100.])
    """
    if cap is None:
        return logits
    # tanh in the logits' own dtype: under bfloat16 autocast the head's matmul returns bfloat16,
    # and the cross-entropy that follows upcasts to float32 itself.
    return torch.tanh(logits / cap) * cap
