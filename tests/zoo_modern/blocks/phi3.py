# Source: huggingface/transformers, src/transformers/models/phi3/modeling_phi3.py
#   (Phi3RMSNorm, Phi3MLP with gate_up_proj, Phi3Attention with qkv_proj and partial rotary,
#   Phi3DecoderLayer, eager attention), written for the zoo.
# Kept: q, k, v packed in qkv_proj and sliced [q | k | v]; gate and up packed in gate_up_proj and
# split with chunk(2, dim=-1), the gate first; the rotary embedding on the first rotary_ndims channels
# of each head (partial_rotary_factor, as Phi-4-mini's) in halves, the rest passed through.
# Changed for the zoo: partial_rotary_factor 0.5 and rope_theta 8e6, a base the checker lists nowhere
# (it reads the base from the block).
# Reduced: plain-argument constructor; rotary table and mask made in forward (the checker calls
# forward(x)); no sliding window, no cache, no dropout, no resid dropout.
import torch
from torch import nn


class Phi3RMSNorm(nn.Module):
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


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)

    rotary_dim = cos.shape[-1]
    q_rot, q_pass = q[..., :rotary_dim], q[..., rotary_dim:]
    k_rot, k_pass = k[..., :rotary_dim], k[..., rotary_dim:]

    q_embed = torch.cat([(q_rot * cos) + (rotate_half(q_rot) * sin), q_pass], dim=-1)
    k_embed = torch.cat([(k_rot * cos) + (rotate_half(k_rot) * sin), k_pass], dim=-1)
    return q_embed, k_embed


def repeat_kv(hidden_states, n_rep):
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


class Phi3MLP(nn.Module):
    def __init__(self, hidden_size, intermediate_size):
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.activation_fn = nn.functional.silu

    def forward(self, hidden_states):
        up_states = self.gate_up_proj(hidden_states)

        gate, up_states = up_states.chunk(2, dim=-1)
        up_states = up_states * self.activation_fn(gate)

        return self.down_proj(up_states)


class Phi3Attention(nn.Module):
    def __init__(self, hidden_size, num_attention_heads, num_key_value_heads):
        super().__init__()
        self.head_dim = hidden_size // num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.num_key_value_groups = num_attention_heads // num_key_value_heads
        self.scaling = self.head_dim**-0.5
        op_size = num_attention_heads * self.head_dim + 2 * (num_key_value_heads * self.head_dim)
        self.o_proj = nn.Linear(num_attention_heads * self.head_dim, hidden_size, bias=False)
        self.qkv_proj = nn.Linear(hidden_size, op_size, bias=False)

    def forward(self, hidden_states, position_embeddings, attention_mask):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)

        qkv = self.qkv_proj(hidden_states)
        query_pos = self.num_key_value_groups * self.num_key_value_heads * self.head_dim
        query_states = qkv[..., :query_pos]
        key_states = qkv[..., query_pos : query_pos + self.num_key_value_heads * self.head_dim]
        value_states = qkv[..., query_pos + self.num_key_value_heads * self.head_dim :]

        query_states = query_states.view(hidden_shape).transpose(1, 2)
        key_states = key_states.view(hidden_shape).transpose(1, 2)
        value_states = value_states.view(hidden_shape).transpose(1, 2)

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


class Phi3DecoderLayer(nn.Module):
    def __init__(
        self,
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        rms_norm_eps=1e-5,
        rope_theta=8000000.0,
        partial_rotary_factor=0.5,
    ):
        super().__init__()
        self.self_attn = Phi3Attention(hidden_size, num_attention_heads, num_key_value_heads)
        self.mlp = Phi3MLP(hidden_size, intermediate_size)
        self.input_layernorm = Phi3RMSNorm(hidden_size, eps=rms_norm_eps)
        self.post_attention_layernorm = Phi3RMSNorm(hidden_size, eps=rms_norm_eps)
        dim = int(hidden_size // num_attention_heads * partial_rotary_factor)
        inv_freq = 1.0 / (rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, hidden_states):
        B, T, _ = hidden_states.shape
        position_ids = torch.arange(T, device=hidden_states.device).float()
        freqs = torch.outer(position_ids, self.inv_freq.float())
        emb = torch.cat((freqs, freqs), dim=-1)
        position_embeddings = (emb.cos()[None].to(hidden_states.dtype), emb.sin()[None].to(hidden_states.dtype))
        mask = torch.full((T, T), float("-inf"), dtype=hidden_states.dtype, device=hidden_states.device)
        attention_mask = torch.triu(mask, diagonal=1)

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

SOURCE = "huggingface/transformers src/transformers/models/phi3/modeling_phi3.py"
BLOCK = Phi3DecoderLayer
ARGS = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64}
REFERENCE = {
    "n_head": 4,
    "n_kv_head": 2,
    "norm": "rmsnorm",
    "mlp": "swiglu",
    "norm_eps": 1e-5,
    "position": "rope",
    "rotary_dim": 4,
    "rope_pairing": "halves",
    "rope_theta": 8e6,
}
TOLERANCE = 1e-6  # the norm and the rotary table compute in float32, as Hugging Face's do


def weights(b):
    a, m = b.self_attn, b.mlp
    H = m.down_proj.weight.shape[1]
    return {
        "norm1.weight": b.input_layernorm.weight,
        "self_attn.in_proj_weight": a.qkv_proj.weight,
        "self_attn.out_proj.weight": a.o_proj.weight,
        "norm2.weight": b.post_attention_layernorm.weight,
        "linear1.weight": m.gate_up_proj.weight[:H],
        "linear3.weight": m.gate_up_proj.weight[H:],
        "linear2.weight": m.down_proj.weight,
    }


MISTAKES = {
    "rope_v": [
        (
            "query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)",
            "query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)\n"
            "        value_states, _ = apply_rotary_pos_emb(value_states, value_states, cos, sin)",
        )
    ],
    "rope_pairing": [("emb = torch.cat((freqs, freqs), dim=-1)", "emb = torch.repeat_interleave(freqs, 2, dim=-1)")],
    "swiglu_silu": [
        (
            "up_states = up_states * self.activation_fn(gate)",
            "up_states = self.activation_fn(up_states * gate)",
        )
    ],
    "rmsnorm_mean": [
        ("variance = hidden_states.pow(2).mean(-1, keepdim=True)", "variance = hidden_states.mean(-1, keepdim=True)")
    ],
    "mask_after_softmax": [
        ("attn_weights = attn_weights + attention_mask", "attn_weights = attn_weights"),
        (
            "attn_output = torch.matmul(attn_weights, value_states)",
            "attn_output = torch.matmul(attn_weights.masked_fill(attention_mask == float('-inf'), 0.0), value_states)",
        ),
    ],
}
PAIRS = [("rope_v", "swiglu_silu")]
