"""The fast block: one packed QKV projection and ``F.scaled_dot_product_attention``.

``FusedBlock`` computes the same function as ``TransformerBlock`` and the lesson's ``Block`` and
has ``TransformerBlock``'s parameter names and layouts (``self_attn.in_proj_weight`` is q, k, v
packed as ``nn.MultiheadAttention`` packs them), so the state_dicts of ``TransformerBlock``,
``FusedBlock`` and ``nn.TransformerEncoderLayer(norm_first=True)`` load into one another.

Why it is faster: the lesson runs three small matmuls per head and materialises every (T, T)
weight matrix; ``nn.MultiheadAttention`` is general (cross-attention, several mask formats,
need_weights). Here q, k and v come from one (C, 3C) matmul and SDPA computes the attention without
storing the (B, nh, T, T) matrix (flash attention on CPU and GPU), unless ``attention_weights`` asks
for it.

It also carries the generation path: with a ``KVCache``, ``forward`` processes only the new
positions and reads the keys and values of the earlier ones from the cache.

Shapes: B batch, T time, C = d_model channels, nh = n_heads heads, hs = C // nh.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
from torch.nn import functional as F

from ..errors import UserTypeError, UserValueError
from .config import BlockConfig, activation_function, check_input, check_positive_int
from .masks import blocked_positions, masked_softmax, split_dead_rows
from .matvec import RowLinear

__all__ = ["BlockDecoder", "FusedBlock", "FusedSelfAttention", "KVCache"]


class KVCache:
    """The keys and values one block has computed so far, preallocated to ``max_len`` positions.

    Preallocating (rather than ``torch.cat`` on every step) keeps each step's cost independent
    of how many tokens came before, apart from the attention itself.

    Args:
        batch_size: B.
        n_heads: nh.
        max_len: the most positions the cache holds (the model's block_size).
        head_size: hs.
        dtype, device: those of the block's activations.

    Shape:
        ``k``, ``v``: (B, nh, max_len, hs); positions ``[0, length)`` are filled.

    Example:
        >>> cache = KVCache(1, 2, max_len=8, head_size=4)
        >>> block = FusedBlock(8, 2).eval()
        >>> _ = block(torch.randn(1, 3, 8), kv_cache=cache)   # prefill 3 positions
        >>> _ = block(torch.randn(1, 1, 8), kv_cache=cache)   # one more
        >>> cache.length
        4
    """

    def __init__(
        self,
        batch_size: int,
        n_heads: int,
        max_len: int,
        head_size: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        for name, value in (
            ("batch_size", batch_size),
            ("n_heads", n_heads),
            ("max_len", max_len),
            ("head_size", head_size),
        ):
            check_positive_int(name, value)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise UserTypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
        shape = (batch_size, n_heads, max_len, head_size)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store (B, nh, T_new, hs) keys and values; return all keys and values so far."""
        start, stop = self.length, self.length + k.shape[2]
        if stop > self.max_len:
            raise UserValueError(
                f"KV cache holds {self.max_len} positions; {start} are filled and "
                f"{k.shape[2]} more do not fit (crop the context or rebuild the cache)"
            )
        if (
            k.shape[0] != self.k.shape[0]
            or k.shape[1] != self.k.shape[1]
            or k.shape[3] != self.k.shape[3]
        ):
            raise UserValueError(
                f"KV cache expects (B, nh, T, hs) = ({self.k.shape[0]}, {self.k.shape[1]}, T, "
                f"{self.k.shape[3]}), got {tuple(k.shape)}"
            )
        self.k[:, :, start:stop] = k
        self.v[:, :, start:stop] = v
        self.length = stop
        return self.k[:, :, :stop], self.v[:, :, :stop]  # (B, nh, stop, hs) each


# PyTorch's CPU flash-attention kernel is slow in reduced precision at short contexts: at
# (B, nh, T, hs) = (128, 4, 32, 32) in bfloat16 a forward and backward took 13.5 ms, its math
# kernel 4.5 ms (in float32: 5.4 ms flash, 7.5 ms math); at T = 128 math is still 1.9x faster,
# at T = 256 flash is (benchmarks/attention_kernels.py, results/attention-kernels.txt). Both compute softmax(q k^T / sqrt(hs)) v; the math kernel
# is chosen where it is the faster, and otherwise SDPA picks as it always does.
MATH_KERNEL_MAX_T = 128
_MATH_KERNEL: Any = None
try:  # torch >= 2.3
    from torch.nn.attention import SDPBackend, sdpa_kernel

    _MATH_KERNEL = (sdpa_kernel, SDPBackend.MATH)
except ImportError:  # pragma: no cover - older torch: SDPA's own choice, the same function
    pass


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: float) -> torch.Tensor:
    """Causal ``F.scaled_dot_product_attention`` with dropout ``p``, by the faster CPU kernel.

    Shape:
        q, k, v: (B, nh, T, hs) -> (B, nh, T, hs).
    """
    reduced = q.dtype in (torch.bfloat16, torch.float16)
    if (
        _MATH_KERNEL is not None
        and reduced
        and q.device.type == "cpu"
        and q.shape[2] <= MATH_KERNEL_MAX_T
    ):
        kernel, math_backend = _MATH_KERNEL
        with kernel(math_backend):
            return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
    return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)


class FusedSelfAttention(nn.Module):
    """Causal self-attention with ``nn.MultiheadAttention``'s parameters, computed by SDPA.

    Args:
        config: the block's ``BlockConfig``.

    Shape:
        Input (B, T, C); output (B, T, C).
    """

    def __init__(self, config: BlockConfig) -> None:
        super().__init__()
        C = config.d_model
        self.n_heads = config.n_heads
        self.dropout = config.dropout
        self.in_proj_weight = nn.Parameter(torch.empty(3 * C, C))  # rows: q; k; v
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * C)) if config.bias else None
        self.out_proj = nn.Linear(C, C, bias=config.bias)
        # nn.MultiheadAttention's initialisation, so a fresh FusedBlock starts where a fresh
        # TransformerBlock does.
        nn.init.xavier_uniform_(self.in_proj_weight)
        if self.out_proj.bias is not None:
            nn.init.zeros_(self.out_proj.bias)

    def project(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The queries, keys and values of every head: three (B, nh, T, hs) tensors."""
        B, T, C = h.shape
        qkv = F.linear(
            h, self.in_proj_weight, self.in_proj_bias
        )  # (B, T, C) @ (C, 3C) -> (B, T, 3C)
        qkv = qkv.view(B, T, 3, self.n_heads, C // self.n_heads)  # (B, T, 3, nh, hs)
        # Views, no copy. Unbinding dim 2 before transposing (rather than permuting the 3 to the
        # front and unbinding dim 0: the same views) lets the backward stack the three gradients
        # straight into the (B, T, 3, nh, hs) layout, saving a (B, T, 3C) copy per step.
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))  # 3 x (B, nh, T, hs)
        return q, k, v

    def forward(
        self,
        h: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
    ) -> torch.Tensor:
        B, T, C = h.shape
        q, k, v = self.project(h)  # (B, nh, T, hs) each
        # SDPA applies dropout_p whatever the module's mode: pass it in training only.
        p = self.dropout if self.training else 0.0
        if kv_cache is not None:
            y = self._attend_cached(q, k, v, kv_cache, p)
        elif attn_mask is None and key_padding_mask is None:
            y = causal_attention(q, k, v, p)
        else:
            blocked = blocked_positions(B, T, attn_mask, key_padding_mask, h.device)  # (B, T, T)
            # Rows with no key left: attend with them unblocked so no backend can produce NaN,
            # then zero their output, which is what zero attention weights give.
            live, dead = split_dead_rows(blocked)  # (B, T, T), (B, T)
            allowed = ~live[:, None]  # (B, 1, T, T), SDPA's convention: True = may attend
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=p)
            y = y.masked_fill(dead[:, None, :, None], 0.0)  # (B, nh, T, hs)
        y = y.transpose(1, 2).reshape(B, T, C)  # (B, nh, T, hs) -> (B, T, nh, hs) -> (B, T, C)
        return self.out_proj(y)

    @staticmethod
    def _attend_cached(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache, p: float
    ) -> torch.Tensor:
        start, T = cache.length, q.shape[2]
        k, v = cache.append(k, v)  # (B, nh, start + T, hs) each
        if start == 0:
            return causal_attention(q, k, v, p)
        if T == 1:  # the newest position may attend to every cached one
            return F.scaled_dot_product_attention(q, k, v, dropout_p=p)
        # New query i sits at absolute position start + i and may attend to keys <= start + i.
        # (SDPA's is_causal aligns the triangle top-left, which is wrong once start > 0.)
        rows = torch.arange(start, start + T, device=q.device)[:, None]  # (T, 1)
        cols = torch.arange(start + T, device=q.device)[None, :]  # (1, start + T)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=cols <= rows, dropout_p=p)


class FusedBlock(nn.Module):
    """The pre-norm GPT block with packed QKV and ``F.scaled_dot_product_attention``.

    Same constructor, parameter names and function as ``TransformerBlock``; masks follow the
    same convention (bool, ``True`` = blocked), converted to SDPA's opposite one inside.

    Args:
        d_model: C, width of the residual stream.
        n_heads: nh, number of heads; must divide d_model.
        dropout: probability for every dropout in the block (attention weights, both residual
            branches, the MLP hidden layer), training mode only.
        activation: ``"gelu"`` (exact, erf-based), ``"relu"`` or ``"gelu_tanh"`` (GPT-2's).
        bias: biases on the q/k/v and output projections, the MLP and the LayerNorms.
        norm_eps: the LayerNorms' epsilon.

    Shape:
        Input (B, T, C); output (B, T, C). Optional ``attn_mask`` bool (T, T) or (B, T, T);
        optional ``key_padding_mask`` bool (B, T). With ``kv_cache``, the input holds only the
        new positions and no extra mask is allowed.

    Example:
        >>> from gptblock import TransformerBlock
        >>> block = FusedBlock(16, 2).eval()
        >>> x = torch.randn(2, 5, 16)
        >>> block(x).shape
        torch.Size([2, 5, 16])
        >>> twin = TransformerBlock(16, 2).eval()
        >>> twin.load_state_dict(block.state_dict())
        <All keys matched successfully>
        >>> torch.allclose(twin(x), block(x), atol=1e-5)
        True
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        dropout: float = 0.0,
        activation: str = "gelu",
        bias: bool = True,
        norm_eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.config = BlockConfig(d_model, n_heads, dropout, activation, bias, norm_eps)
        d_ff = self.config.d_ff
        self.norm1 = nn.LayerNorm(d_model, eps=norm_eps, bias=bias)
        self.self_attn = FusedSelfAttention(self.config)
        self.dropout1 = nn.Dropout(dropout)
        self.norm2 = nn.LayerNorm(d_model, eps=norm_eps, bias=bias)
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout2 = nn.Dropout(dropout)

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        *,
        kv_cache: KVCache | None = None,
    ) -> torch.Tensor:
        check_input(x, self.config.d_model, like=self.norm1.weight)
        if kv_cache is not None and (attn_mask is not None or key_padding_mask is not None):
            raise UserValueError("kv_cache cannot be combined with attn_mask or key_padding_mask")
        try:
            a = self.self_attn(self.norm1(x), attn_mask, key_padding_mask, kv_cache)
        except RuntimeError as e:
            if "not implemented for" in str(e):
                raise UserTypeError(
                    f"FusedBlock does not support dtype {x.dtype} on device {x.device.type} "
                    f"with torch {torch.__version__} ({e}); use float32 or bfloat16"
                ) from e
            raise
        x = x + self.dropout1(a)
        x = x + self.dropout2(self._mlp(self.norm2(x)))
        return x

    def decode_step(self, x: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """``forward(x, kv_cache=cache)`` for one new position in eval mode: ``BlockDecoder``.

        For many steps, make the ``BlockDecoder`` once and call it (as ``GPT.generate`` does).

        Shape:
            x (B, 1, C) -> (B, 1, C); ``cache`` gains one position.
        """
        return BlockDecoder(self)(x, cache)

    def _mlp(self, h: torch.Tensor) -> torch.Tensor:
        act = activation_function(self.config.activation)
        return self.linear2(self.dropout(act(self.linear1(h))))  # (B, T, 4C) -> (B, T, C)

    def attention_weights(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Post-softmax, pre-dropout attention weights for input ``x``: (B, nh, T, T).

        The one place this block materialises the (T, T) matrix. Fully blocked rows are zeros.
        """
        B, T, C = check_input(x, self.config.d_model, like=self.norm1.weight)
        q, k, _ = self.self_attn.project(self.norm1(x))  # (B, nh, T, hs) each
        att = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5  # (B, nh, T, T)
        blocked = blocked_positions(B, T, attn_mask, key_padding_mask, x.device)  # (B, T, T)
        return masked_softmax(att, blocked)  # (B, nh, T, T); fully blocked rows all zero


class BlockDecoder:
    """A ``FusedBlock``'s generation step for one new position, its parameters looked up once.

    Generation runs this once per token and block. At one position the arithmetic is
    matrix-vector products, and the cost of going through a dozen modules (each attribute of a
    module is a dictionary lookup in ``nn.Module.__getattr__``), dropouts that do nothing in eval
    mode and the input checks was a quarter of a step on CPU. This is the same arithmetic as
    ``FusedBlock.forward`` with a ``KVCache`` (tests keep the two equal to float32 rounding) in
    functional calls on parameters fetched at construction, the four weight matrices as
    ``RowLinear`` copies laid out for one-position products (``gptblock.blocks.matvec``: a step reads
    every weight once, and that layout reads it three times as fast on a 2-core CPU). The
    copies do not follow later changes to the block: make a new decoder then (``GPT.generate``
    makes one per call).

    Args:
        block: a ``FusedBlock`` in eval mode.

    Shape:
        ``decoder(x, cache)``: x (B, 1, C) -> (B, 1, C); ``cache`` gains one position.

    Example:
        >>> block = FusedBlock(8, 2).eval()
        >>> cache = KVCache(1, 2, max_len=4, head_size=4)
        >>> _ = block(torch.randn(1, 2, 8), kv_cache=cache)
        >>> BlockDecoder(block)(torch.randn(1, 1, 8), cache).shape
        torch.Size([1, 1, 8])
    """

    def __init__(self, block: FusedBlock) -> None:
        if block.training:
            raise RuntimeError("BlockDecoder is for generation in eval mode; call .eval() first")
        cfg, attn = block.config, block.self_attn
        self.C, self.nh, self.hs, self.eps = cfg.d_model, cfg.n_heads, cfg.head_size, cfg.norm_eps
        self.act = activation_function(cfg.activation)
        self.norm1 = (block.norm1.weight, block.norm1.bias)
        self.in_proj = RowLinear(attn.in_proj_weight, attn.in_proj_bias)
        self.out_proj = RowLinear(attn.out_proj.weight, attn.out_proj.bias)
        self.norm2 = (block.norm2.weight, block.norm2.bias)
        self.linear1 = RowLinear(block.linear1.weight, block.linear1.bias)
        self.linear2 = RowLinear(block.linear2.weight, block.linear2.bias)

    def __call__(self, x: torch.Tensor, cache: KVCache) -> torch.Tensor:
        B, C, nh, hs = x.shape[0], self.C, self.nh, self.hs
        h = F.layer_norm(x, (C,), *self.norm1, self.eps)
        qkv = self.in_proj(h)  # (B, 1, 3C)
        # With one position, (B, 1, 3, nh, hs) and (B, 3, nh, 1, hs) are the same memory.
        q, k, v = qkv.view(B, 3, nh, 1, hs).unbind(1)  # 3 x (B, nh, 1, hs)
        k, v = cache.append(k, v)  # (B, nh, L, hs) each
        y = F.scaled_dot_product_attention(q, k, v)  # (B, nh, 1, hs): attends to all L
        x = x + self.out_proj(y.reshape(B, 1, C))  # (B, nh, 1, hs) -> (B, 1, C)
        h = F.layer_norm(x, (C,), *self.norm2, self.eps)
        u = self.act(self.linear1(h))  # (B, 1, 4C)
        return x + self.linear2(u)  # (B, 1, C)
