"""The input side beyond the token embedding, two of modded-nanogpt's ideas (issue 22):

- ``bigram``: an embedding of the pair (previous token, token), added to the token's. The id V
  stands for the previous token of the input's first position (a reserved row, so "ll" and a
  window starting at "l" stay apart). Over ``BIGRAM_CAP`` pairs (BPE) the pairs are hashed.
- ``smear``: ``x[:, 1:] += scale * sigmoid(x[:, 1:, :k] @ gate) * x[:, :-1]``.

Both read only the tokens, before the position embedding, and start at zero (a model with them
starts as the model without); the embedding at t reads ``LOOKBACK`` tokens before it.

Shapes: B batch, T time, C = n_embd, V = vocab_size, k before-tokens.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn

from ..errors import UserValueError

__all__ = ["BIGRAM_CAP", "LOOKBACK", "SMEAR_CHANNELS", "InputMix", "Smear", "bigram_index"]
__all__ += ["bigram_rows", "refuse_inputs"]

BIGRAM_CAP = 2**16  # the most rows of a bigram table; more pairs than this are hashed
SMEAR_CHANNELS = 12  # the channels of the embedding that choose the smear's gate
LOOKBACK = 2  # tokens before a position that its embedding reads (bigram, then smear)


def bigram_rows(V: int) -> int:
    """Rows of the bigram table for V tokens: ``(V + 1) * V`` pairs, at most ``BIGRAM_CAP``.

    Example:
        >>> bigram_rows(65), bigram_rows(50257)
        (4290, 65536)
    """
    return min((V + 1) * V, BIGRAM_CAP)


def bigram_index(prev: torch.Tensor, cur: torch.Tensor, V: int) -> torch.Tensor:
    """The bigram table's row of each pair: ``prev * V + cur`` while every pair has a row; else
    modded-nanogpt's hash, whose odd multipliers spread neighbouring ids over the table (a plain
    modulo would collide whole runs of one previous token's pairs). ``prev`` V: none.

    Example:
        >>> bigram_index(torch.tensor([65, 0]), torch.tensor([3, 3]), 65).tolist()
        [4228, 3]
    """
    rows = bigram_rows(V)
    if rows == (V + 1) * V:
        return prev * V + cur
    return torch.bitwise_xor(36313 * cur, 27191 * prev) % rows


def refuse_inputs(config: object, where: str) -> None:
    """Refuse a model with a bigram embedding or a smear, for a format without them.

    Example:
        >>> from gptblock import GPTConfig
        >>> refuse_inputs(GPTConfig(13, 8, 1, 2, 16, smear=True), "GPT-2's format")
        Traceback (most recent call last):
        ...
        gptblock.errors.UserValueError: GPT-2's format cannot express smear=True; save the model as a gptblock checkpoint
    """
    for name in ("bigram", "smear"):
        if getattr(config, name, False):
            raise UserValueError(
                f"{where} cannot express {name}=True; save the model as a gptblock checkpoint"
            )


class Smear(nn.Module):
    """A gated part of each position's input added to the next position's.

    Args:
        C: channels.

    Shape:
        (B, T, C) -> (B, T, C); the first position is unchanged.

    Example:
        >>> smear = Smear(16)
        >>> x = torch.randn(2, 5, 16)
        >>> bool(torch.equal(smear(x), x))  # zero scale: the identity
        True
    """

    def __init__(self, C: int) -> None:
        super().__init__()
        self.gate = nn.Parameter(torch.zeros(min(SMEAR_CHANNELS, C)))  # (k,)
        self.scale = nn.Parameter(torch.zeros(()))  # the learned fraction, before the gate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.gate.shape[0]
        gate = torch.sigmoid(x[:, 1:, :k] @ self.gate.to(x.dtype))  # (B, T-1, k) @ (k,) -> (B, T-1)
        smeared = x[:, 1:] + self.scale.to(x.dtype) * gate.unsqueeze(-1) * x[:, :-1]  # (B, T-1, C)
        return torch.cat([x[:, :1], smeared], dim=1)  # (B, T, C)


class InputMix(nn.Module):
    """The token embedding with the bigram embedding and/or the smear (``GPTParts.inputs``).

    Args:
        V, C: vocab_size, n_embd.
        bigram, smear: add the (previous token, token) pair's embedding; smear each position's
            embedding into the next.

    Shape:
        ``forward(idx, wte, before)``: ids (B, T), the token embedding ``wte`` (ids -> (B, T, C)),
        ``before`` (B, k) the ids that precede ``idx`` in the model's input (k <= ``LOOKBACK``;
        None or k = 0: ``idx`` starts the input) -> (B, T, C).

    Example:
        >>> mix = InputMix(11, 16, bigram=True, smear=True)
        >>> wte = nn.Embedding(11, 16)
        >>> idx = torch.randint(0, 11, (2, 5))
        >>> whole = mix(idx, wte)
        >>> bool(torch.equal(mix(idx[:, 4:], wte, before=idx[:, 2:4]), whole[:, 4:]))
        True
    """

    def __init__(self, V: int, C: int, *, bigram: bool, smear: bool) -> None:
        super().__init__()
        self.V = V
        self.bigram = nn.Embedding(bigram_rows(V), C) if bigram else None
        self.smear = Smear(C) if smear else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Zero every parameter: the model starts as the model without these parts."""
        for p in self.parameters():
            nn.init.zeros_(p)

    def forward(
        self,
        idx: torch.Tensor,
        wte: Callable[[torch.Tensor], torch.Tensor],
        before: torch.Tensor | None = None,
    ) -> torch.Tensor:
        k = 0 if before is None else before.shape[1]
        ids = idx if before is None or k == 0 else torch.cat([before, idx], dim=1)  # (B, k+T)
        x = wte(ids)  # (B, k+T, C)
        if self.bigram is not None:
            # The first id's previous one is not in the input: the id V. With k = LOOKBACK
            # ids before idx, the first one's embedding is wrong but only read by the dropped
            # positions' smear, never by idx's.
            none = torch.full_like(ids[:, :1], self.V)  # (B, 1)
            prev = torch.cat([none, ids[:, :-1]], dim=1)  # (B, k+T)
            x = x + self.bigram(bigram_index(prev, ids, self.V))  # (B, k+T, C)
        if self.smear is not None:
            x = self.smear(x)
        return x[:, k:]  # (B, T, C)
