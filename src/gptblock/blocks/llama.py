"""Llama's decoder layer and attention under Hugging Face's names: thin names over ``FusedBlock``.

Each only renames the state_dict (``aliases.rename_state``): Hugging Face's names
(``input_layernorm``, ``self_attn.q_proj`` ..., ``mlp.gate_proj`` ...) are written and loaded,
and Meta's (``attention_norm``, ``attention.wq`` ..., ``feed_forward.w1`` ...) loaded too.

Shapes: B batch, T time, C channels, nh query heads, nkv key/value heads, F = d_ff.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .aliases import rename_state
from .config import BlockConfig
from .fused import FusedBlock, FusedSelfAttention
from .mlp import META_NAMES

__all__ = ["GroupedQueryAttention", "LlamaBlock"]

ATTENTION_NAMES = {"out_proj": "o_proj"}  # own -> Hugging Face's (and the packed q; k; v split)
META_ATTENTION = {"wq": "q_proj", "wk": "k_proj", "wv": "v_proj", "wo": "o_proj"}  # -> HF's
NORM_NAMES = {"norm1": "input_layernorm", "norm2": "post_attention_layernorm"}
# own -> Hugging Face's: linear1 (Meta's w1) -> mlp.gate_proj, linear3 -> up_proj, linear2 -> down
BLOCK_NAMES = {**NORM_NAMES, **{f"linear{w[1]}": f"mlp.{hf}" for w, hf in META_NAMES.items()}}
META_BLOCK = {  # Meta's Llama layer -> Hugging Face's
    "attention_norm": "input_layernorm",
    "attention": "self_attn",
    "ffn_norm": "post_attention_layernorm",
    **{f"feed_forward.{w}": f"mlp.{hf}" for w, hf in META_NAMES.items()},
}


def _llama_names(attn: FusedSelfAttention, config: BlockConfig) -> None:
    """Hugging Face's (and Meta's) names on the packed attention ``attn``."""
    C, kv = config.d_model, config.n_kv_head * config.head_size
    split = (("q_proj", "k_proj", "v_proj"), lambda: [C, kv, kv])
    rename_state(attn, ATTENTION_NAMES, META_ATTENTION, split)


class GroupedQueryAttention(FusedSelfAttention):
    """Causal self-attention with grouped key/value heads, rotary positions and optional
    qk-norm, as Hugging Face's ``LlamaAttention``; Meta's names (``wq`` ...) load too.

    Args:
        d_model: C.
        n_heads: nh, query heads.
        n_kv_heads: nkv, key/value heads (dividing nh); None: nh. 1 is multi-query attention.
        bias: biases on the four projections (Llama has none).
        rope: rotate queries and keys by their positions.
        rotary_dim, rope_theta, rope_pairing: as ``Rotary``'s (Meta's weights: "adjacent").
        qk_norm, norm_eps: ``q_norm`` and ``k_norm`` (``RMSNorm(hs)``, as Qwen 3) and their eps.

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
    """``FusedBlock`` with Llama's options (RMSNorm, rotary grouped-query attention, SwiGLU, no
    biases) under Hugging Face's names (Meta's load too).

    Args:
        d_model: C.
        n_heads: nh, query heads.
        d_ff: F, the SwiGLU's hidden size.
        n_kv_heads: nkv, key/value heads (dividing nh); None: nh.
        rope_theta, rope_pairing, rotary_dim, norm_eps, qk_norm: as ``GroupedQueryAttention``'s.

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
