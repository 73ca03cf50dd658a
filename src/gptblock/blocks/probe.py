"""Hook points: the places in a block's forward where ``gptblock.lens`` may look and intervene.

A block's forward takes an optional ``probe``. Without one (training, generation, every plain
call) each point is the identity and costs one ``is None`` test. With one, the forward hands the
activation at each point to ``probe.point(name, x)`` and continues with what it returns, so the
lens reads and patches the very computation the model runs, not a copy of it. Where a point
exists only on a slower path (the attention ``pattern`` and per-head outputs, which
``F.scaled_dot_product_attention`` never forms), the forward asks ``probe.wants(name)`` first
and keeps the fast path unless the point is wanted.

Why an argument rather than PyTorch's module hooks: a module hook sees a module's input and
output, not the points inside it (``resid_mid``, ``pattern``), and a forward that takes a fused
path skips hooks silently (``nn.TransformerEncoderLayer``'s fast path does). An argument also
leaves nothing registered on the model, even when a hook raises.

Shapes: B batch, T time, C channels, nh heads.
"""

from __future__ import annotations

from typing import Protocol

import torch

__all__ = ["BLOCK_POINTS", "Probe", "at"]

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

    def wants(self, name: str) -> bool:
        """Whether the point ``name`` must be formed (it is read or hooked)."""
        ...

    def point(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """The activation to continue with at point ``name``, given the one computed there."""
        ...


def at(probe: Probe | None, name: str, x: torch.Tensor) -> torch.Tensor:
    """``x`` through the point ``name`` of ``probe``; ``x`` itself without a probe."""
    return x if probe is None else probe.point(name, x)
