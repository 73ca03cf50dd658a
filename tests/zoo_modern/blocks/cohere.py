# Source: huggingface/transformers, src/transformers/models/cohere/modeling_cohere.py at commit
#   015bfeb86891c5f5e450f48942260ac3e2cd2bf2 (CohereLayerNorm, CohereRotaryEmbedding, CohereMLP, repeat_kv,
#   eager_attention_forward, Cohere's rotate_half and apply_rotary_pos_emb, CohereAttention,
#   CohereDecoderLayer), written for the zoo.
# Kept: Command-R's parallel block (one CohereLayerNorm, a LayerNorm without bias computed in float32, read
# by the attention and the MLP: residual + hidden_states_attention + hidden_states_mlp), the rotary
# embedding on adjacent pairs (the table repeat_interleave(freqs, 2), rotate_half on x[..., ::2] and
# x[..., 1::2] stacked and flattened: "diff from Llama"), q and k cast to float() for the rotation, grouped
# key/value heads with repeat_kv, scores * scaling plus an additive mask, the SwiGLU MLP gate_proj /
# up_proj / down_proj, no attention bias, use_qk_norm off (as Command-R v01).
# Reduced: a plain-argument constructor that builds the config object the source's classes read; the
# rotary table (CohereModel's; the default rope_init_fn inlined, no dynamic update) and the causal mask
# (finfo.min above the diagonal) made in forward; no cache, no attention interface dispatch, no
# output_attentions; ACT2FN["silu"] as nn.SiLU().
import torch
from torch import nn


class CohereConfig:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


class CohereLayerNorm(nn.Module):
    def __init__(self, hidden_size=None, eps=1e-5, bias=False):
        """The hidden size can be a tuple or an int. The tuple is used for QKNorm to normalize across head_dim"""
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        mean = hidden_states.mean(-1, keepdim=True)
        variance = (hidden_states - mean).pow(2).mean(-1, keepdim=True)
        hidden_states = (hidden_states - mean) * torch.rsqrt(variance + self.variance_epsilon)
        hidden_states = self.weight.to(torch.float32) * hidden_states
        return hidden_states.to(input_dtype)


class CohereRotaryEmbedding(nn.Module):
    def __init__(self, config: CohereConfig, device=None):
        super().__init__()
        self.config = config
        base = config.rope_theta
        dim = config.hidden_size // config.num_attention_heads
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        self.attention_scaling = 1.0
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.original_inv_freq = self.inv_freq

    @torch.no_grad()
    def forward(self, x, position_ids):
        # Core RoPE block
        inv_freq_expanded = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        position_ids_expanded = position_ids[:, None, :].float()
        # Force float32 (see https://github.com/huggingface/transformers/pull/29285)
        device_type = x.device.type
        device_type = device_type if isinstance(device_type, str) and device_type != "mps" else "cpu"
        with torch.autocast(device_type=device_type, enabled=False):
            freqs = (inv_freq_expanded.float() @ position_ids_expanded.float()).transpose(1, 2)
            emb = torch.repeat_interleave(freqs, 2, dim=-1)  # diff from Llama: we interleave() instead of cat()
            cos = emb.cos()
            sin = emb.sin()

        # Advanced RoPE types (e.g. yarn) apply a post-processing scaling factor, equivalent to scaling attention
        cos = cos * self.attention_scaling
        sin = sin * self.attention_scaling

        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


class CohereMLP(nn.Module):
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


def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
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


def rotate_half(x):
    # Split and rotate. Note that this function is different from e.g. Llama.
    x1 = x[..., ::2]
    x2 = x[..., 1::2]
    rot_x = torch.stack([-x2, x1], dim=-1).flatten(-2)
    return rot_x


def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    dtype = q.dtype
    q = q.float()
    k = k.float()
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed.to(dtype=dtype), k_embed.to(dtype=dtype)


class CohereAttention(nn.Module):
    """Multi-headed attention from 'Attention Is All You Need' paper"""

    def __init__(self, config: CohereConfig, layer_idx=None):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = getattr(config, "head_dim", config.hidden_size // config.num_attention_heads)
        self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        self.is_causal = True

        self.q_proj = nn.Linear(
            config.hidden_size, config.num_attention_heads * self.head_dim, bias=config.attention_bias
        )
        self.k_proj = nn.Linear(
            config.hidden_size, config.num_key_value_heads * self.head_dim, bias=config.attention_bias
        )
        self.v_proj = nn.Linear(
            config.hidden_size, config.num_key_value_heads * self.head_dim, bias=config.attention_bias
        )
        self.o_proj = nn.Linear(
            config.num_attention_heads * self.head_dim, config.hidden_size, bias=config.attention_bias
        )
        self.use_qk_norm = config.use_qk_norm

    def forward(self, hidden_states, position_embeddings, attention_mask, **kwargs):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)

        query_states = self.q_proj(hidden_states).view(hidden_shape)
        key_states = self.k_proj(hidden_states).view(hidden_shape)
        value_states = self.v_proj(hidden_states).view(hidden_shape)

        query_states = query_states.transpose(1, 2)
        key_states = key_states.transpose(1, 2)
        value_states = value_states.transpose(1, 2)

        cos, sin = position_embeddings
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
            **kwargs,
        )

        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        attn_output = self.o_proj(attn_output)
        return attn_output, attn_weights


class CohereDecoderLayer(nn.Module):
    def __init__(
        self,
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=80,
        layer_norm_eps=1e-5,
        rope_theta=10000.0,
        layer_idx=0,
    ):
        super().__init__()
        config = CohereConfig(
            hidden_size=hidden_size,
            num_attention_heads=num_attention_heads,
            num_key_value_heads=num_key_value_heads,
            intermediate_size=intermediate_size,
            layer_norm_eps=layer_norm_eps,
            rope_theta=rope_theta,
            attention_bias=False,
            attention_dropout=0.0,
            use_qk_norm=False,
        )
        self.hidden_size = config.hidden_size
        self.self_attn = CohereAttention(config=config, layer_idx=layer_idx)
        self.mlp = CohereMLP(config)
        self.input_layernorm = CohereLayerNorm(hidden_size=(config.hidden_size), eps=config.layer_norm_eps)
        self.rotary_emb = CohereRotaryEmbedding(config=config)

    def forward(self, hidden_states):
        sequence_length = hidden_states.shape[1]
        position_ids = torch.arange(sequence_length, device=hidden_states.device).unsqueeze(0)
        position_embeddings = self.rotary_emb(hidden_states, position_ids)
        min_dtype = torch.finfo(hidden_states.dtype).min
        causal_mask = torch.full(
            (sequence_length, sequence_length), fill_value=min_dtype, dtype=hidden_states.dtype, device=hidden_states.device
        )
        causal_mask = torch.triu(causal_mask, diagonal=1)[None, None, :, :]

        residual = hidden_states

        hidden_states = self.input_layernorm(hidden_states)

        # Self Attention
        hidden_states_attention, self_attn_weights = self.self_attn(
            hidden_states=hidden_states,
            attention_mask=causal_mask,
            position_embeddings=position_embeddings,
        )

        # Fully Connected
        hidden_states_mlp = self.mlp(hidden_states)

        # Add everything together
        hidden_states = residual + hidden_states_attention + hidden_states_mlp

        return hidden_states


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "huggingface/transformers src/transformers/models/cohere/modeling_cohere.py"
BLOCK = CohereDecoderLayer
ARGS = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 80}
REFERENCE = {
    "n_head": 4,
    "n_kv_head": 2,
    "norm": "layernorm",
    "mlp": "swiglu",
    "norm_eps": 1e-5,
    "parallel_residual": True,
    "position": "rope",
    "rope_pairing": "adjacent",
}
TOLERANCE = 1e-6  # the norm, the rotary table and the rotation compute in float32, as Cohere's do


def weights(b):
    a, m = b.self_attn, b.mlp
    return {
        "norm1.weight": b.input_layernorm.weight,
        "self_attn.in_proj_weight": torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]),
        "self_attn.out_proj.weight": a.o_proj.weight,
        "linear1.weight": m.gate_proj.weight,
        "linear3.weight": m.up_proj.weight,
        "linear2.weight": m.down_proj.weight,
    }


ROPE = "query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)"
MISTAKES = {
    "rope_pairing": [
        (
            "emb = torch.repeat_interleave(freqs, 2, dim=-1)  # diff from Llama: we interleave() instead of cat()",
            "emb = torch.cat((freqs, freqs), dim=-1)",
        )
    ],
    "rope_v": [(ROPE, ROPE + "\n        value_states, _ = apply_rotary_pos_emb(value_states, value_states, cos, sin)")],
    "gqa_order": [
        (
            "hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)",
            "hidden_states = hidden_states[:, None, :, :, :].expand(batch, n_rep, num_key_value_heads, slen, head_dim)",
        )
    ],
    "swiglu_silu": [
        (
            "down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))",
            "down_proj = self.down_proj(self.act_fn(self.gate_proj(x) * self.up_proj(x)))",
        )
    ],
    "no_scaling": [("self.scaling = self.head_dim**-0.5", "self.scaling = 1.0")],
    "mask_after_softmax:additive": [
        ("attn_weights = attn_weights + causal_mask", "attn_weights = attn_weights"),
        (
            "attn_output = torch.matmul(attn_weights, value_states)",
            "attn_output = torch.matmul(attn_weights.masked_fill(causal_mask < 0, 0.0), value_states)",
        ),
    ],
    "no_residual:dropped": [
        (
            "hidden_states = residual + hidden_states_attention + hidden_states_mlp",
            "hidden_states = hidden_states_attention + hidden_states_mlp",
        )
    ],
    "heads_mixed:merge": [
        ("attn_output = attn_output.transpose(1, 2).contiguous()", "attn_output = attn_output.contiguous()")
    ],
}
PAIRS = [("rope_pairing", "gqa_order"), ("swiglu_silu", "no_residual:dropped")]
