"""The second lesson's block: pre-norm, on PyTorch's own ``nn.MultiheadAttention``.

Its parts are named as ``nn.TransformerEncoderLayer``'s, dropouts included, so the two load
each other's state_dicts with ``strict=True`` and compute the same function.

Shapes: B batch, T time, C = d_model channels, nh = n_heads heads, hs = C // nh.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import torch
import torch.nn as nn
from torch import Tensor
from torch.nn import functional as F

from ..errors import UserValueError
from .attention import PACKED, pattern
from .config import BlockConfig, activation_function, check_input
from .masks import blocked_positions, causal_mask, split_dead_rows

__all__ = ["BlockForm", "TransformerBlock"]

Form = TypeVar("Form", bound="BlockForm")


class BlockForm(nn.Module):
    """What ``TransformerBlock`` and ``FusedBlock`` share: the constructor, whose arguments
    become a ``BlockConfig`` (so the forms validate alike) that ``build`` makes the modules of,
    and ``attention_weights``."""

    norm1: nn.Module
    linear1: nn.Linear

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        dropout: float = 0.0,
        activation: str = "gelu",
        bias: bool = True,
        norm_eps: float = 1e-5,
        **modern: Any,
    ) -> None:
        super().__init__()
        self.config = BlockConfig.of(
            d_model, n_heads, dropout=dropout, activation=activation, bias=bias, norm_eps=norm_eps,
            **modern,
        )  # fmt: skip
        self.build(self.config)

    def build(self, config: BlockConfig) -> None:
        raise NotImplementedError

    def qk(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """The queries and keys (B, nh, T, hs) of the normalised stream ``h``."""
        raise NotImplementedError

    @classmethod
    def from_config(cls: type[Form], config: BlockConfig) -> Form:
        """A fresh block of ``config``."""
        options = dataclasses.asdict(config)
        return cls(options.pop("d_model"), options.pop("n_head"), **options)

    def attention_weights(
        self, x: Tensor, attn_mask: Tensor | None = None, key_padding_mask: Tensor | None = None
    ) -> Tensor:
        """Post-softmax, pre-dropout attention weights for input ``x``: (B, nh, T, T), fully
        blocked rows zero; apart from ``forward``, so that tests can hold one to the other."""
        B, T, C = check_input(x, self.config.d_model, like=self.linear1.weight)
        q, k = self.qk(self.norm1(x))
        return pattern(q, k, blocked_positions(B, T, attn_mask, key_padding_mask, x.device))


class TransformerBlock(BlockForm):
    """The pre-norm GPT block built on ``nn.MultiheadAttention(batch_first=True)``.

    ``x = x + attn(norm1(x))`` then ``x = x + mlp(norm2(x))``, the MLP ``linear1 -> activation
    -> linear2`` 4 * d_model wide. Masks (bool, ``True`` = blocked) block more than the causal
    mask; a query row left with no key gets zero attention weights, not NaN.

    Args:
        d_model, n_heads: C, the width of the residual stream, and nh, its heads (dividing C).
        dropout, activation, bias, norm_eps: as ``BlockConfig``'s (its fields' help); the
            modern options (``**modern``) are refused by name (``FusedBlock`` has them).

    Shape:
        Input (B, T, C); output (B, T, C). Optional ``attn_mask`` bool (T, T) or (B, T, T);
        optional ``key_padding_mask`` bool (B, T).

    Example:
        >>> block = TransformerBlock(16, 2).eval()
        >>> x = torch.randn(2, 5, 16)
        >>> block(x).shape
        torch.Size([2, 5, 16])
        >>> layer = nn.TransformerEncoderLayer(16, 2, 64, dropout=0.0, activation="gelu",
        ...                                    batch_first=True, norm_first=True).eval()
        >>> layer.load_state_dict(block.state_dict())
        <All keys matched successfully>
        >>> torch.allclose(layer(x, src_mask=causal_mask(5), is_causal=True), block(x), atol=1e-5)
        True
    """

    def build(self, config: BlockConfig) -> None:
        if config.modern:  # nn.MultiheadAttention has GPT-2's attention, and LayerNorms
            name = config.modern[0]
            raise UserValueError(
                f"TransformerBlock (nn.MultiheadAttention) cannot express "
                f"{name}={getattr(config, name)!r}; FusedBlock has the modern block's options"
            )
        d_model, d_ff, dropout, bias = config.d_model, config.d_ff, config.dropout, config.bias
        norm_eps = config.norm_eps
        self.norm1 = nn.LayerNorm(d_model, eps=norm_eps, bias=bias)
        self.self_attn = nn.MultiheadAttention(
            d_model, config.n_head, dropout=dropout, bias=bias, batch_first=True
        )
        self.dropout1 = nn.Dropout(dropout)
        self.norm2 = nn.LayerNorm(d_model, eps=norm_eps, bias=bias)
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout2 = nn.Dropout(dropout)

    def forward(
        self, x: Tensor, attn_mask: Tensor | None = None, key_padding_mask: Tensor | None = None
    ) -> Tensor:
        check_input(x, self.config.d_model, like=self.linear1.weight)
        x = x + self.dropout1(self._attend(self.norm1(x), attn_mask, key_padding_mask))
        act = activation_function(self.config.activation)
        h = self.linear2(self.dropout(act(self.linear1(self.norm2(x)))))  # via (B, T, 4C)
        return x + self.dropout2(h)

    def _attend(
        self, h: Tensor, attn_mask: Tensor | None, key_padding_mask: Tensor | None
    ) -> Tensor:
        B, T, C = h.shape
        if attn_mask is None and key_padding_mask is None:
            mask = causal_mask(T, device=h.device)  # (T, T)
            a, _ = self.self_attn(h, h, h, attn_mask=mask, need_weights=False, is_causal=True)
            return a
        blocked = blocked_positions(B, T, attn_mask, key_padding_mask, h.device)  # (B, T, T)
        # nn.MultiheadAttention softmaxes an all -inf row into NaN. Attend with the dead rows
        # (no key left) unblocked, so the softmax stays finite, then replace their output by what
        # zero attention weights give (out_proj applied to a zero context: its bias). torch.where
        # routes no gradient through the replaced rows, so no NaN reaches the backward pass.
        live, dead = split_dead_rows(blocked)  # (B, T, T), (B, T)
        mask = live.repeat_interleave(self.config.n_head, dim=0)  # (B * nh, T, T)
        a, _ = self.self_attn(h, h, h, attn_mask=mask, need_weights=False)
        bias = self.self_attn.out_proj.bias
        empty = bias if bias is not None else torch.zeros((), dtype=a.dtype, device=a.device)
        return torch.where(dead[:, :, None], empty, a)  # (B, T, C)

    def qk(self, h: Tensor) -> tuple[Tensor, Tensor]:
        qkv = F.linear(h, self.self_attn.in_proj_weight, self.self_attn.in_proj_bias)  # (B, T, 3C)
        q, k, _ = PACKED(qkv, self.config.n_head, 0, None)
        return q, k
