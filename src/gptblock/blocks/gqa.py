"""Attention with grouped key/value heads and rotary positions, alone: Llama's attention.

``attention`` is the function (given queries, keys and values); ``GroupedQueryAttention`` the
module, with Hugging Face's Llama names (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``), so a
course's own weights load into it. The block (``FusedBlock`` with ``n_kv_heads`` / ``rope``)
computes the same function with the projections packed (``self_attention``); a test holds the
two together.

Shapes: B batch, T query positions, L key positions, C channels, nh query heads, nkv key/value
heads (dividing nh), hs head size.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..errors import UserValueError
from .aliases import accept_aliases
from .attention import repeat_kv
from .checks import check_heads, check_positive_int
from .masks import masked_softmax
from .norms import RMSNorm
from .rotary import Rotary

__all__ = ["META_NAMES", "GroupedQueryAttention", "attention"]

META_NAMES = {"wq": "q_proj", "wk": "k_proj", "wv": "v_proj", "wo": "o_proj"}  # Meta's -> HF's


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    causal: bool = True,
) -> torch.Tensor:
    """``softmax(q k^T / sqrt(hs)) v`` with key/value head j // (nh / nkv) serving query head j.

    Args:
        q: queries, the last T of the L positions.
        k, v: keys and values of all L positions.
        mask: optional bool, ``True`` = blocked, broadcast over (B, nh, T, L).
        causal: also block keys after each query's position.

    Shape:
        q (B, nh, T, hs), k and v (B, nkv, L, hs) -> (B, nh, T, hs). A query row with every
        key blocked gets zeros.

    Example:
        >>> q, k, v = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8)
        >>> attention(q, k, v).shape
        torch.Size([1, 4, 3, 8])
    """
    nh, nkv, T, L = q.shape[1], k.shape[1], q.shape[-2], k.shape[-2]
    if nh % nkv or k.shape != v.shape or L < T:
        raise UserValueError(
            f"expected q (B, nh, T, hs) and k, v (B, nkv, L, hs) with nkv dividing nh and "
            f"L >= T, got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    k, v = repeat_kv(k, nh // nkv), repeat_kv(v, nh // nkv)  # (B, nh, L, hs) each
    scores = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5  # (B, nh, T, L)
    blocked = torch.zeros(T, L, dtype=torch.bool, device=q.device)  # (T, L)
    if causal:  # query i sits at position L - T + i
        rows = torch.arange(L - T, L, device=q.device)[:, None]  # (T, 1)
        blocked = torch.arange(L, device=q.device)[None, :] > rows  # (T, L)
    if mask is not None:
        blocked = blocked | mask.to(torch.bool)
    blocked = blocked.expand(*scores.shape[:-2], T, L)  # (B, nh, T, L)
    # masked_softmax's mask is one per batch row, shared by the heads: flatten heads into it.
    B, H = scores.shape[0], scores.shape[1]
    weights = masked_softmax(scores.reshape(B * H, 1, T, L), blocked.reshape(B * H, T, L)).view(
        B, H, T, L
    )
    return weights @ v  # (B, nh, T, L) @ (B, nh, L, hs) -> (B, nh, T, hs)


class GroupedQueryAttention(nn.Module):
    """Causal self-attention with ``n_kv_heads`` key/value heads, rotary positions and an
    optional RMSNorm on queries and keys, named as Hugging Face's ``LlamaAttention``; a
    state_dict in Meta's names (``wq``, ``wk``, ``wv``, ``wo``) loads too (Meta's checkpoints
    rotate adjacent pairs: ``rope_pairing="adjacent"``).

    Args:
        d_model: C.
        n_heads: nh, query heads.
        n_kv_heads: nkv, key/value heads (dividing nh); None: nh. 1 is multi-query attention.
        bias: biases on the four projections (Llama has none; Qwen2 on q, k, v only).
        rope: rotate queries and keys by their positions.
        rotary_dim, rope_theta, rope_pairing: as ``Rotary``'s.
        qk_norm: ``q_norm`` and ``k_norm`` (``RMSNorm(hs)``), as Qwen 3 and OLMo 2.
        norm_eps: their epsilon.

    Shape:
        x (B, T, C), optional positions (T,) or (B, T) (default 0 .. T-1), optional mask bool
        ``True`` = blocked, broadcast over (B, nh, T, T) -> (B, T, C).

    Example:
        >>> attn = GroupedQueryAttention(16, 4, 2)
        >>> sorted(attn.state_dict())
        ['k_proj.weight', 'o_proj.weight', 'q_proj.weight', 'v_proj.weight']
        >>> attn.k_proj.weight.shape  # nkv * hs rows
        torch.Size([8, 16])
        >>> attn(torch.randn(2, 5, 16)).shape
        torch.Size([2, 5, 16])
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        *,
        bias: bool = False,
        rope: bool = True,
        rotary_dim: int | None = None,
        rope_theta: float = 10000.0,
        rope_pairing: str = "halves",
        qk_norm: bool = False,
        norm_eps: float = 1e-6,
    ) -> None:
        super().__init__()
        hs = check_heads(d_model, n_heads)
        nkv = n_heads if n_kv_heads is None else check_positive_int("n_kv_heads", n_kv_heads)
        if n_heads % nkv:
            raise UserValueError(f"n_kv_heads={nkv} does not divide n_heads={n_heads}")
        self.n_heads, self.n_kv_heads, self.head_size = n_heads, nkv, hs
        self.q_proj = nn.Linear(d_model, n_heads * hs, bias=bias)
        self.k_proj = nn.Linear(d_model, nkv * hs, bias=bias)
        self.v_proj = nn.Linear(d_model, nkv * hs, bias=bias)
        self.o_proj = nn.Linear(n_heads * hs, d_model, bias=bias)
        self.rotary = Rotary(hs, rotary_dim, rope_theta, rope_pairing) if rope else None
        self.q_norm = RMSNorm(hs, norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(hs, norm_eps) if qk_norm else None
        accept_aliases(self, META_NAMES)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        B, T, _ = x.shape
        nh, nkv, hs = self.n_heads, self.n_kv_heads, self.head_size
        q = self.q_proj(x).view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = self.k_proj(x).view(B, T, nkv, hs).transpose(1, 2)  # (B, nkv, T, hs)
        v = self.v_proj(x).view(B, T, nkv, hs).transpose(1, 2)  # (B, nkv, T, hs)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rotary is not None:
            pos = torch.arange(T, device=x.device) if positions is None else positions
            q, k = self.rotary(q, pos), self.rotary(k, pos)
        y = attention(q, k, v, mask)  # (B, nh, T, hs)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, nh * hs))  # (B, T, C)
