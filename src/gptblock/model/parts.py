"""The GPT's parts as callables, what ``GPT._run`` runs: modules, or functions of the weights.

Shapes: B batch, T time, C = n_embd, V = vocab_size.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

import torch
import torch.nn as nn

from ..blocks.parts import Linear, Norm

__all__ = ["BlockFn", "EmbeddedPositions", "GPTParts", "Positions"]

BlockFn = Callable[..., torch.Tensor]  # block(x), or block(x, kv_cache=..., probe=...)


class Positions(Protocol):
    """The position embeddings of ``positions`` ((T,) or (B, T)): (T, C) or (B, T, C); when
    None, of positions ``start .. start + T``: (T, C)."""

    def __call__(
        self, start: int, T: int, positions: torch.Tensor | None = None
    ) -> torch.Tensor: ...


class GPTParts(NamedTuple):
    """A GPT's parts, for ``GPT._run``."""

    wte: Callable[[torch.Tensor], torch.Tensor]  # token embedding: ids (B, T) -> (B, T, C)
    wpe: Positions | None  # learned position embeddings; None: rotary or none
    blocks: Sequence[BlockFn]  # (B, T, C) -> (B, T, C) each
    ln_f: Norm  # the final norm
    lm_head: Linear  # C -> V
    # The bigram embedding and smear (embeddings.InputMix): inputs(idx, wte, before) -> (B, T, C)
    # in wte's place; None: neither.
    inputs: Callable[..., torch.Tensor] | None = None


class EmbeddedPositions(NamedTuple):
    """A position embedding module as ``GPTParts.wpe``: called on the positions' indices, so
    the module's own hooks fire (``GPT.forward``; generation slices the weight instead)."""

    wpe: nn.Embedding  # (block_size, C)

    def __call__(self, start: int, T: int, positions: torch.Tensor | None = None) -> torch.Tensor:
        if positions is None:
            positions = torch.arange(start, start + T, device=self.wpe.weight.device)  # (T,)
        return self.wpe(positions)  # (T, C) or (B, T, C)
