# Source: huggingface/transformers, src/transformers/models/qwen2/modeling_qwen2.py
#   (Qwen2RMSNorm, Qwen2RotaryEmbedding, Qwen2MLP, Qwen2Attention, Qwen2DecoderLayer; Mistral's
#   modeling_mistral.py is the same block without the q/k/v biases), written for the zoo.
# Kept: bias=True on q_proj / k_proj / v_proj and none on o_proj, rope_theta 1e6, rotary in halves
# with the table cat((freqs, freqs)), RMSNorm in float32, repeat_kv, an explicit causal mask
# added to the scores, gate_proj / up_proj / down_proj with SiLU.
# Reduced: plain-argument constructor; rotary table and mask made in forward (the checker calls
# forward(x)); no sliding window, no cache, no dropout.
import torch
from torch import nn


class Qwen2RMSNorm(nn.Module):
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


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def repeat_kv(hidden_states, n_rep):
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


class Qwen2MLP(nn.Module):
    def __init__(self, hidden_size, intermediate_size):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.act_fn = nn.functional.silu

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class Qwen2Attention(nn.Module):
    def __init__(self, hidden_size, num_heads, num_key_value_heads):
        super().__init__()
        self.head_dim = hidden_size // num_heads
        self.num_key_value_groups = num_heads // num_key_value_heads
        self.scaling = self.head_dim**-0.5
        self.q_proj = nn.Linear(hidden_size, num_heads * self.head_dim, bias=True)
        self.k_proj = nn.Linear(hidden_size, num_key_value_heads * self.head_dim, bias=True)
        self.v_proj = nn.Linear(hidden_size, num_key_value_heads * self.head_dim, bias=True)
        self.o_proj = nn.Linear(num_heads * self.head_dim, hidden_size, bias=False)

    def forward(self, hidden_states, cos, sin, attention_mask):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        key_states = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)

        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        query_states = (query_states * cos) + (rotate_half(query_states) * sin)
        key_states = (key_states * cos) + (rotate_half(key_states) * sin)

        key_states = repeat_kv(key_states, self.num_key_value_groups)
        value_states = repeat_kv(value_states, self.num_key_value_groups)
        attn_weights = torch.matmul(query_states, key_states.transpose(2, 3)) * self.scaling
        attn_weights = attn_weights + attention_mask
        attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query_states.dtype)
        attn_output = torch.matmul(attn_weights, value_states)
        attn_output = attn_output.transpose(1, 2).reshape(*input_shape, -1).contiguous()
        return self.o_proj(attn_output)


class Qwen2DecoderLayer(nn.Module):
    def __init__(
        self,
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=80,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
    ):
        super().__init__()
        self.self_attn = Qwen2Attention(hidden_size, num_attention_heads, num_key_value_heads)
        self.mlp = Qwen2MLP(hidden_size, intermediate_size)
        self.input_layernorm = Qwen2RMSNorm(hidden_size, eps=rms_norm_eps)
        self.post_attention_layernorm = Qwen2RMSNorm(hidden_size, eps=rms_norm_eps)
        dim = hidden_size // num_attention_heads
        inv_freq = 1.0 / (rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, hidden_states):
        B, T, _ = hidden_states.shape
        position_ids = torch.arange(T, device=hidden_states.device).float()
        freqs = torch.outer(position_ids, self.inv_freq.float())  # (T, hs/2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[None].to(hidden_states.dtype), emb.sin()[None].to(hidden_states.dtype)
        mask = torch.full((T, T), float("-inf"), dtype=hidden_states.dtype, device=hidden_states.device)
        mask = torch.triu(mask, diagonal=1)

        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states = self.self_attn(hidden_states, cos, sin, mask)
        hidden_states = residual + hidden_states

        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        hidden_states = residual + hidden_states
        return hidden_states


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "huggingface/transformers src/transformers/models/qwen2/modeling_qwen2.py"
BLOCK = Qwen2DecoderLayer
ARGS = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 80}
REFERENCE = {
    "n_head": 4,
    "n_kv_head": 2,
    "norm": "rmsnorm",
    "mlp": "swiglu",
    "norm_eps": 1e-6,
    "position": "rope",
    "rope_pairing": "halves",
    "rope_theta": 1e6,
}
TOLERANCE = 1e-6  # the norm and the rotary table compute in float32, as Hugging Face's do


def weights(b):
    a, m = b.self_attn, b.mlp
    return {
        "norm1.weight": b.input_layernorm.weight,
        "self_attn.in_proj_weight": torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]),
        "self_attn.in_proj_bias": torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]),
        "self_attn.out_proj.weight": a.o_proj.weight,
        "norm2.weight": b.post_attention_layernorm.weight,
        "linear1.weight": m.gate_proj.weight,
        "linear3.weight": m.up_proj.weight,
        "linear2.weight": m.down_proj.weight,
    }


KEY = "key_states = (key_states * cos) + (rotate_half(key_states) * sin)"
MISTAKES = {
    "rope_q_only": [(KEY, "key_states = key_states")],
    "rope_v": [(KEY, KEY + "\n        value_states = (value_states * cos) + (rotate_half(value_states) * sin)")],
    "rope_pairing": [("emb = torch.cat((freqs, freqs), dim=-1)", "emb = torch.repeat_interleave(freqs, 2, dim=-1)")],
    "rmsnorm_mean": [
        ("variance = hidden_states.pow(2).mean(-1, keepdim=True)", "variance = hidden_states.mean(-1, keepdim=True)")
    ],
    "rmsnorm_dim": [
        (
            "variance = hidden_states.pow(2).mean(-1, keepdim=True)",
            "variance = hidden_states.pow(2).mean(1, keepdim=True)",
        )
    ],
    "swiglu_silu": [
        (
            "return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))",
            "return self.down_proj(self.act_fn(self.gate_proj(x) * self.up_proj(x)))",
        )
    ],
    "mask_after_softmax:additive": [
        ("attn_weights = attn_weights + attention_mask", "attn_weights = attn_weights"),
        (
            "attn_output = torch.matmul(attn_weights, value_states)",
            "attn_output = torch.matmul(attn_weights.masked_fill(attention_mask == float('-inf'), 0.0), value_states)",
        ),
    ],
}
PAIRS = [("rope_pairing", "swiglu_silu")]
