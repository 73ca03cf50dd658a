# Source: Lightning-AI/litgpt, litgpt/model.py
#   commit 04205815e8849fe883825e3e858e62749c5d7f4d: Block, CausalSelfAttention, GptNeoxMLP.
# Kept: Block(config, block_idx) with one Config object naming norm_class / mlp_class, the
# fused qkv Linear split by sizes (query_size, key_size, value_size) for grouped queries,
# scaled_dot_product_attention with scale = 1 / sqrt(attention_scores_scalar or head_size) and
# is_causal=mask is None, the parallel_residual branch of Block.forward, GptNeoxMLP fc/proj.
# Reduced: no rotary embedding (cos, sin), kv cache, sliding window, qk norm, softcapping or
# latent attention; n_query_groups = n_head; parallel_residual=False.
import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:
    n_embd: int = 32
    n_head: int = 4
    n_query_groups: int = 4
    bias: bool = True
    attn_bias: bool = False
    norm_eps: float = 1e-5
    parallel_residual: bool = False
    shared_attention_norm: bool = False
    gelu_approximate: str = "none"
    attention_scores_scalar: int | None = None
    norm_class: type = field(default=nn.LayerNorm)
    intermediate_size: int = 128

    @property
    def head_size(self) -> int:
        return self.n_embd // self.n_head

    @property
    def mlp_class(self) -> type:
        return GptNeoxMLP


class Block(nn.Module):
    def __init__(self, config: Config, block_idx: int) -> None:
        super().__init__()
        if not config.parallel_residual and config.shared_attention_norm:
            raise NotImplementedError(
                "No checkpoint amongst the ones we support uses this configuration"
                " (non-parallel residual and shared attention norm)."
            )

        self.norm_1 = config.norm_class(config.n_embd, eps=config.norm_eps)
        self.attn = CausalSelfAttention(config, block_idx)
        self.norm_2 = None if config.shared_attention_norm else config.norm_class(config.n_embd, eps=config.norm_eps)
        self.mlp = config.mlp_class(config)

        self.config = config

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x_normed = self.norm_1(x)
        attention_output = self.attn(x_normed, mask)

        if self.config.parallel_residual:
            if not self.config.shared_attention_norm:
                x_normed = self.norm_2(x)
            x = attention_output + x
        else:
            x = attention_output + x
            x_normed = self.norm_2(x)

        return self.mlp(x_normed) + x


class CausalSelfAttention(nn.Module):
    def __init__(self, config: Config, block_idx: int) -> None:
        super().__init__()
        # key, query and value projections for all heads, but in a batch
        self.qkv = nn.Linear(
            config.n_embd,
            (config.n_head + 2 * config.n_query_groups) * config.head_size,  # support for grouped/multi queries
            bias=config.bias or config.attn_bias,
        )
        # output projection
        self.proj = nn.Linear(config.head_size * config.n_head, config.n_embd, bias=config.bias)
        self.config = config
        self.block_idx = block_idx

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        head_size = self.config.head_size
        n_head = self.config.n_head
        n_query_groups = self.config.n_query_groups
        B, T, C = x.size()  # batch size, sequence length, embedding dimensionality (n_embd)

        # Perform a single multiplication operation using a combined QKV matrix to calculate `query`, `key`, and `value`
        # instead of individually multiplying the input `x` with the respective weight matrices.
        qkv = self.qkv(x)  # (B, T, 3xC*)

        # Define query, key and value sizes.
        # If grouped/multi query is enabled, these sizes are not equal (see the diagram above).
        query_size = n_head * head_size
        key_size = value_size = n_query_groups * head_size
        # Split qkv into query, key and value matrices.
        q, k, v = qkv.split((query_size, key_size, value_size), dim=-1)  # 3x(B, T, C*)

        q = q.view(B, T, n_head, head_size)  # (B, T, nh_q, hs)
        k = k.view(B, T, n_query_groups, head_size)  # (B, T, n_query_groups, hs)
        v = v.view(B, T, n_query_groups, head_size)  # (B, T, n_query_groups, hs)

        q = q.transpose(1, 2)  # (B, nh_q, T, hs)
        k = k.transpose(1, 2)  # (B, nh_k, T, hs)
        v = v.transpose(1, 2)  # (B, nh_v, T, hs)

        # Grouped queries: balance the number of heads across all three matrices.
        if n_query_groups != n_head:
            q_per_kv = n_head // n_query_groups
            k = k.repeat_interleave(q_per_kv, dim=1)  # (B, nh_q, T, hs)
            v = v.repeat_interleave(q_per_kv, dim=1)  # (B, nh_q, T, hs)

        # ↓ (B, nh, T, hs) @ (B, nh, T, hs).mT --> (B, nh, T, T) @ (B, nh, T, hs) --> (B, nh, T, hs)
        y = self.scaled_dot_product_attention(q, k, v, mask)

        # Re-assemble all head outputs side by side.
        y = y.reshape(B, T, head_size * n_head)

        # Output projection.
        return self.proj(y)  # (B, T, C)

    def scaled_dot_product_attention(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        scale = 1.0 / math.sqrt(self.config.attention_scores_scalar or self.config.head_size)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, scale=scale, is_causal=mask is None)
        return y.transpose(1, 2)


class GptNeoxMLP(nn.Module):
    def __init__(self, config: Config, intermediate_size: int | None = None) -> None:
        super().__init__()
        self.intermediate_size = intermediate_size or config.intermediate_size
        self.fc = nn.Linear(config.n_embd, self.intermediate_size, bias=config.bias)
        self.proj = nn.Linear(self.intermediate_size, config.n_embd, bias=config.bias)
        self.config = config

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.fc(x)
        x = F.gelu(x, approximate=self.config.gelu_approximate)
        return self.proj(x)


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "Lightning-AI/litgpt litgpt/model.py @ 04205815e8849fe883825e3e858e62749c5d7f4d"
REFERENCE = {"n_head": 4, "activation": "gelu"}
BLOCK = Block
ARGS = {"config": Config(), "block_idx": 0}


def weights(b):
    a, m, C = b.attn, b.mlp, b.config.n_embd
    q, k, v = a.qkv.weight.split(C)
    bq, bk, bv = a.qkv.bias.split(C)
    return {
        "ln1": (b.norm_1.weight, b.norm_1.bias),
        "q": (q, bq),
        "k": (k, bk),
        "v": (v, bv),
        "proj": (a.proj.weight, a.proj.bias),
        "ln2": (b.norm_2.weight, b.norm_2.bias),
        "fc1": (m.fc.weight, m.fc.bias),
        "fc2": (m.proj.weight, m.proj.bias),
    }


SCALE = "scale = 1.0 / math.sqrt(self.config.attention_scores_scalar or self.config.head_size)"
SEQ = "        else:\n            x = attention_output + x\n            x_normed = self.norm_2(x)\n"
MISTAKES = {
    "no_scaling": [(SCALE, "scale = 1.0")],
    "wrong_scale": [(SCALE, "scale = 1.0 / math.sqrt(self.config.attention_scores_scalar or self.config.n_embd)")],
    "wrong_scale:1/hs": [(SCALE, "scale = 1.0 / (self.config.attention_scores_scalar or self.config.head_size)")],
    "future_leak": [("is_causal=mask is None)", "is_causal=False)")],
    "heads_mixed:merge": [("return y.transpose(1, 2)", "return y")],
    "heads_mixed:split": [
        ("q = q.view(B, T, n_head, head_size)", "q = q.reshape(B, n_head, T, head_size)"),
        ("k = k.view(B, T, n_query_groups, head_size)", "k = k.reshape(B, n_query_groups, T, head_size)"),
        ("v = v.view(B, T, n_query_groups, head_size)", "v = v.reshape(B, n_query_groups, T, head_size)"),
        ("q = q.transpose(1, 2)  # (B, nh_q, T, hs)\n", ""),
        ("k = k.transpose(1, 2)  # (B, nh_k, T, hs)\n", ""),
        ("v = v.transpose(1, 2)  # (B, nh_v, T, hs)\n", ""),
    ],
    "no_residual:attn": [(SEQ, SEQ.replace("x = attention_output + x", "x = attention_output"))],
    "no_residual:mlp": [("return self.mlp(x_normed) + x", "return self.mlp(x_normed)")],
    "shared_norm": [(SEQ, SEQ.replace("self.norm_2(x)", "self.norm_1(x)"))],
    "post_norm": [
        (
            "x_normed = self.norm_1(x)\n        attention_output = self.attn(x_normed, mask)",
            "attention_output = self.attn(x, mask)",
        ),
        (SEQ, "        else:\n            x = self.norm_1(attention_output + x)\n            x_normed = x\n"),
        ("return self.mlp(x_normed) + x", "return self.norm_2(self.mlp(x_normed) + x)"),
    ],
}
PAIRS = [("wrong_scale", "shared_norm"), ("future_leak", "no_residual:mlp")]
