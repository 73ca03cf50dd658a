"""Hook points: the places in a block's forward where ``gptblock.lens`` may look and intervene.

The forward continues with what ``probe.point(name, x)`` returns (without a probe: one ``is
None`` test), so the lens patches the very computation the model runs; a point SDPA never forms
is formed only if ``probe.wants`` it. Not module hooks: they see no point inside a module, a
fused path skips them silently, and an argument leaves nothing registered on the model.
"""

from __future__ import annotations

from typing import Protocol

import torch

__all__ = ["BLOCK_POINTS", "Probe"]

# The points inside each block, in the order the forward pass reaches them (TransformerLens's
# names): the stream entering the block (B, T, C); the post-softmax attention weights
# (B, nh, T, T); each head's write into the stream (B, T, nh, C); the attention branch's output
# (B, T, C); the stream between the branches; the MLP branch's output; the stream leaving.
BLOCK_POINTS = (
    "resid_pre",
    "pattern",
    "head_out",
    "attn_out",
    "resid_mid",
    "mlp_out",
    "resid_post",
)


class Probe(Protocol):
    """What a block's forward calls at its points (``gptblock.lens`` gives one per block)."""

    def wants(self, name: str) -> bool: ...  # whether the point must be formed

    def point(self, name: str, x: torch.Tensor) -> torch.Tensor: ...  # what to continue with
