"""The first lesson's transformer block, piece by piece, exactly as taught.

The classes keep the lesson's signatures, attribute names and arithmetic, so a state_dict saved
from the lesson's code loads here with ``strict=True`` and gives bit-identical outputs. Added,
changing no result: the checks the lesson leaves out (``n_embd`` not divisible by ``n_head``,
``T > block_size``, an input not (B, T, n_embd) raise naming the numbers), and
``attention_weights(x)``, the post-softmax, pre-dropout pattern by ``forward``'s own code: a
method rather than state kept by ``forward``, so it costs nothing unused and cannot go stale.

Shapes: B batch, T time, C = n_embd channels, nh = n_head heads, hs = head_size.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn as nn
from torch.nn import functional as F

from .blocks.config import check_dropout, check_heads, check_input, check_positive_int
from .errors import UserValueError

__all__ = ["Block", "FeedForward", "Head", "MultiHeadAttention"]


class Head(nn.Module):
    """One causal self-attention head (lesson 1, section 1).

    Args:
        n_embd: C, input channels.
        head_size: hs, channels of the query, key and value projections.
        block_size: the longest sequence the causal mask ``tril`` covers.
        dropout: dropout on the attention weights, training mode only.

    Shape:
        Input (B, T, C) with T <= block_size; output (B, T, hs).

    Example:
        >>> head = Head(n_embd=16, head_size=8, block_size=5).eval()
        >>> head(torch.randn(2, 5, 16)).shape
        torch.Size([2, 5, 8])
        >>> head.attention_weights(torch.randn(2, 5, 16)).shape
        torch.Size([2, 5, 5])
    """

    def __init__(self, n_embd: int, head_size: int, block_size: int, dropout: float = 0.2) -> None:
        super().__init__()
        self.n_embd = check_positive_int("n_embd", n_embd)
        check_positive_int("head_size", head_size)
        self.block_size = check_positive_int("block_size", block_size)
        self.key = nn.Linear(n_embd, head_size, bias=False)
        self.query = nn.Linear(n_embd, head_size, bias=False)
        self.value = nn.Linear(n_embd, head_size, bias=False)
        # persistent, as in the lesson, so the lesson's state_dicts load with strict=True
        self.tril: torch.Tensor
        self.register_buffer("tril", torch.tril(torch.ones(block_size, block_size)))
        self.dropout = nn.Dropout(check_dropout(dropout))

    def attention_weights(self, x: torch.Tensor) -> torch.Tensor:
        """Post-softmax attention weights (B, T, T): row t is position t's distribution over keys."""
        B, T, C = check_input(x, self.n_embd, self.block_size, like=self.key.weight)
        k, q = self.key(x), self.query(x)  # (B, T, hs) each
        wei = q @ k.transpose(-2, -1) * k.shape[-1] ** -0.5  # (B, T, hs) @ (B, hs, T) -> (B, T, T)
        wei = wei.masked_fill(self.tril[:T, :T] == 0, float("-inf"))
        return F.softmax(wei, dim=-1)  # (B, T, T)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wei = self.dropout(self.attention_weights(x))  # (B, T, T)
        v = self.value(x)  # (B, T, hs)
        return wei @ v  # (B, T, T) @ (B, T, hs) -> (B, T, hs)


class MultiHeadAttention(nn.Module):
    """``n_head`` heads in parallel, concatenated, then an output projection (lesson 1, section 2).

    Args:
        n_head: nh, number of heads; each has head size n_embd // n_head.
        n_embd: C, channels in and out.
        block_size: the longest sequence supported.
        dropout: dropout on each head's weights and on the projected output, training only.

    Shape:
        Input (B, T, C); output (B, T, C).

    Example:
        >>> mha = MultiHeadAttention(n_head=2, n_embd=16, block_size=5).eval()
        >>> mha(torch.randn(2, 5, 16)).shape
        torch.Size([2, 5, 16])
        >>> mha.attention_weights(torch.randn(2, 5, 16)).shape  # (B, nh, T, T)
        torch.Size([2, 2, 5, 5])
    """

    def __init__(self, n_head: int, n_embd: int, block_size: int, dropout: float = 0.2) -> None:
        super().__init__()
        head_size = check_heads(n_embd, n_head, names=("n_embd", "n_head"))
        self.n_embd = n_embd
        self.block_size = check_positive_int("block_size", block_size)
        self.heads = nn.ModuleList(
            [Head(n_embd, head_size, block_size, dropout) for _ in range(n_head)]
        )
        self.proj = nn.Linear(n_embd, n_embd)
        self.dropout = nn.Dropout(check_dropout(dropout))

    def attention_weights(self, x: torch.Tensor) -> torch.Tensor:
        """Every head's post-softmax weights, stacked: (B, nh, T, T)."""
        heads = [cast(Head, h) for h in self.heads]  # ModuleList forgets the element type
        return torch.stack([h.attention_weights(x) for h in heads], dim=1)  # (B, nh, T, T)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_input(x, self.n_embd, self.block_size, like=self.proj.weight)
        out = torch.cat([h(x) for h in self.heads], dim=-1)  # nh x (B, T, hs) -> (B, T, C)
        return self.dropout(self.proj(out))  # (B, T, C)


class FeedForward(nn.Module):
    """The position-wise MLP: C -> 4C -> ReLU -> C -> dropout (lesson 1, section 2).

    Args:
        n_embd: C, channels in and out.
        dropout: dropout on the output, training mode only.

    Shape:
        Input (..., C); output (..., C).

    Example:
        >>> FeedForward(16)(torch.randn(2, 5, 16)).shape
        torch.Size([2, 5, 16])
    """

    def __init__(self, n_embd: int, dropout: float = 0.2) -> None:
        super().__init__()
        self.n_embd = check_positive_int("n_embd", n_embd)
        self.net = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd),
            nn.ReLU(),
            nn.Linear(4 * n_embd, n_embd),
            nn.Dropout(check_dropout(dropout)),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[-1] != self.n_embd:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise UserValueError(f"expected input of shape (..., {self.n_embd}), got {got}")
        return self.net(x)


class Block(nn.Module):
    """The pre-norm transformer block (lesson 1, section 3): ``x = x + sa(ln1(x))`` then
    ``x = x + ffwd(ln2(x))``.

    Args:
        n_embd: C, width of the residual stream.
        n_head: nh, number of attention heads; must divide n_embd.
        block_size: the longest sequence supported.
        dropout: dropout probability for every dropout in the block, training mode only.

    Shape:
        Input (B, T, C) with T <= block_size; output (B, T, C).

    Example:
        >>> block = Block(n_embd=16, n_head=2, block_size=8).eval()
        >>> block(torch.randn(2, 5, 16)).shape
        torch.Size([2, 5, 16])
        >>> Block(n_embd=16, n_head=3, block_size=8)
        Traceback (most recent call last):
        ...
        gptblock.errors.UserValueError: n_embd=16 is not divisible by n_head=3: each head must get an equal share of the channels
    """

    def __init__(self, n_embd: int, n_head: int, block_size: int, dropout: float = 0.2) -> None:
        super().__init__()
        self.n_embd = n_embd
        self.block_size = block_size
        self.sa = MultiHeadAttention(n_head, n_embd, block_size, dropout)
        self.ffwd = FeedForward(n_embd, dropout)
        self.ln1 = nn.LayerNorm(n_embd)
        self.ln2 = nn.LayerNorm(n_embd)

    def attention_weights(self, x: torch.Tensor) -> torch.Tensor:
        """The attention pattern this block's heads compute for input ``x``: (B, nh, T, T)."""
        check_input(x, self.n_embd, self.block_size, like=self.ln1.weight)
        return self.sa.attention_weights(self.ln1(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_input(x, self.n_embd, self.block_size, like=self.ln1.weight)
        x = x + self.sa(self.ln1(x))  # residual branch 1: attention
        x = x + self.ffwd(self.ln2(x))  # residual branch 2: MLP
        return x
