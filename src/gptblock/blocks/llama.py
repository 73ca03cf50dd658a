"""Llama's decoder layer from the parts, named as Hugging Face's ``LlamaDecoderLayer``.

``LlamaBlock`` is the modern pre-norm block written as its parts (``RMSNorm``,
``GroupedQueryAttention``, ``SwiGLU``), so a state_dict of Hugging Face's layer
(``input_layernorm``, ``self_attn.q_proj`` ..., ``post_attention_layernorm``, ``mlp.gate_proj``
...) or of Meta's (``attention_norm``, ``attention.wq`` ..., ``ffn_norm``, ``feed_forward.w1``
...) loads as it is. ``FusedBlock(norm="rmsnorm", mlp="swiglu", rope=True, bias=False, ...)``
computes the same function with q, k, v packed; a test holds the two, and the oracle, together.

Shapes: B batch, T time, C channels, nh query heads, nkv key/value heads, F = d_ff.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .aliases import accept_aliases
from .checks import check_input, check_positions
from .gqa import GroupedQueryAttention
from .mlp import SwiGLU
from .norms import RMSNorm

__all__ = ["LlamaBlock"]

META_NAMES = {  # Meta's Llama layer -> Hugging Face's
    "attention_norm": "input_layernorm",
    "attention": "self_attn",
    "ffn_norm": "post_attention_layernorm",
    "feed_forward": "mlp",
}


class LlamaBlock(nn.Module):
    """``x + attn(norm(x))``, then ``+ mlp(norm(x))``, with RMSNorm, rotary grouped-query
    attention and SwiGLU, under Hugging Face's names (Meta's load too).

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
        super().__init__()
        self.d_model = d_model
        self.input_layernorm = RMSNorm(d_model, norm_eps)
        self.self_attn = GroupedQueryAttention(
            d_model, n_heads, n_kv_heads, rotary_dim=rotary_dim, rope_theta=rope_theta,
            rope_pairing=rope_pairing, qk_norm=qk_norm, norm_eps=norm_eps,
        )  # fmt: skip
        self.post_attention_layernorm = RMSNorm(d_model, norm_eps)
        self.mlp = SwiGLU(d_model, d_ff)
        accept_aliases(self, META_NAMES)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        B, T, _ = check_input(x, self.d_model, like=self.mlp.down_proj.weight)
        if positions is not None:
            check_positions(positions, B, T, x.device)
        x = x + self.self_attn(self.input_layernorm(x), positions)  # (B, T, C)
        return x + self.mlp(self.post_attention_layernorm(x))  # (B, T, C)
