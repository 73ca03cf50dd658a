# Source: huggingface/transformers, src/transformers/models/stablelm/modeling_stablelm.py at commit
#   00dcc6dda6f6d8e69541a6b51f97986a80242367 (StableLmRotaryEmbedding, rotate_half, apply_rotary_pos_emb,
#   StableLmMLP, repeat_kv, StableLmAttention (eager), StableLmDecoderLayer), written for the zoo.
# Kept: nn.LayerNorm (with bias) before each branch, q/k/v biases (use_qkv_bias, as stablelm-2-1_6b) and
# no o_proj bias, the partial rotary embedding of StableLM (partial_rotary_factor 0.25: the first
# rotary_ndims = hs / 4 channels of each head rotated in halves, the rest passed through, as
# stablelm-2's config), repeat_kv, scores / math.sqrt(head_dim) with the mask added in place
# (attn_weights += causal_mask), the SwiGLU MLP gate_proj / up_proj / down_proj with SiLU, the decoder's
# use_parallel_residual branch (off, as stablelm-2-1_6b).
# Reduced: a plain-argument constructor that builds the config object the source's classes read; the
# rotary table (StableLmModel's, the default rope_init_fn inlined) and the causal mask (finfo.min above the
# diagonal) made in forward; no qk_layernorm (StableLmLayerNormPerHead: a per-head LayerNorm the modern
# reference has no option for), no cache, no sdpa / flash classes, no output_attentions; ACT2FN["silu"]
# as nn.SiLU(); dropouts kept at p=0.
import math

import torch
from torch import nn


class StableLmConfig:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


class StableLmRotaryEmbedding(nn.Module):
    def __init__(self, config: StableLmConfig, device=None):
        super().__init__()
        self.config = config
        head_dim = config.hidden_size // config.num_attention_heads
        dim = int(head_dim * config.partial_rotary_factor)
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        self.attention_scaling = 1.0
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.original_inv_freq = self.inv_freq

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


class StableLmMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.hidden_size = config.hidden_size
        self.intermediate_size = config.intermediate_size
        self.gate_proj = nn.Linear(self.hidden_size, self.intermediate_size, bias=False)
        self.up_proj = nn.Linear(self.hidden_size, self.intermediate_size, bias=False)
        self.down_proj = nn.Linear(self.intermediate_size, self.hidden_size, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        return down_proj


def repeat_kv(hidden_states: torch.Tensor, n_rep: int) -> torch.Tensor:
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


class StableLmAttention(nn.Module):
    """Multi-headed attention from 'Attention Is All You Need' paper"""

    def __init__(self, config: StableLmConfig, layer_idx=None):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx

        self.hidden_size = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_dim = self.hidden_size // self.num_heads
        self.num_key_value_heads = config.num_key_value_heads
        self.num_key_value_groups = self.num_heads // self.num_key_value_heads
        self.rope_theta = config.rope_theta
        self.rotary_ndims = int(self.head_dim * config.partial_rotary_factor)
        self.is_causal = True

        if (self.head_dim * self.num_heads) != self.hidden_size:
            raise ValueError(
                f"hidden_size must be divisible by num_heads (got `hidden_size`: {self.hidden_size}"
                f" and `num_heads`: {self.num_heads})."
            )
        self.q_proj = nn.Linear(self.hidden_size, self.num_heads * self.head_dim, bias=config.use_qkv_bias)
        self.k_proj = nn.Linear(self.hidden_size, self.num_key_value_heads * self.head_dim, bias=config.use_qkv_bias)
        self.v_proj = nn.Linear(self.hidden_size, self.num_key_value_heads * self.head_dim, bias=config.use_qkv_bias)
        self.o_proj = nn.Linear(self.hidden_size, self.hidden_size, bias=False)

        self.attention_dropout = nn.Dropout(config.attention_dropout)

    def forward(self, hidden_states, attention_mask=None, position_embeddings=None):
        bsz, q_len, _ = hidden_states.size()

        query_states = self.q_proj(hidden_states)
        key_states = self.k_proj(hidden_states)
        value_states = self.v_proj(hidden_states)

        query_states = query_states.view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)
        key_states = key_states.view(bsz, q_len, self.num_key_value_heads, self.head_dim).transpose(1, 2)
        value_states = value_states.view(bsz, q_len, self.num_key_value_heads, self.head_dim).transpose(1, 2)

        cos, sin = position_embeddings

        # Partial rotary embedding
        query_rot, query_pass = (
            query_states[..., : self.rotary_ndims],
            query_states[..., self.rotary_ndims :],
        )
        key_rot, key_pass = (
            key_states[..., : self.rotary_ndims],
            key_states[..., self.rotary_ndims :],
        )
        # [batch_size, seq_length, num_heads, head_dim // config.partial_rotary_factor]
        query_rot, key_rot = apply_rotary_pos_emb(query_rot, key_rot, cos, sin)

        # [batch_size, seq_length, num_heads, head_dim]
        query_states = torch.cat((query_rot, query_pass), dim=-1)
        key_states = torch.cat((key_rot, key_pass), dim=-1)

        # Repeat k/v heads if n_kv_heads < n_heads
        key_states = repeat_kv(key_states, self.num_key_value_groups)
        value_states = repeat_kv(value_states, self.num_key_value_groups)

        attn_weights = torch.matmul(query_states, key_states.transpose(2, 3)) / math.sqrt(self.head_dim)

        if attention_mask is not None:  # no matter the length, we just slice it
            causal_mask = attention_mask[:, :, :, : key_states.shape[-2]]
            attn_weights += causal_mask

        # upcast attention to fp32
        attn_weights = nn.functional.softmax(attn_weights, dtype=torch.float32, dim=-1).to(query_states.dtype)
        attn_weights = self.attention_dropout(attn_weights)

        attn_output = torch.matmul(attn_weights, value_states)

        if attn_output.size() != (bsz, self.num_heads, q_len, self.head_dim):
            raise ValueError(
                f"`attn_output` should be of size {(bsz, self.num_heads, q_len, self.head_dim)}, but is"
                f" {attn_output.size()}"
            )

        attn_output = attn_output.transpose(1, 2).contiguous()
        attn_output = attn_output.reshape(bsz, q_len, self.hidden_size)

        attn_output = self.o_proj(attn_output)

        return attn_output


class StableLmDecoderLayer(nn.Module):
    def __init__(
        self,
        hidden_size=32,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=88,
        layer_norm_eps=1e-5,
        rope_theta=10000.0,
        partial_rotary_factor=0.25,
        layer_idx=0,
    ):
        super().__init__()
        config = StableLmConfig(
            hidden_size=hidden_size,
            num_attention_heads=num_attention_heads,
            num_key_value_heads=num_key_value_heads,
            intermediate_size=intermediate_size,
            layer_norm_eps=layer_norm_eps,
            rope_theta=rope_theta,
            partial_rotary_factor=partial_rotary_factor,
            use_qkv_bias=True,
            use_parallel_residual=False,
            attention_dropout=0.0,
            hidden_dropout=0.0,
        )
        self.use_parallel_residual = config.use_parallel_residual
        self.hidden_size = config.hidden_size
        self.self_attn = StableLmAttention(config, layer_idx=layer_idx)
        self.mlp = StableLmMLP(config)
        self.input_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.post_attention_layernorm = None
        if not self.use_parallel_residual:
            self.post_attention_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout)
        self.rotary_emb = StableLmRotaryEmbedding(config=config)

    def forward(self, hidden_states):
        bsz, seq_len, _ = hidden_states.shape
        position_ids = torch.arange(seq_len, device=hidden_states.device).unsqueeze(0)
        position_embeddings = self.rotary_emb(hidden_states, position_ids)
        min_dtype = torch.finfo(hidden_states.dtype).min
        attention_mask = torch.full((seq_len, seq_len), min_dtype, dtype=hidden_states.dtype, device=hidden_states.device)
        attention_mask = torch.triu(attention_mask, diagonal=1)[None, None, :, :]

        residual = hidden_states

        hidden_states = self.input_layernorm(hidden_states)

        # Self Attention
        self_attn_output = self.self_attn(
            hidden_states=hidden_states,
            attention_mask=attention_mask,
            position_embeddings=position_embeddings,
        )

        # copied from transformers.models.gpt_neox.modeling_gpt_neox.GPTNeoXLayer.forward
        if self.use_parallel_residual:
            # x = x + attn(ln1(x)) + mlp(ln1(x))
            # Fully Connected
            mlp_output = self.mlp(hidden_states)
            mlp_output = self.dropout(mlp_output)
            hidden_states = residual + self_attn_output + mlp_output
        else:
            # x = x + attn(ln1(x))
            # x = x + mlp(ln2(x))
            residual = residual + self_attn_output
            # Fully Connected
            mlp_output = self.mlp(self.post_attention_layernorm(residual))
            mlp_output = self.dropout(mlp_output)
            hidden_states = residual + mlp_output

        return hidden_states


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "huggingface/transformers src/transformers/models/stablelm/modeling_stablelm.py"
BLOCK = StableLmDecoderLayer
ARGS = {"hidden_size": 32, "num_attention_heads": 2, "num_key_value_heads": 2, "intermediate_size": 88}
REFERENCE = {
    "n_head": 2,
    "norm": "layernorm",
    "mlp": "swiglu",
    "norm_eps": 1e-5,
    "position": "rope",
    "rotary_dim": 4,
    "rope_pairing": "halves",
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
        "norm2.weight": b.post_attention_layernorm.weight,
        "norm2.bias": b.post_attention_layernorm.bias,
        "linear1.weight": m.gate_proj.weight,
        "linear3.weight": m.up_proj.weight,
        "linear2.weight": m.down_proj.weight,
    }


ROPE = "query_rot, key_rot = apply_rotary_pos_emb(query_rot, key_rot, cos, sin)"
MLP = "down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))"
MISTAKES = {
    "rope_q_only": [(ROPE, "query_rot, _ = apply_rotary_pos_emb(query_rot, key_rot, cos, sin)")],
    "rope_pairing": [("emb = torch.cat((freqs, freqs), dim=-1)", "emb = torch.repeat_interleave(freqs, 2, dim=-1)")],
    "no_scaling": [
        (
            "attn_weights = torch.matmul(query_states, key_states.transpose(2, 3)) / math.sqrt(self.head_dim)",
            "attn_weights = torch.matmul(query_states, key_states.transpose(2, 3))",
        )
    ],
    "wrong_scale": [("/ math.sqrt(self.head_dim)", "/ math.sqrt(self.hidden_size)")],
    "future_leak": [
        (
            "            attention_mask=attention_mask,\n            position_embeddings=position_embeddings,",
            "            attention_mask=None,\n            position_embeddings=position_embeddings,",
        )
    ],
    "softmax_dim": [
        (
            "attn_weights = nn.functional.softmax(attn_weights, dtype=torch.float32, dim=-1)",
            "attn_weights = nn.functional.softmax(attn_weights, dtype=torch.float32, dim=-2)",
        )
    ],
    "heads_mixed:order": [
        ("attn_output = attn_output.transpose(1, 2).contiguous()", "attn_output = attn_output.permute(0, 2, 3, 1).contiguous()")
    ],
    "post_norm": [
        ("        hidden_states = self.input_layernorm(hidden_states)\n", ""),
        (
            "residual = residual + self_attn_output",
            "residual = self.input_layernorm(residual + self_attn_output)",
        ),
        (
            "mlp_output = self.mlp(self.post_attention_layernorm(residual))",
            "mlp_output = self.mlp(residual)",
        ),
        (
            "hidden_states = residual + mlp_output\n",
            "hidden_states = self.post_attention_layernorm(residual + mlp_output)\n",
        ),
    ],
    "no_residual:mlp": [("hidden_states = residual + mlp_output\n", "hidden_states = mlp_output\n")],
    "swiglu_swapped": [
        (MLP, "down_proj = self.down_proj(self.gate_proj(x) * self.act_fn(self.up_proj(x)))"),
    ],
}
PAIRS = [("rope_q_only", "no_residual:mlp"), ("rope_pairing", "softmax_dim")]
