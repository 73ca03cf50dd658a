"""Llama's decoder layer and attention under Hugging Face's names: thin names over the one
modern block.

``LlamaBlock`` is ``FusedBlock`` with Llama's options (RMSNorm, rotary grouped-query attention,
SwiGLU, no biases) and ``GroupedQueryAttention`` its attention alone; each only renames the
state_dict (``aliases.rename_state``), so a state_dict of Hugging Face's layer
(``input_layernorm``, ``self_attn.q_proj`` ..., ``post_attention_layernorm``, ``mlp.gate_proj``
...) or of Meta's (``attention_norm``, ``attention.wq`` ..., ``ffn_norm``, ``feed_forward.w1``
...) loads as it is, and ``state_dict()`` writes Hugging Face's names (q, k, v split).

Shapes: B batch, T time, C channels, nh query heads, nkv key/value heads, F = d_ff.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .aliases import rename_state
from .config import BlockConfig
from .fused import FusedBlock, FusedSelfAttention

__all__ = ["GroupedQueryAttention", "LlamaBlock"]

ATTENTION_NAMES = {"out_proj": "o_proj"}  # own -> Hugging Face's (and the packed q; k; v split)
META_ATTENTION = {"wq": "q_proj", "wk": "k_proj", "wv": "v_proj", "wo": "o_proj"}  # -> HF's
BLOCK_NAMES = {
    "norm1": "input_layernorm",
    "norm2": "post_attention_layernorm",
    "linear1": "mlp.gate_proj",
    "linear3": "mlp.up_proj",
    "linear2": "mlp.down_proj",
}
META_BLOCK = {  # Meta's Llama layer -> Hugging Face's
    "attention_norm": "input_layernorm",
    "attention": "self_attn",
    "ffn_norm": "post_attention_layernorm",
    "feed_forward.w1": "mlp.gate_proj",
    "feed_forward.w3": "mlp.up_proj",
    "feed_forward.w2": "mlp.down_proj",
}


def _llama_names(attn: FusedSelfAttention, config: BlockConfig) -> None:
    """Hugging Face's (and Meta's) names on the packed attention ``attn``."""
    C, kv = config.d_model, config.n_kv_head * config.head_size
    split = (("q_proj", "k_proj", "v_proj"), lambda: [C, kv, kv])
    rename_state(attn, ATTENTION_NAMES, META_ATTENTION, split)


class GroupedQueryAttention(FusedSelfAttention):
    """Causal self-attention with ``n_kv_heads`` key/value heads, rotary positions and an
    optional RMSNorm on queries and keys, named as Hugging Face's ``LlamaAttention``; a
    state_dict in Meta's names (``wq``, ``wk``, ``wv``, ``wo``) loads too (Meta's checkpoints
    rotate adjacent pairs: ``rope_pairing="adjacent"``).

    Args:
        d_model: C.
        n_heads: nh, query heads.
        n_kv_heads: nkv, key/value heads (dividing nh); None: nh. 1 is multi-query attention.
        bias: biases on the four projections (Llama has none).
        rope: rotate queries and keys by their positions.
        rotary_dim, rope_theta, rope_pairing: as ``Rotary``'s.
        qk_norm: ``q_norm`` and ``k_norm`` (``RMSNorm(hs)``), as Qwen 3 and OLMo 2.
        norm_eps: their epsilon.

    Shape:
        x (B, T, C), optional positions (T,) or (B, T) (default 0 .. T-1), optional mask bool
        ``True`` = blocked, (T, T) or (B, T, T), besides the causal one -> (B, T, C).

    Example:
        >>> attn = GroupedQueryAttention(16, 4, 2)
        >>> sorted(attn.state_dict())
        ['k_proj.weight', 'o_proj.weight', 'q_proj.weight', 'v_proj.weight']
        >>> attn.state_dict()["k_proj.weight"].shape  # nkv * hs rows
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
        config = BlockConfig.of(
            d_model, n_heads, n_kv_heads=n_kv_heads, bias=bias, rope=rope, rotary_dim=rotary_dim,
            rope_theta=rope_theta, rope_pairing=rope_pairing, qk_norm=qk_norm, norm_eps=norm_eps,
        )  # fmt: skip
        super().__init__(config)
        _llama_names(self, config)

    def forward(  # type: ignore[override]
        self,
        x: torch.Tensor,
        positions: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return super().forward(x, mask, positions=positions)


class LlamaBlock(FusedBlock):
    """``x + attn(norm(x))``, then ``+ mlp(norm(x))``, with RMSNorm, rotary grouped-query
    attention and SwiGLU, under Hugging Face's names (Meta's load too): ``FusedBlock`` with
    Llama's options.

    Args:
        d_model: C.
        n_heads: nh, query heads.
        d_ff: F, the SwiGLU's hidden size.
        n_kv_heads: nkv, key/value heads (dividing nh); None: nh.
        rope_theta, rope_pairing, rotary_dim: as ``Rotary``'s (Meta's weights rotate adjacent
            pairs, Hugging Face's halves).
        norm_eps: the RMSNorms' epsilon.
        qk_norm: an RMSNorm on each head's queries and keys (Qwen 3).

    Shape:
        x (B, T, C), optional positions (T,) or (B, T) ints (default 0 .. T-1) -> (B, T, C).

    Example:
        >>> block = LlamaBlock(16, 4, 40, n_kv_heads=2)
        >>> [k for k in block.state_dict() if "norm" in k or "gate" in k]
        ['input_layernorm.weight', 'post_attention_layernorm.weight', 'mlp.gate_proj.weight']
        >>> block(torch.randn(2, 5, 16), positions=torch.arange(3, 8)).shape
        torch.Size([2, 5, 16])
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        *,
        n_kv_heads: int | None = None,
        rope_theta: float = 10000.0,
        rope_pairing: str = "halves",
        rotary_dim: int | None = None,
        norm_eps: float = 1e-6,
        qk_norm: bool = False,
    ) -> None:
        super().__init__(
            d_model, n_heads, bias=False, norm_eps=norm_eps, norm="rmsnorm", mlp="swiglu",
            d_ff=d_ff, n_kv_heads=n_kv_heads, rope=True, rope_theta=rope_theta,
            rope_pairing=rope_pairing, rotary_dim=rotary_dim, qk_norm=qk_norm,
        )  # fmt: skip
        _llama_names(self.self_attn, self.config)
        rename_state(self, BLOCK_NAMES, META_BLOCK)

    @property
    def input_layernorm(self) -> nn.Module:
        return self.norm1

    @property
    def post_attention_layernorm(self) -> nn.Module | None:
        return self.norm2

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        return super().forward(x, positions=positions)
