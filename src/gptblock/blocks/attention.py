"""Causal self-attention from a packed q/k/v projection, once: every path of the fused form.

``SelfAttention`` is ``FusedBlock``'s attention: training (SDPA, or ``causal_attention``'s
products), masks, a KV cache with the new queries at positions ``start ..``, and the lens's
points (formed only when a probe wants them). Its heads part is GPT-2's (``PACKED``) or the
modern block's (``ModernHeads``). ``attention`` is the same function on given q, k, v.

Shapes: B batch, T time (new positions), L = start + T keys, C channels, nh heads, nkv key/value
heads, hs = C // nh.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch
from torch import Tensor
from torch.nn import functional as F

from ..errors import UserValueError
from .masks import blocked_positions, causal_mask, masked_softmax, split_dead_rows
from .parts import Linear
from .probe import Probe
from .qk_heads import ModernHeads, repeat_kv


class PackedHeads:
    """GPT-2's heads part: q, k and v (B, nh, T, hs) in thirds of the projection (B, T, 3C);
    ``share`` gives the keys and values (cached ones included) to the nh query heads."""

    def __call__(
        self, qkv: Tensor, nh: int, start: int, positions: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        B, T, C3 = qkv.shape
        hs = C3 // (3 * nh)
        if T == 1:  # a generation step: (B, 1, 3, nh, hs) is (B, 3, nh, 1, hs) in memory
            q, k, v = qkv.view(B, 3, nh, 1, hs).unbind(1)  # 3 x (B, nh, 1, hs), no transpose
            return q, k, v
        # Views, no copy. Unbinding dim 2 before transposing (rather than permuting the 3 to the
        # front and unbinding dim 0: the same views) lets the backward stack the three gradients
        # straight into the (B, T, 3, nh, hs) layout, saving a (B, T, 3C) copy.
        q, k, v = (t.transpose(1, 2) for t in qkv.view(B, T, 3, nh, hs).unbind(2))
        return q, k, v  # (B, nh, T, hs) each

    def share(self, k: Tensor, v: Tensor, nh: int) -> tuple[Tensor, ...]:
        return k, v


PACKED = PackedHeads()


def attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, *, causal: bool = True
) -> Tensor:
    """``softmax(q k^T / sqrt(hs)) v`` with key/value head j // (nh / nkv) serving query head j:
    q (B, nh, T, hs), the last T of the L positions, k and v (B, nkv, L, hs) -> (B, nh, T, hs).
    ``mask`` (bool, ``True`` = blocked, broadcast over (B, nh, T, L)) blocks more than the
    causal mask (none without ``causal``); a query row with every key blocked gets zeros.

    Example:
        >>> q, k, v = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8)
        >>> attention(q, k, v).shape
        torch.Size([1, 4, 3, 8])
    """
    (B, nh, T, hs), nkv, L = q.shape, k.shape[1], k.shape[-2]
    if nh % nkv or k.shape != v.shape or L < T:
        raise UserValueError(
            f"expected q (B, nh, T, hs) and k, v (B, nkv, L, hs) with nkv dividing nh and "
            f"L >= T, got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    k, v = repeat_kv(k, nh // nkv), repeat_kv(v, nh // nkv)  # (B, nh, L, hs) each
    # Query i sits at position L - T + i: with ``causal`` it may attend to keys <= it.
    blocked = ~_allowed(L - T, T, q) if causal else torch.zeros(T, L, dtype=torch.bool)
    if mask is not None:
        blocked = blocked.to(q.device) | mask.to(torch.bool)
    blocked = blocked.to(q.device).expand(B, nh, T, L).reshape(B * nh, T, L)  # one per head
    weights = pattern(q.reshape(B * nh, 1, T, hs), k.reshape(B * nh, 1, L, hs), blocked)
    return weights.view(B, nh, T, L) @ v  # (B, nh, T, L) @ (B, nh, L, hs) -> (B, nh, T, hs)


def pattern(q: Tensor, k: Tensor, blocked: Tensor) -> Tensor:
    """``softmax(q k^T / sqrt(hs))`` over the keys not ``blocked`` (B, T, L), one mask for
    every head (``masked_softmax``): q (B, nh, T, hs), k (B, nh, L, hs) -> (B, nh, T, L)."""
    scores = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5  # (B, nh, T, L)
    return masked_softmax(scores, blocked)


class KVStore(Protocol):
    """Where a block keeps the keys and values of earlier positions: ``gptblock.KVCache``."""

    @property
    def length(self) -> int: ...  # positions stored so far: the position of the next query

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store (B, nh, T, hs) keys and values; return all of them so far, (B, nh, L, hs)."""


class SelfAttention(NamedTuple):
    """Causal self-attention on given projections: ``FusedSelfAttention``'s call, not a module.

    Example:
        >>> from gptblock.blocks.parts import Dense
        >>> attn = SelfAttention(Dense(torch.randn(12, 4), None), Dense(torch.randn(4, 4), None), 2)
        >>> attn(torch.randn(1, 3, 4)).shape
        torch.Size([1, 3, 4])
    """

    in_proj: Linear  # C -> 3C: q; k; v packed row-wise
    out_proj: Linear  # C -> C
    n_heads: int  # nh
    heads: PackedHeads | ModernHeads = PACKED  # how the projection becomes q, k, v

    def __call__(
        self,
        h: Tensor,
        attn_mask: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        kv_cache: KVStore | None = None,
        *,
        dropout: float | None = None,
        probe: Probe | None = None,
        positions: Tensor | None = None,
    ) -> Tensor:
        """Causal self-attention of the normalised stream ``h`` (B, T, C), after ``kv_cache``'s
        positions. ``positions`` only rotate: which key a query may attend to follows the keys'
        order. The rest is ``FusedBlock.forward``'s; ``dropout`` is on the attention weights."""
        p = dropout or 0.0
        nh, (B, T, C) = self.n_heads, h.shape
        start = 0 if kv_cache is None else kv_cache.length
        q, k, v = self.heads(self.in_proj(h), nh, start, positions)  # (B, nh | nkv, T, hs)
        if kv_cache is not None:
            k, v = kv_cache.append(k, v)  # (B, nkv, L, hs) each
        k, v = self.heads.share(k, v, nh)  # (B, nh, L, hs) each
        if probe is not None and (probe.wants("pattern") or probe.wants("head_out")):
            return _formed(q, k, v, self.out_proj, start, attn_mask, key_padding_mask, p, probe)
        if attn_mask is None and key_padding_mask is None:
            y = _causal(q, k, v, start, p)
        else:
            blocked = blocked_positions(B, T, attn_mask, key_padding_mask, h.device)  # (B, T, T)
            # Rows with no key left: attend with them unblocked so no backend can produce NaN,
            # then zero their output, which is what zero attention weights give.
            live, dead = split_dead_rows(blocked)  # (B, T, T), (B, T)
            allowed = ~live[:, None]  # (B, 1, T, T), SDPA's convention: True = may attend
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=p)
            y = y.masked_fill(dead[:, None, :, None], 0.0)  # (B, nh, T, hs)
        if T > 1:  # at one position (B, nh, 1, hs) is (B, 1, nh, hs) in memory already
            y = y.transpose(1, 2)  # (B, T, nh, hs)
        return self.out_proj(y.reshape(B, T, C))  # (B, T, nh, hs) -> (B, T, C)


# PyTorch's CPU flash kernel is slow to train in reduced precision, and its math kernel spends
# half its time on copies, dtype round trips and a "safe softmax" check. In bfloat16 at (B, nh,
# T, hs) = (128, 4, 32, 32) a forward and backward took 34.3 ms flash, 9.0 ms math, 4.4 ms as the
# explicit products below; at T = 256 these are still 1.6-1.8x faster than flash, which stays
# fastest without gradients and in float32 (benchmarks/attention_kernels.py). So: the products
# for CPU training in reduced precision at T <= PRODUCTS_MAX_T (their weights grow with T^2).
PRODUCTS_MAX_T = 256


def product_attention(q: Tensor, k: Tensor, v: Tensor, p: float = 0.0) -> Tensor:
    """Causal SDPA with dropout ``p``, as two matrix products and a softmax: (B, nh, T, hs) each.

    Example:
        >>> q, k, v = torch.randn(3, 2, 4, 5, 8, dtype=torch.float64).unbind(0)
        >>> y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        >>> torch.allclose(product_attention(q, k, v), y, atol=1e-12)
        True
    """
    T, hs = q.shape[-2], q.shape[-1]
    att = (q * hs**-0.5) @ k.transpose(-2, -1)  # (B, nh, T, T)
    future = causal_mask(T, q.device)  # (T, T), True above the diagonal
    # softmax reads bfloat16 and sums in float32 (PyTorch's CPU kernel), writing bfloat16 back.
    att = torch.softmax(att.masked_fill(future, float("-inf")), dim=-1)
    if p > 0.0:
        att = F.dropout(att, p)
    return att @ v  # (B, nh, T, T) @ (B, nh, T, hs) -> (B, nh, T, hs)


def causal_attention(q: Tensor, k: Tensor, v: Tensor, p: float) -> Tensor:
    """Causal ``F.scaled_dot_product_attention`` with dropout ``p``, by the faster CPU route."""
    if (
        q.dtype in (torch.bfloat16, torch.float16)
        and q.device.type == "cpu"
        and q.shape[2] <= PRODUCTS_MAX_T
        and torch.is_grad_enabled()
        and (q.requires_grad or k.requires_grad or v.requires_grad)
    ):
        return product_attention(q, k, v, p)
    return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)


def _causal(q: Tensor, k: Tensor, v: Tensor, start: int, p: float) -> Tensor:
    """Causal SDPA for queries at positions ``start ..`` over keys ``0 .. L``."""
    T = q.shape[2]
    if start == 0:
        return causal_attention(q, k, v, p)
    if T == 1:  # the newest position may attend to every cached one
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p)
    # SDPA's is_causal aligns the triangle top-left, which is wrong once start > 0.
    return F.scaled_dot_product_attention(q, k, v, attn_mask=_allowed(start, T, q), dropout_p=p)


def _allowed(start: int, T: int, q: Tensor) -> Tensor:
    """(T, L): new query i sits at position start + i and may attend to keys <= start + i."""
    rows = torch.arange(start, start + T, device=q.device)[:, None]  # (T, 1)
    cols = torch.arange(start + T, device=q.device)[None, :]  # (1, L)
    return cols <= rows


def _formed(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out_proj: Linear,
    start: int,
    attn_mask: Tensor | None,
    key_padding_mask: Tensor | None,
    p: float,
    probe: Probe,
) -> Tensor:
    """Attention with the (T, L) pattern formed, and each head's output where it is wanted."""
    B, nh, T, hs = q.shape
    C = nh * hs
    if start == 0:
        blocked = blocked_positions(B, T, attn_mask, key_padding_mask, q.device)  # (B, T, T)
    else:
        blocked = ~_allowed(start, T, q)[None]  # (1, T, L)
    weights = probe.point("pattern", pattern(q, k, blocked))  # (B, nh, T, L)
    y = F.dropout(weights, p, training=p > 0) @ v  # (B, nh, T, hs)
    if not probe.wants("head_out"):
        return out_proj(y.transpose(1, 2).reshape(B, T, C))  # (B, T, C)
    # Column block n of the output projection reads head n: W_O (C, C) -> (C, nh, hs).
    w_o, b_o = out_proj.weight, out_proj.bias
    per_head = torch.einsum("bnti,cni->btnc", y, w_o.view(C, nh, hs))  # (B, T, nh, C)
    out = probe.point("head_out", per_head).sum(dim=2)  # (B, T, C)
    return out if b_o is None else out + b_o
