# Source: huggingface/transformers, src/transformers/models/starcoder2/modeling_starcoder2.py at commit
#   00d4b3d2142cb4ced2f51b90614b5d26bc045015 (Starcoder2MLP, Starcoder2RotaryEmbedding, rotate_half,
#   apply_rotary_pos_emb, repeat_kv, eager_attention_forward, Starcoder2Attention, Starcoder2DecoderLayer),
#   written for the zoo.
# Kept: nn.LayerNorm (with bias, norm_epsilon) before each branch, use_bias=True on q/k/v/o_proj and on the
# MLP's c_fc / c_proj, gelu_pytorch_tanh (nn.GELU(approximate="tanh")), grouped key/value heads with
# repeat_kv, rope_theta 1e5 (StarCoder2-15B's), rotary in halves with cat((freqs, freqs)), the eager
# attention function (scores * scaling + mask, softmax in float32), the functional residual dropouts
# nn.functional.dropout(..., p=self.residual_dropout, training=self.training) after o_proj and after the MLP,
# here with residual_dropout 0.1 (off in eval).
# Reduced: a plain-argument constructor that builds the config object the source's classes read; the rotary
# table (computed by the attention's own rotary_emb from position_ids, as this version does) and the causal
# mask (finfo.min above the diagonal) made in forward; no sliding window, no cache, no attention interface
# dispatch, no deprecation decorators; ACT2FN["gelu_pytorch_tanh"] as nn.GELU(approximate="tanh").
from typing import Optional

import torch
from torch import nn


class Starcoder2Config:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


class Starcoder2MLP(nn.Module):
    def __init__(self, config: Starcoder2Config):
        super().__init__()
        embed_dim = config.hidden_size
        self.c_fc = nn.Linear(embed_dim, config.intermediate_size, bias=config.use_bias)
        self.c_proj = nn.Linear(config.intermediate_size, embed_dim, bias=config.use_bias)
        self.act = nn.GELU(approximate="tanh")
        self.residual_dropout = config.residual_dropout

    def forward(self, hidden_states: Optional[tuple[torch.FloatTensor]]) -> torch.FloatTensor:
        hidden_states = self.c_fc(hidden_states)
        hidden_states = self.act(hidden_states)
        hidden_states = self.c_proj(hidden_states)
        hidden_states = nn.functional.dropout(hidden_states, p=self.residual_dropout, training=self.training)
        return hidden_states


class Starcoder2RotaryEmbedding(nn.Module):
    inv_freq: torch.Tensor  # fix linting for `register_buffer`

    def __init__(self, config: Starcoder2Config, device=None):
        super().__init__()
        base = config.rope_theta
        head_dim = config.hidden_size // config.num_attention_heads
        dim = int(head_dim * 1.0)
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim))
        self.attention_scaling = 1.0
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.original_inv_freq = self.inv_freq
        self.config = config

    @torch.no_grad()
    def forward(self, x, position_ids):
        inv_freq_expanded = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1).to(x.device)
        position_ids_expanded = position_ids[:, None, :].float()

        device_type = x.device.type if isinstance(x.device.type, str) and x.device.type != "mps" else "cpu"
        with torch.autocast(device_type=device_type, enabled=False):  # Force float32
            freqs = (inv_freq_expanded.float() @ position_ids_expanded.float()).transpose(1, 2)
            emb = torch.cat((freqs, freqs), dim=-1)
            cos = emb.cos() * self.attention_scaling
            sin = emb.sin() * self.attention_scaling

        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


def rotate_half(x):
    """Rotates half the hidden dims of the input."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed


def repeat_kv(hidden_states: torch.Tensor, n_rep: int) -> torch.Tensor:
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
):
    key_states = repeat_kv(key, module.num_key_value_groups)
    value_states = repeat_kv(value, module.num_key_value_groups)

    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if attention_mask is not None:
        causal_mask = attention_mask[:, :, :, : key_states.shape[-2]]
        attn_weights = attn_weights + causal_mask

    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value_states)
    attn_output = attn_output.transpose(1, 2).contiguous()

    return attn_output, attn_weights


class Starcoder2Attention(nn.Module):
    """Multi-headed attention from 'Attention Is All You Need' paper"""

    def __init__(self, config: Starcoder2Config, layer_idx: Optional[int] = None):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        self.is_causal = True
        self.q_proj = nn.Linear(config.hidden_size, config.num_attention_heads * self.head_dim, bias=config.use_bias)
        self.k_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim, bias=config.use_bias)
        self.v_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim, bias=config.use_bias)
        self.o_proj = nn.Linear(config.num_attention_heads * self.head_dim, config.hidden_size, bias=config.use_bias)
        self.rotary_emb = Starcoder2RotaryEmbedding(config=config)
        self.residual_dropout = config.residual_dropout

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: Optional[torch.Tensor],
        position_ids: Optional[torch.LongTensor] = None,
        **kwargs,
    ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)

        query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        key_states = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)

        cos, sin = self.rotary_emb(hidden_states, position_ids)
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)

        attention_interface = eager_attention_forward

        attn_output, attn_weights = attention_interface(
            self,
            query_states,
            key_states,
            value_states,
            attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling,
            sliding_window=getattr(self.config, "sliding_window", None),  # diff with Llama
            **kwargs,
        )

        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        attn_output = self.o_proj(attn_output)
        attn_output = nn.functional.dropout(
            attn_output, p=self.residual_dropout, training=self.training
        )  # diff with Llama

        return attn_output, attn_weights


class Starcoder2DecoderLayer(nn.Module):
    def __init__(
        self,
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        norm_epsilon=1e-5,
        rope_theta=100000.0,
        residual_dropout=0.1,
        layer_idx=0,
    ):
        super().__init__()
        config = Starcoder2Config(
            hidden_size=hidden_size,
            num_attention_heads=num_attention_heads,
            num_key_value_heads=num_key_value_heads,
            intermediate_size=intermediate_size,
            norm_epsilon=norm_epsilon,
            rope_theta=rope_theta,
            residual_dropout=residual_dropout,
            attention_dropout=0.0,
            use_bias=True,
            sliding_window=None,
        )
        self.hidden_size = config.hidden_size
        self.self_attn = Starcoder2Attention(config=config, layer_idx=layer_idx)
        self.mlp = Starcoder2MLP(config)
        self.input_layernorm = nn.LayerNorm(config.hidden_size, eps=config.norm_epsilon)
        self.post_attention_layernorm = nn.LayerNorm(config.hidden_size, eps=config.norm_epsilon)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        seq_len = hidden_states.shape[1]
        position_ids = torch.arange(seq_len, device=hidden_states.device).unsqueeze(0)
        min_dtype = torch.finfo(hidden_states.dtype).min
        attention_mask = torch.full((seq_len, seq_len), min_dtype, dtype=hidden_states.dtype, device=hidden_states.device)
        attention_mask = torch.triu(attention_mask, diagonal=1)[None, None, :, :]

        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        # Self Attention
        hidden_states, _ = self.self_attn(
            hidden_states=hidden_states,
            attention_mask=attention_mask,
            position_ids=position_ids,
        )
        hidden_states = residual + hidden_states

        # Fully Connected
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        hidden_states = residual + hidden_states
        return hidden_states


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "huggingface/transformers src/transformers/models/starcoder2/modeling_starcoder2.py"
BLOCK = Starcoder2DecoderLayer
ARGS = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128}
REFERENCE = {
    "n_head": 4,
    "n_kv_head": 2,
    "norm": "layernorm",
    "mlp": "dense",
    "activation": "gelu_tanh",
    "norm_eps": 1e-5,
    "position": "rope",
    "rope_pairing": "halves",
    "rope_theta": 1e5,
}
TOLERANCE = 1e-6  # the rotary table computes in float32, as Hugging Face's does


def weights(b):
    a, m = b.self_attn, b.mlp
    return {
        "norm1.weight": b.input_layernorm.weight,
        "norm1.bias": b.input_layernorm.bias,
        "self_attn.in_proj_weight": torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]),
        "self_attn.in_proj_bias": torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]),
        "self_attn.out_proj.weight": a.o_proj.weight,
        "self_attn.out_proj.bias": a.o_proj.bias,
        "norm2.weight": b.post_attention_layernorm.weight,
        "norm2.bias": b.post_attention_layernorm.bias,
        "linear1.weight": m.c_fc.weight,
        "linear1.bias": m.c_fc.bias,
        "linear2.weight": m.c_proj.weight,
        "linear2.bias": m.c_proj.bias,
    }


ATTN_RESIDUAL = "        hidden_states = residual + hidden_states\n\n        # Fully Connected\n"
MISTAKES = {
    "gqa_order": [
        (
            "hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)",
            "hidden_states = hidden_states[:, None, :, :, :].expand(batch, n_rep, num_key_value_heads, slen, head_dim)",
        )
    ],
    "rope_q_only": [("k_embed = (k * cos) + (rotate_half(k) * sin)", "k_embed = k")],
    "wrong_scale": [("self.scaling = self.head_dim**-0.5", "self.scaling = config.hidden_size**-0.5")],
    "softmax_dim": [
        (
            "attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32)",
            "attn_weights = nn.functional.softmax(attn_weights, dim=-2, dtype=torch.float32)",
        )
    ],
    "dropout_in_eval": [
        (
            "hidden_states = nn.functional.dropout(hidden_states, p=self.residual_dropout, training=self.training)",
            "hidden_states = nn.functional.dropout(hidden_states, p=self.residual_dropout)",
        )
    ],
    "post_norm": [
        ("        residual = hidden_states\n        hidden_states = self.input_layernorm(hidden_states)\n",
         "        residual = hidden_states\n"),
        (ATTN_RESIDUAL, "        hidden_states = self.input_layernorm(residual + hidden_states)\n\n        # Fully Connected\n"),
        (
            "        hidden_states = self.post_attention_layernorm(hidden_states)\n"
            "        hidden_states = self.mlp(hidden_states)\n"
            "        hidden_states = residual + hidden_states\n",
            "        hidden_states = self.mlp(hidden_states)\n"
            "        hidden_states = self.post_attention_layernorm(residual + hidden_states)\n",
        ),
    ],
    "no_residual:attn": [(ATTN_RESIDUAL, "\n        # Fully Connected\n")],
    "shared_norm": [
        (
            "hidden_states = self.post_attention_layernorm(hidden_states)",
            "hidden_states = self.input_layernorm(hidden_states)",
        )
    ],
}
PAIRS = [("rope_q_only", "shared_norm"), ("gqa_order", "wrong_scale")]
