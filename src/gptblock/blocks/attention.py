"""Causal self-attention from a packed q/k/v projection, once: every path of the fused form.

``SelfAttention`` (and ``self_attention``, the same call on given projections) is the attention
branch of ``FusedBlock`` and so of everything that runs the fused form's forward: training
(``F.scaled_dot_product_attention``, or explicit products for short contexts in bfloat16:
``causal_attention``), masks, a KV cache with the new queries at positions ``start ..``
(generation), and the lens's points
(the ``(T, T)`` pattern and the per-head outputs, formed only when a probe wants them).

The modern block's attention is the same function with three optional parts
(``ModernHeads``): fewer key/value heads than query heads (grouped-query attention; the cache
holds the key/value heads, each serving ``nh // nkv`` query heads, Llama's ``repeat_kv`` order),
an RMSNorm over each head's queries and keys, and rotary positions (the new queries' and keys'
positions are ``start ..``, so a cache and an offset rotate them as a full pass would). Without
them (GPT-2's block) the path is the one it always was.

Shapes: B batch, T time (new positions), L = start + T keys, C channels, nh heads, nkv key/value
heads, hs = C // nh.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch
from torch.nn import functional as F

from .masks import blocked_positions, masked_softmax, split_dead_rows
from .parts import Linear, Norm
from .probe import Probe, at
from .qk_heads import fast_qkv

__all__ = [
    "PRODUCTS_MAX_T",
    "Attention",
    "KVStore",
    "ModernHeads",
    "SelfAttention",
    "causal_attention",
    "modern_qkv",
    "product_attention",
    "repeat_kv",
    "self_attention",
]


class RotaryFn(Protocol):
    """Rotary positions: ``gptblock.blocks.rotary.Rotary``."""

    def __call__(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor: ...


class ModernHeads(NamedTuple):
    """The modern block's optional attention parts; ``None`` for GPT-2's attention.

    ``in_proj`` then packs q (C rows), k (nkv * hs rows) and v (nkv * hs rows).
    """

    n_kv_heads: int  # nkv, dividing nh
    rotary: RotaryFn | None  # on q and k, at their positions
    q_norm: Norm | None  # over each head's hs channels
    k_norm: Norm | None


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """Each key/value head repeated for the ``n_rep`` query heads it serves, Llama's order:
    query head j reads key/value head ``j // n_rep``.

    Shape:
        (B, nkv, L, hs) -> (B, nkv * n_rep, L, hs).

    Example:
        >>> repeat_kv(torch.tensor([1.0, 2.0]).view(1, 2, 1, 1), 2).flatten().tolist()
        [1.0, 1.0, 2.0, 2.0]
    """
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1)


class KVStore(Protocol):
    """Where a block keeps the keys and values of earlier positions: ``gptblock.KVCache``."""

    @property
    def length(self) -> int:
        """Positions stored so far: the position of the next query."""
        ...

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store (B, nh, T, hs) keys and values; return all of them so far, (B, nh, L, hs)."""
        ...


class Attention(Protocol):
    """A block's attention part: ``FusedSelfAttention`` (a module, so module hooks on it fire)
    or ``SelfAttention`` (the same function on given projections)."""

    @property
    def in_proj(self) -> Linear: ...

    @property
    def out_proj(self) -> Linear: ...

    @property
    def n_heads(self) -> int: ...

    @property
    def modern(self) -> ModernHeads | None: ...

    def __call__(
        self,
        h: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        kv_cache: KVStore | None = None,
        *,
        dropout: float | None = None,
        probe: Probe | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor: ...


class SelfAttention(NamedTuple):
    """``self_attention`` on given projections: an ``Attention`` that is not a module.

    Example:
        >>> from gptblock.blocks.parts import Dense
        >>> attn = SelfAttention(Dense(torch.randn(12, 4), None), Dense(torch.randn(4, 4), None), 2)
        >>> attn(torch.randn(1, 3, 4)).shape
        torch.Size([1, 3, 4])
    """

    in_proj: Linear  # C -> 3C: q; k; v packed row-wise
    out_proj: Linear  # C -> C
    n_heads: int  # nh
    modern: ModernHeads | None = None  # grouped heads, qk-norm, rotary

    def __call__(
        self,
        h: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        kv_cache: KVStore | None = None,
        *,
        dropout: float | None = None,
        probe: Probe | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Causal self-attention of the normalised stream ``h``.

        Args:
            h: the normalised stream at the new positions.
            attn_mask, key_padding_mask: bool, ``True`` = blocked (``blocked_positions``); not
                with a cache.
            kv_cache: keys and values of the positions before ``h``'s; ``h`` is at positions
                ``kv_cache.length ..`` and its keys and values are appended.
            dropout: on the attention weights (0 or None outside training).
            probe: the block's hook points ``pattern`` and ``head_out``.
            positions: the new positions' token positions, (T,) or (B, T) ints, for the rotary
                angles only (default ``kv_cache.length ..``, or ``0 ..``); which key a query may
                attend to follows the keys' order (the cached ones first), never these numbers.

        Shape:
            h (B, T, C) -> (B, T, C).
        """
        p = dropout or 0.0
        nh, modern = self.n_heads, self.modern
        B, T, C = h.shape
        hs = C // nh
        qkv = self.in_proj(h)  # (B, T, C) @ (C, 3C) -> (B, T, 3C)
        start = 0
        if modern is not None:
            q, k, v = modern_qkv(qkv, nh, hs, modern, kv_cache, positions)
        elif T == 1:  # a generation step: (B, 1, 3, nh, hs) is (B, 3, nh, 1, hs) in memory
            q, k, v = qkv.view(B, 3, nh, 1, hs).unbind(1)  # 3 x (B, nh, 1, hs), no transpose
        else:
            # Views, no copy. Unbinding dim 2 before transposing (rather than permuting the 3 to
            # the front and unbinding dim 0: the same views) lets the backward stack the three
            # gradients straight into the (B, T, 3, nh, hs) layout, saving a (B, T, 3C) copy.
            qkv = qkv.view(B, T, 3, nh, hs)  # (B, T, 3, nh, hs)
            q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))  # 3 x (B, nh, T, hs)
        if kv_cache is not None:
            start = kv_cache.length
            k, v = kv_cache.append(k, v)  # (B, nh, L, hs) each, (B, nkv, L, hs) if grouped
        if modern is not None:
            k, v = (repeat_kv(t, nh // modern.n_kv_heads) for t in (k, v))  # (B, nh, L, hs)
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


# PyTorch's CPU flash-attention kernel is slow to train in reduced precision, and its math
# kernel spends half its time on copies, dtype round trips and a "safe softmax" check that a
# causal mask never needs. At (B, nh, T, hs) = (128, 4, 32, 32) in bfloat16 a forward and
# backward took 34.3 ms flash, 9.0 ms math and 4.4 ms as the explicit products below (autograd's
# own backward); at T = 256 the products are still 1.6-1.8x faster than flash. Flash stays the
# fastest without gradients, and in float32 (benchmarks/attention_kernels.py,
# results/attention-kernels.txt). So: the products for training in reduced precision on the CPU
# at T <= PRODUCTS_MAX_T (their (B, nh, T, T) weights grow with T squared), SDPA's own choice
# otherwise.
PRODUCTS_MAX_T = 256


def product_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: float = 0.0
) -> torch.Tensor:
    """Causal ``softmax(q k^T / sqrt(hs)) v`` as two matrix products and a softmax, with dropout
    ``p`` on the weights: the same function as causal SDPA, by another route.

    Shape:
        q, k, v: (B, nh, T, hs) -> (B, nh, T, hs).

    Example:
        >>> q, k, v = torch.randn(3, 2, 4, 5, 8, dtype=torch.float64).unbind(0)
        >>> y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        >>> torch.allclose(product_attention(q, k, v), y, atol=1e-12)
        True
    """
    T, hs = q.shape[-2], q.shape[-1]
    att = (q * hs**-0.5) @ k.transpose(-2, -1)  # (B, nh, T, T)
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu_(1)  # (T, T)
    # softmax reads bfloat16 and sums in float32 (PyTorch's CPU kernel), writing bfloat16 back.
    att = torch.softmax(att.masked_fill(future, float("-inf")), dim=-1)
    if p > 0.0:
        att = F.dropout(att, p)
    return att @ v  # (B, nh, T, T) @ (B, nh, T, hs) -> (B, nh, T, hs)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: float) -> torch.Tensor:
    """Causal ``F.scaled_dot_product_attention`` with dropout ``p``, by the faster CPU route.

    Shape:
        q, k, v: (B, nh, T, hs) -> (B, nh, T, hs).
    """
    if (
        q.dtype in (torch.bfloat16, torch.float16)
        and q.device.type == "cpu"
        and q.shape[2] <= PRODUCTS_MAX_T
        and torch.is_grad_enabled()
        and (q.requires_grad or k.requires_grad or v.requires_grad)
    ):
        return product_attention(q, k, v, p)
    return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)


def self_attention(
    h: torch.Tensor,
    in_proj: Linear,
    out_proj: Linear,
    n_heads: int,
    attn_mask: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
    *,
    kv_cache: KVStore | None = None,
    dropout: float = 0.0,
    probe: Probe | None = None,
    modern: ModernHeads | None = None,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal self-attention of the normalised stream ``h``: ``SelfAttention``'s call on these
    projections (see it for the arguments).

    Shape:
        h (B, T, C) -> (B, T, C).
    """
    attention = SelfAttention(in_proj, out_proj, n_heads, modern)
    return attention(
        h,
        attn_mask,
        key_padding_mask,
        kv_cache,
        dropout=dropout,
        probe=probe,
        positions=positions,
    )


def modern_qkv(
    qkv: torch.Tensor,
    nh: int,
    hs: int,
    modern: ModernHeads,
    kv_cache: KVStore | None,
    positions: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q (B, nh, T, hs) and k, v (B, nkv, T, hs) of the packed projection (B, T, (nh + 2 nkv) hs),
    normalised and rotated at ``positions``, by default ``start ..`` (after the cached ones)."""
    B, T, _ = qkv.shape
    nkv = modern.n_kv_heads
    if positions is None and modern.rotary is not None:
        start = 0 if kv_cache is None else kv_cache.length
        positions = torch.arange(start, start + T, device=qkv.device)  # (T,)
    parts = (modern.q_norm, modern.k_norm, modern.rotary)
    fast = fast_qkv(qkv.view(B, T, nh + 2 * nkv, hs), nh, *parts, positions)  # (B, nh | nkv, T, hs)
    if fast is not None:
        return fast
    sizes = [nh * hs, nkv * hs, nkv * hs]
    q, k, v = torch.split(qkv, sizes, dim=-1)  # (B, T, nh hs), 2 x (B, T, nkv hs)
    q = q.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
    k = k.view(B, T, nkv, hs).transpose(1, 2)  # (B, nkv, T, hs)
    v = v.view(B, T, nkv, hs).transpose(1, 2)  # (B, nkv, T, hs)
    if modern.q_norm is not None and modern.k_norm is not None:
        q, k = modern.q_norm(q), modern.k_norm(k)  # over hs, per head and position
    if modern.rotary is not None and positions is not None:
        q, k = modern.rotary(q, positions), modern.rotary(k, positions)
    # The norm and the rotation compute in float32 (their tables and statistics); under
    # bfloat16 autocast q and k go back to v's dtype, so that the attention runs in the dtype
    # the plain path does, and by the kernel chosen for it (causal_attention): left in float32,
    # SDPA's CPU flash kernel made a training step twice as slow.
    return q.to(v.dtype), k.to(v.dtype), v


def _causal(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, p: float
) -> torch.Tensor:
    """Causal SDPA for queries at positions ``start ..`` over keys ``0 .. L``: (B, nh, T, hs)."""
    T = q.shape[2]
    if start == 0:
        return causal_attention(q, k, v, p)
    if T == 1:  # the newest position may attend to every cached one
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p)
    # SDPA's is_causal aligns the triangle top-left, which is wrong once start > 0.
    return F.scaled_dot_product_attention(q, k, v, attn_mask=_allowed(start, T, q), dropout_p=p)


def _allowed(start: int, T: int, q: torch.Tensor) -> torch.Tensor:
    """(T, L): new query i sits at position start + i and may attend to keys <= start + i."""
    rows = torch.arange(start, start + T, device=q.device)[:, None]  # (T, 1)
    cols = torch.arange(start + T, device=q.device)[None, :]  # (1, L)
    return cols <= rows


def _formed(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out_proj: Linear,
    start: int,
    attn_mask: torch.Tensor | None,
    key_padding_mask: torch.Tensor | None,
    p: float,
    probe: Probe,
) -> torch.Tensor:
    """Attention with the (T, L) pattern formed, and each head's output where it is wanted."""
    B, nh, T, hs = q.shape
    C = nh * hs
    scores = q @ k.transpose(-2, -1) * hs**-0.5  # (B, nh, T, hs) @ (B, nh, hs, L) -> (B, nh, T, L)
    if start == 0:
        blocked = blocked_positions(B, T, attn_mask, key_padding_mask, q.device)  # (B, T, T)
    else:
        blocked = ~_allowed(start, T, q)[None]  # (1, T, L)
    pattern = at(probe, "pattern", masked_softmax(scores, blocked))  # (B, nh, T, L)
    y = (
        F.dropout(pattern, p, training=p > 0) @ v
    )  # (B, nh, T, L) @ (B, nh, L, hs) -> (B, nh, T, hs)
    if not probe.wants("head_out"):
        return out_proj(y.transpose(1, 2).reshape(B, T, C))  # (B, T, C)
    # Column block n of the output projection reads head n: W_O (C, C) -> (C, nh, hs).
    w_o, b_o = out_proj.weight, out_proj.bias
    per_head = torch.einsum("bnti,cni->btnc", y, w_o.view(C, nh, hs))  # (B, T, nh, C)
    out = at(probe, "head_out", per_head).sum(dim=2)  # (B, T, C)
    return out if b_o is None else out + b_o
