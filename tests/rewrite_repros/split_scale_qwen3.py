"""Qwen3's decoder layer (``tests/zoo_modern/blocks/qwen3.py``, a correct block), its scale moved
onto q and k: ``(q * r) @ (k * r)^T`` with ``r = scaling ** 0.5`` (the ``split_scale`` rewrite of
``tests/rewrites.py``, written out: no unused product left in the forward pass).

``gptblock check tests/rewrite_repros/split_scale_qwen3.py:Qwen3DecoderLayer`` gives FAIL
``no_scaling``; with ``SPLIT = False`` (``(q @ k^T) * scaling``, as Qwen3 writes it) it gives PASS."""

# Source: huggingface/transformers, src/transformers/models/qwen3/modeling_qwen3.py
#   (Qwen3RMSNorm, Qwen3Attention with q_norm / k_norm, Qwen3MLP, Qwen3DecoderLayer, eager attention),
#   written for the zoo.
# Kept: the qk norm (an RMSNorm over each head's head_dim) applied on the (B, T, nh, hs) layout before
# the transpose, rope_theta 1e6, rotary in halves with the table cat((freqs, freqs)), repeat_kv, the
# scores as torch.matmul(query, key_states.transpose(2, 3)) * scaling, no q/k/v bias.
# Reduced: plain-argument constructor; rotary table and mask made in forward (the checker calls
# forward(x)); no sliding window, no cache, no dropout.
import torch
from torch import nn

SPLIT = True


class Qwen3RMSNorm(nn.Module):
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
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed


def repeat_kv(hidden_states, n_rep):
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(
        batch, num_key_value_heads, n_rep, slen, head_dim
    )
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


class Qwen3MLP(nn.Module):
    def __init__(self, hidden_size, intermediate_size):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.act_fn = nn.functional.silu

    def forward(self, x):
        down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        return down_proj


class Qwen3Attention(nn.Module):
    def __init__(self, hidden_size, num_attention_heads, num_key_value_heads, rms_norm_eps):
        super().__init__()
        self.head_dim = hidden_size // num_attention_heads
        self.num_key_value_groups = num_attention_heads // num_key_value_heads
        self.scaling = self.head_dim**-0.5
        self.q_proj = nn.Linear(hidden_size, num_attention_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, num_key_value_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, num_key_value_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(num_attention_heads * self.head_dim, hidden_size, bias=False)
        self.q_norm = Qwen3RMSNorm(
            self.head_dim, eps=rms_norm_eps
        )  # unlike olmo, only on the head dim!
        self.k_norm = Qwen3RMSNorm(
            self.head_dim, eps=rms_norm_eps
        )  # thus post q_norm does not need reshape

    def forward(self, hidden_states, position_embeddings, attention_mask):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)

        query_states = self.q_norm(self.q_proj(hidden_states).view(hidden_shape)).transpose(1, 2)
        key_states = self.k_norm(self.k_proj(hidden_states).view(hidden_shape)).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)

        cos, sin = position_embeddings
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)

        key_states = repeat_kv(key_states, self.num_key_value_groups)
        value_states = repeat_kv(value_states, self.num_key_value_groups)
        if SPLIT:
            r = self.scaling**0.5
            attn_weights = torch.matmul(query_states * r, (key_states * r).transpose(2, 3))
        else:
            attn_weights = torch.matmul(query_states, key_states.transpose(2, 3)) * self.scaling
        attn_weights = attn_weights + attention_mask
        attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(
            query_states.dtype
        )
        attn_output = torch.matmul(attn_weights, value_states)
        attn_output = attn_output.transpose(1, 2).contiguous()
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        return self.o_proj(attn_output)


class Qwen3DecoderLayer(nn.Module):
    def __init__(
        self,
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
    ):
        super().__init__()
        self.self_attn = Qwen3Attention(
            hidden_size, num_attention_heads, num_key_value_heads, rms_norm_eps
        )
        self.mlp = Qwen3MLP(hidden_size, intermediate_size)
        self.input_layernorm = Qwen3RMSNorm(hidden_size, eps=rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(hidden_size, eps=rms_norm_eps)
        dim = hidden_size // num_attention_heads
        inv_freq = 1.0 / (rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, hidden_states):
        B, T, _ = hidden_states.shape
        position_ids = torch.arange(T, device=hidden_states.device).float()
        freqs = torch.outer(position_ids, self.inv_freq.float())
        emb = torch.cat((freqs, freqs), dim=-1)
        position_embeddings = (
            emb.cos()[None].to(hidden_states.dtype),
            emb.sin()[None].to(hidden_states.dtype),
        )
        mask = torch.full(
            (T, T), float("-inf"), dtype=hidden_states.dtype, device=hidden_states.device
        )
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
