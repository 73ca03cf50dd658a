# Source: huggingface/transformers, src/transformers/models/phi/modeling_phi.py at commit
#   007750f36c2d23bbf9ecc769e49bc6b1a04f7393 (the first Phi port: PhiRotaryEmbedding, apply_rotary_pos_emb,
#   PhiMLP, PhiAttention, PhiDecoderLayer), written for the zoo.
# Kept: Phi-1.5's parallel block (one nn.LayerNorm read by the attention and the MLP, both added to the
# residual: attn_outputs + feed_forward_hidden_states + residual), biases on q/k/v/o_proj and on fc1/fc2,
# the MLP fc1 -> gelu_new (tanh GELU) -> fc2, the partial rotary embedding of rotary_dim channels of each
# head (here 6 of 8) with its own cos/sin cache of width rotary_dim / 2 (emb = freqs, no cat) built at
# init in the default dtype, cos[position_ids], q and k transposed to (B, T, nh, hs) and rotated in halves
# by q_rot.chunk(2), scores / math.sqrt(head_dim) plus an additive mask (finfo.min above the diagonal, as
# _make_causal_mask), the softmax upcast to float32.
# Reduced: a plain-argument constructor that builds the config object the source's classes read; the
# position_ids and the causal mask made in forward (PhiModel's); no cache, no pretraining_tp slicing, no
# flash attention class; ACT2FN["gelu_new"] written out as Hugging Face's NewGELUActivation; resid_pdrop 0;
# _make_causal_mask's torch.full given dtype=dtype (the source fills a float32 tensor with finfo(dtype).min,
# which raises for float64 inputs), and without its past_key_values_length / expand-mask parts.
import math

import torch
from torch import nn


class PhiConfig:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


class NewGELUActivation(nn.Module):
    def forward(self, input):
        return 0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (input + 0.044715 * torch.pow(input, 3.0))))


class PhiRotaryEmbedding(nn.Module):
    def __init__(self, dim, max_position_embeddings=2048, base=10000, device=None):
        super().__init__()

        self.dim = dim
        self.max_position_embeddings = max_position_embeddings
        self.base = base
        inv_freq = 1.0 / (self.base ** (torch.arange(0, self.dim, 2).float().to(device) / self.dim))
        self.register_buffer("inv_freq", inv_freq)

        # Build here to make `torch.jit.trace` work.
        self._set_cos_sin_cache(
            seq_len=max_position_embeddings, device=self.inv_freq.device, dtype=torch.get_default_dtype()
        )

    def _set_cos_sin_cache(self, seq_len, device, dtype):
        self.max_seq_len_cached = seq_len
        t = torch.arange(self.max_seq_len_cached, device=device, dtype=self.inv_freq.dtype)

        freqs = torch.einsum("i,j->ij", t, self.inv_freq)
        emb = freqs
        self.register_buffer("cos_cached", emb.cos().to(dtype), persistent=False)
        self.register_buffer("sin_cached", emb.sin().to(dtype), persistent=False)

    def forward(self, x, seq_len=None):
        # x: [bs, num_attention_heads, seq_len, head_size]
        if seq_len > self.max_seq_len_cached:
            self._set_cos_sin_cache(seq_len=seq_len, device=x.device, dtype=x.dtype)

        return (
            self.cos_cached[:seq_len, ...].to(dtype=x.dtype),
            self.sin_cached[:seq_len, ...].to(dtype=x.dtype),
        )


def apply_rotary_pos_emb(q, k, cos, sin, position_ids, rotary_dim):
    q = q.transpose(1, 2)
    k = k.transpose(1, 2)
    cos = cos[position_ids].unsqueeze(2)
    sin = sin[position_ids].unsqueeze(2)

    # seperate which portions to apply rotary embeddings to and which ones to pass.
    q_rot = q[:, :, :, :rotary_dim]
    q_pass = q[:, :, :, rotary_dim:]
    k_rot = k[:, :, :, :rotary_dim]
    k_pass = k[:, :, :, rotary_dim:]

    # Splits the queries and keys in half
    q1, q2 = q_rot.chunk(2, dim=-1)
    k1, k2 = k_rot.chunk(2, dim=-1)

    # apply sin and cos
    q_rot = torch.cat([q1 * cos - q2 * sin, q1 * sin + q2 * cos], axis=-1)
    k_rot = torch.cat([k1 * cos - k2 * sin, k1 * sin + k2 * cos], axis=-1)

    # concatenate the `_pass` and `_rot` embeddings.
    q_embed = torch.cat([q_rot, q_pass], dim=-1).transpose(1, 2)
    k_embed = torch.cat([k_rot, k_pass], dim=-1).transpose(1, 2)

    return q_embed, k_embed


class PhiMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.activation_fn = NewGELUActivation()
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        hidden_states = self.fc1(hidden_states)
        hidden_states = self.activation_fn(hidden_states)
        hidden_states = self.fc2(hidden_states)
        return hidden_states


class PhiAttention(nn.Module):
    """Multi-headed attention from 'Attention Is All You Need' paper"""

    def __init__(self, config: PhiConfig):
        super().__init__()
        self.config = config
        self.hidden_size = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_dim = self.hidden_size // self.num_heads
        self.max_position_embeddings = config.max_position_embeddings
        self.rope_theta = config.rope_theta
        self.rotary_dim = config.rotary_dim

        if (self.head_dim * self.num_heads) != self.hidden_size:
            raise ValueError(
                f"hidden_size must be divisible by num_heads (got `hidden_size`: {self.hidden_size}"
                f" and `num_heads`: {self.num_heads})."
            )
        self.q_proj = nn.Linear(self.hidden_size, self.num_heads * self.head_dim, bias=True)
        self.k_proj = nn.Linear(self.hidden_size, self.num_heads * self.head_dim, bias=True)
        self.v_proj = nn.Linear(self.hidden_size, self.num_heads * self.head_dim, bias=True)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, self.hidden_size, bias=True)

        self.rotary_emb = PhiRotaryEmbedding(
            self.rotary_dim,
            max_position_embeddings=self.max_position_embeddings,
            base=self.rope_theta,
        )

    def forward(self, hidden_states, attention_mask=None, position_ids=None):
        bsz, q_len, _ = hidden_states.size()

        query_states = self.q_proj(hidden_states)
        key_states = self.k_proj(hidden_states)
        value_states = self.v_proj(hidden_states)

        query_states = query_states.view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)
        key_states = key_states.view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)
        value_states = value_states.view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)

        kv_seq_len = key_states.shape[-2]
        cos, sin = self.rotary_emb(value_states, seq_len=kv_seq_len)
        query_states, key_states = apply_rotary_pos_emb(
            query_states, key_states, cos, sin, position_ids, self.rotary_dim
        )

        attn_weights = torch.matmul(query_states, key_states.transpose(2, 3)) / math.sqrt(self.head_dim)

        if attn_weights.size() != (bsz, self.num_heads, q_len, kv_seq_len):
            raise ValueError(
                f"Attention weights should be of size {(bsz, self.num_heads, q_len, kv_seq_len)}, but is"
                f" {attn_weights.size()}"
            )

        if attention_mask is not None:
            if attention_mask.size() != (bsz, 1, q_len, kv_seq_len):
                raise ValueError(
                    f"Attention mask should be of size {(bsz, 1, q_len, kv_seq_len)}, but is {attention_mask.size()}"
                )
            attn_weights = attn_weights + attention_mask

        # upcast attention to fp32
        attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query_states.dtype)
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


def _make_causal_mask(input_ids_shape: torch.Size, dtype: torch.dtype, device: torch.device):
    bsz, tgt_len = input_ids_shape
    mask = torch.full((tgt_len, tgt_len), torch.finfo(dtype).min, dtype=dtype, device=device)
    mask_cond = torch.arange(mask.size(-1), device=device)
    mask.masked_fill_(mask_cond < (mask_cond + 1).view(mask.size(-1), 1), 0)
    mask = mask.to(dtype)
    return mask[None, None, :, :].expand(bsz, 1, tgt_len, tgt_len)


class PhiDecoderLayer(nn.Module):
    def __init__(
        self,
        hidden_size=32,
        num_attention_heads=4,
        intermediate_size=128,
        rotary_dim=6,
        layer_norm_epsilon=1e-5,
        rope_theta=10000.0,
        resid_pdrop=0.0,
    ):
        super().__init__()
        config = PhiConfig(
            hidden_size=hidden_size,
            num_attention_heads=num_attention_heads,
            intermediate_size=intermediate_size,
            rotary_dim=rotary_dim,
            layer_norm_epsilon=layer_norm_epsilon,
            rope_theta=rope_theta,
            resid_pdrop=resid_pdrop,
            max_position_embeddings=2048,
        )
        self.self_attn = PhiAttention(config=config)
        self.mlp = PhiMLP(config)
        self.input_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_epsilon)
        self.resid_dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, hidden_states):
        batch_size, seq_length, _ = hidden_states.shape
        position_ids = torch.arange(seq_length, dtype=torch.long, device=hidden_states.device)
        position_ids = position_ids.unsqueeze(0).view(-1, seq_length)
        attention_mask = _make_causal_mask((batch_size, seq_length), hidden_states.dtype, device=hidden_states.device)

        residual = hidden_states

        hidden_states = self.input_layernorm(hidden_states)

        # Self Attention
        attn_outputs = self.self_attn(
            hidden_states=hidden_states,
            attention_mask=attention_mask,
            position_ids=position_ids,
        )
        attn_outputs = self.resid_dropout(attn_outputs)

        feed_forward_hidden_states = self.resid_dropout(self.mlp(hidden_states))
        hidden_states = attn_outputs + feed_forward_hidden_states + residual
        return hidden_states


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "huggingface/transformers src/transformers/models/phi/modeling_phi.py"
BLOCK = PhiDecoderLayer
ARGS = {"hidden_size": 32, "num_attention_heads": 4, "intermediate_size": 128, "rotary_dim": 6}
REFERENCE = {
    "n_head": 4,
    "norm": "layernorm",
    "mlp": "dense",
    "activation": "gelu_tanh",
    "norm_eps": 1e-5,
    "parallel_residual": True,
    "position": "rope",
    "rotary_dim": 6,
    "rope_pairing": "halves",
}
TOLERANCE = 1e-6  # the cos/sin cache is built in float32 at init, as the source's is


def weights(b):
    a, m = b.self_attn, b.mlp
    return {
        "norm1.weight": b.input_layernorm.weight,
        "norm1.bias": b.input_layernorm.bias,
        "self_attn.in_proj_weight": torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]),
        "self_attn.in_proj_bias": torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]),
        "self_attn.out_proj.weight": a.o_proj.weight,
        "self_attn.out_proj.bias": a.o_proj.bias,
        "linear1.weight": m.fc1.weight,
        "linear1.bias": m.fc1.bias,
        "linear2.weight": m.fc2.weight,
        "linear2.bias": m.fc2.bias,
    }


ROPE = """        query_states, key_states = apply_rotary_pos_emb(
            query_states, key_states, cos, sin, position_ids, self.rotary_dim
        )
"""
MISTAKES = {
    "rope_v": [
        (
            ROPE,
            ROPE + "        value_states, _ = apply_rotary_pos_emb(\n"
            "            value_states, value_states, cos, sin, position_ids, self.rotary_dim\n"
            "        )\n",
        )
    ],
    "rope_q_only": [
        (
            "k_rot = torch.cat([k1 * cos - k2 * sin, k1 * sin + k2 * cos], axis=-1)",
            "k_rot = torch.cat([k1, k2], axis=-1)",
        )
    ],
    "wrong_scale:1/hs": [("/ math.sqrt(self.head_dim)", "/ self.head_dim")],
    "mask_after_softmax": [
        ("attn_weights = attn_weights + attention_mask", "attn_weights = attn_weights"),
        (
            "attn_output = torch.matmul(attn_weights, value_states)",
            "attn_weights = attn_weights.masked_fill(attention_mask < 0, 0.0)\n"
            "        attn_output = torch.matmul(attn_weights, value_states)",
        ),
    ],
    "future_leak": [
        (
            "            attention_mask=attention_mask,\n            position_ids=position_ids,",
            "            attention_mask=None,\n            position_ids=position_ids,",
        )
    ],
    "heads_mixed:merge": [
        ("attn_output = attn_output.transpose(1, 2).contiguous()", "attn_output = attn_output.contiguous()")
    ],
    "no_residual:dropped": [
        (
            "hidden_states = attn_outputs + feed_forward_hidden_states + residual",
            "hidden_states = attn_outputs + feed_forward_hidden_states",
        )
    ],
    "no_residual:normed": [
        (
            "        residual = hidden_states\n\n        hidden_states = self.input_layernorm(hidden_states)\n",
            "        hidden_states = self.input_layernorm(hidden_states)\n        residual = hidden_states\n",
        )
    ],
}
PAIRS = [("rope_q_only", "no_residual:dropped"), ("wrong_scale:1/hs", "heads_mixed:merge")]
