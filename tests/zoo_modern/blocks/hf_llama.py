# Source: huggingface/transformers, src/transformers/models/llama/modeling_llama.py
#   (LlamaRMSNorm, LlamaRotaryEmbedding, rotate_half, apply_rotary_pos_emb, repeat_kv, LlamaMLP,
#   LlamaAttention's eager path, LlamaDecoderLayer), written for the zoo in its shape.
# Kept: the names (q_proj k_proj v_proj o_proj, gate_proj up_proj down_proj, input_layernorm
# post_attention_layernorm), RMSNorm computing in float32, rotary in halves with the table
# cat((freqs, freqs)), GQA through repeat_kv (expand + reshape), the eager softmax in float32.
# Reduced: a config of plain arguments; the rotary table and the causal mask are made in the
# layer's forward (the checker calls forward(x)); no cache, no dropout.

import torch
import torch.nn as nn


class LlamaRMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class LlamaRotaryEmbedding(nn.Module):
    def __init__(self, dim, base=10000.0):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x, position_ids):
        inv_freq_expanded = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        position_ids_expanded = position_ids[:, None, :].float()
        freqs = (inv_freq_expanded.float() @ position_ids_expanded.float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos()
        sin = emb.sin()
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed


def repeat_kv(hidden_states, n_rep):
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


class LlamaMLP(nn.Module):
    def __init__(self, hidden_size, intermediate_size):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        return down_proj


class LlamaAttention(nn.Module):
    def __init__(self, hidden_size, num_attention_heads, num_key_value_heads):
        super().__init__()
        self.head_dim = hidden_size // num_attention_heads
        self.num_key_value_groups = num_attention_heads // num_key_value_heads
        self.scaling = self.head_dim**-0.5
        self.q_proj = nn.Linear(hidden_size, num_attention_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, num_key_value_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, num_key_value_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(num_attention_heads * self.head_dim, hidden_size, bias=False)

    def forward(self, hidden_states, position_embeddings, attention_mask):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)

        query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        key_states = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)

        cos, sin = position_embeddings
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)

        key_states = repeat_kv(key_states, self.num_key_value_groups)
        value_states = repeat_kv(value_states, self.num_key_value_groups)
        attn_weights = torch.matmul(query_states, key_states.transpose(2, 3)) * self.scaling
        attn_weights = attn_weights + attention_mask
        attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query_states.dtype)
        attn_output = torch.matmul(attn_weights, value_states)
        attn_output = attn_output.transpose(1, 2).contiguous()

        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        return self.o_proj(attn_output)


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self,
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
    ):
        super().__init__()
        self.self_attn = LlamaAttention(hidden_size, num_attention_heads, num_key_value_heads)
        self.mlp = LlamaMLP(hidden_size, intermediate_size)
        self.input_layernorm = LlamaRMSNorm(hidden_size, eps=rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(hidden_size, eps=rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(hidden_size // num_attention_heads, base=rope_theta)

    def forward(self, hidden_states):
        B, T, _ = hidden_states.shape
        position_ids = torch.arange(T, device=hidden_states.device)[None].expand(B, T)
        position_embeddings = self.rotary_emb(hidden_states, position_ids)
        blocked = torch.triu(torch.ones(T, T, dtype=torch.bool, device=hidden_states.device), 1)
        attention_mask = torch.zeros(T, T, dtype=hidden_states.dtype, device=hidden_states.device)
        attention_mask = attention_mask.masked_fill(blocked, torch.finfo(hidden_states.dtype).min)

        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states = self.self_attn(hidden_states, position_embeddings, attention_mask)
        hidden_states = residual + hidden_states

        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        hidden_states = residual + hidden_states
        return hidden_states


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "huggingface/transformers src/transformers/models/llama/modeling_llama.py"
BLOCK = LlamaDecoderLayer
ARGS = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64}
REFERENCE = {
    "n_head": 4,
    "n_kv_head": 2,
    "norm": "rmsnorm",
    "mlp": "swiglu",
    "norm_eps": 1e-6,
    "position": "rope",
    "rope_pairing": "halves",
}
TOLERANCE = 1e-6  # the norm and the rotary table compute in float32, as Hugging Face's do


def weights(b):
    a, m = b.self_attn, b.mlp
    return {
        "norm1.weight": b.input_layernorm.weight,
        "self_attn.in_proj_weight": torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]),
        "self_attn.out_proj.weight": a.o_proj.weight,
        "norm2.weight": b.post_attention_layernorm.weight,
        "linear1.weight": m.gate_proj.weight,
        "linear3.weight": m.up_proj.weight,
        "linear2.weight": m.down_proj.weight,
    }


VARIANCE = "variance = hidden_states.pow(2).mean(-1, keepdim=True)"
ROPE = "query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)"
MLP = "down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))"
MISTAKES = {
    "rmsnorm_eps": [
        (
            "hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)",
            "hidden_states = hidden_states / (torch.sqrt(variance) + self.variance_epsilon)",
        )
    ],
    "rmsnorm_mean:square_of_mean": [(VARIANCE, "variance = hidden_states.mean(-1, keepdim=True).pow(2)")],
    "rmsnorm_dim": [(VARIANCE, "variance = hidden_states.pow(2).mean(1, keepdim=True)")],
    "rope_v": [
        (ROPE, ROPE + "\n        value_states, _ = apply_rotary_pos_emb(value_states, value_states, cos, sin)")
    ],
    "rope_q_only": [(ROPE, "query_states, _ = apply_rotary_pos_emb(query_states, key_states, cos, sin)")],
    "rope_pairing": [("emb = torch.cat((freqs, freqs), dim=-1)", "emb = torch.repeat_interleave(freqs, 2, dim=-1)")],
    "gqa_order": [
        (
            "hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)",
            "hidden_states = hidden_states[:, None, :, :, :].expand(batch, n_rep, num_key_value_heads, slen, head_dim)",
        )
    ],
    "swiglu_swapped": [(MLP, "down_proj = self.down_proj(self.gate_proj(x) * self.act_fn(self.up_proj(x)))")],
    "swiglu_silu": [(MLP, "down_proj = self.down_proj(self.act_fn(self.gate_proj(x) * self.up_proj(x)))")],
    "no_scaling": [
        (
            "attn_weights = torch.matmul(query_states, key_states.transpose(2, 3)) * self.scaling",
            "attn_weights = torch.matmul(query_states, key_states.transpose(2, 3))",
        )
    ],
    "no_residual:mlp": [("        hidden_states = residual + hidden_states\n        return", "        return")],
}
PAIRS = [("rope_q_only", "swiglu_silu"), ("gqa_order", "rmsnorm_eps")]
