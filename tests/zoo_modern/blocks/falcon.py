# Source: huggingface/transformers, src/transformers/models/falcon/modeling_falcon.py at commit
#   00dcc6dda6f6d8e69541a6b51f97986a80242367 (FalconLinear, rotate_half, apply_rotary_pos_emb,
#   FalconRotaryEmbedding, dropout_add, FalconAttention, FalconMLP, FalconDecoderLayer), written for the zoo.
# Kept: the configuration of Falcon2-11B: new_decoder_architecture with num_ln_in_parallel_attn=1 (one
# input_layernorm read by both branches, the MLP output added to the attention output, then to the
# residual), q, k, v packed per key/value group in query_key_value ([q_0 .. q_{g-1}, k, v] for each group,
# split by _split_heads' view(batch, seq_len, -1, nh // nkv + 2, hs)), the key/value heads broadcast to the
# query heads before the rotary embedding, FalconLinear's input @ weight.T, no biases, LayerNorm with bias,
# the eager attention path (scores /= sqrt(hs), softmax of scores + an additive mask), exact GELU MLP
# dense_h_to_4h / dense_4h_to_h; _split_heads keeps its three branches.
# Reduced: a plain-argument constructor that builds the config object the source's classes read; the
# rotary table (FalconModel's) and the causal mask (finfo.min above the diagonal) made in forward; no
# alibi, no cache, no flash / sdpa branches, no head_mask, output_attentions; get_activation("gelu") as
# nn.GELU(); dropouts kept at p=0.
import math

import torch
from torch import nn
from torch.nn import LayerNorm
from torch.nn import functional as F


class FalconConfig:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


class FalconLinear(nn.Linear):
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        hidden_states = input @ self.weight.T
        if self.bias is None:
            return hidden_states
        return hidden_states + self.bias


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


class FalconRotaryEmbedding(nn.Module):
    def __init__(self, config: FalconConfig, device=None):
        super().__init__()
        self.config = config
        dim = config.hidden_size // config.num_attention_heads
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


def dropout_add(x: torch.Tensor, residual: torch.Tensor, prob: float, training: bool) -> torch.Tensor:
    out = F.dropout(x, p=prob, training=training)
    out = residual + out
    return out


class FalconAttention(nn.Module):
    def __init__(self, config: FalconConfig, layer_idx=None):
        super().__init__()

        self.config = config
        self.hidden_size = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_dim = self.hidden_size // self.num_heads
        self.split_size = self.hidden_size
        self.hidden_dropout = config.hidden_dropout
        self.max_position_embeddings = config.max_position_embeddings
        self.rope_theta = config.rope_theta
        self.is_causal = True
        self.layer_idx = layer_idx

        if self.head_dim * self.num_heads != self.hidden_size:
            raise ValueError(
                f"`hidden_size` must be divisible by num_heads (got `hidden_size`: {self.hidden_size} and `num_heads`:"
                f" {self.num_heads})."
            )

        # Layer-wise attention scaling
        self.inv_norm_factor = 1.0 / math.sqrt(self.head_dim)
        self.beta = self.inv_norm_factor
        if config.new_decoder_architecture:
            qkv_out_dim = (config.num_kv_heads * 2 + config.num_attention_heads) * self.head_dim
        elif config.multi_query:
            qkv_out_dim = self.hidden_size + 2 * self.head_dim
        else:
            qkv_out_dim = 3 * self.hidden_size
        self.query_key_value = FalconLinear(self.hidden_size, qkv_out_dim, bias=config.bias)
        self.new_decoder_architecture = config.new_decoder_architecture
        self.multi_query = config.multi_query
        self.dense = FalconLinear(self.hidden_size, self.hidden_size, bias=config.bias)
        self.attention_dropout = nn.Dropout(config.attention_dropout)
        self.num_kv_heads = config.num_kv_heads if (self.new_decoder_architecture or not self.multi_query) else 1

    def _split_heads(self, fused_qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.new_decoder_architecture:
            batch, seq_len, _ = fused_qkv.shape
            qkv = fused_qkv.view(batch, seq_len, -1, self.num_heads // self.num_kv_heads + 2, self.head_dim)
            query = qkv[:, :, :, :-2]
            key = qkv[:, :, :, [-2]]
            value = qkv[:, :, :, [-1]]
            key = torch.broadcast_to(key, query.shape)
            value = torch.broadcast_to(value, query.shape)

            query, key, value = [x.flatten(2, 3) for x in (query, key, value)]
            return query, key, value
        elif not self.multi_query:
            batch_size, seq_length, three_times_hidden_size = fused_qkv.shape
            fused_qkv = fused_qkv.view(batch_size, seq_length, self.num_heads, 3, self.head_dim)
            return fused_qkv[..., 0, :], fused_qkv[..., 1, :], fused_qkv[..., 2, :]
        else:
            batch_size, seq_length, three_times_hidden_size = fused_qkv.shape
            fused_qkv = fused_qkv.view(batch_size, seq_length, self.num_heads + 2, self.head_dim)
            return fused_qkv[..., :-2, :], fused_qkv[..., [-2], :], fused_qkv[..., [-1], :]

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
    ):
        fused_qkv = self.query_key_value(hidden_states)  # [batch_size, seq_length, 3 x hidden_size]
        num_kv_heads = self.num_heads if self.new_decoder_architecture else self.num_kv_heads
        # 3 x [batch_size, seq_length, num_heads, head_dim]
        (query_layer, key_layer, value_layer) = self._split_heads(fused_qkv)

        batch_size, query_length, _, _ = query_layer.shape

        query_layer = query_layer.transpose(1, 2).reshape(batch_size, self.num_heads, query_length, self.head_dim)
        key_layer = key_layer.transpose(1, 2).reshape(batch_size, num_kv_heads, query_length, self.head_dim)
        value_layer = value_layer.transpose(1, 2).reshape(batch_size, num_kv_heads, query_length, self.head_dim)

        cos, sin = position_embeddings
        query_layer, key_layer = apply_rotary_pos_emb(query_layer, key_layer, cos, sin)

        attention_scores = query_layer @ key_layer.transpose(-1, -2)
        attention_scores /= math.sqrt(self.head_dim)

        attention_scores = F.softmax(attention_scores + attention_mask, dim=-1, dtype=hidden_states.dtype)
        # It is unclear why neither dropout nor head_mask is applied here (while it is with alibi).
        attn_output = attention_scores @ value_layer

        attn_output = attn_output.view(batch_size, self.num_heads, query_length, self.head_dim)
        attn_output = attn_output.permute(0, 2, 1, 3)
        attn_output = attn_output.reshape(batch_size, query_length, self.num_heads * self.head_dim)

        attn_output = self.dense(attn_output)
        return attn_output


class FalconMLP(nn.Module):
    def __init__(self, config: FalconConfig):
        super().__init__()
        hidden_size = config.hidden_size

        self.dense_h_to_4h = FalconLinear(hidden_size, config.ffn_hidden_size, bias=config.bias)
        self.act = nn.GELU()
        self.dense_4h_to_h = FalconLinear(config.ffn_hidden_size, hidden_size, bias=config.bias)
        self.hidden_dropout = config.hidden_dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.dense_h_to_4h(x))
        x = self.dense_4h_to_h(x)
        return x


class FalconDecoderLayer(nn.Module):
    def __init__(
        self,
        hidden_size=32,
        num_attention_heads=4,
        num_kv_heads=2,
        layer_norm_epsilon=1e-5,
        rope_theta=10000.0,
        layer_idx=0,
    ):
        super().__init__()
        config = FalconConfig(
            hidden_size=hidden_size,
            num_attention_heads=num_attention_heads,
            num_kv_heads=num_kv_heads,
            layer_norm_epsilon=layer_norm_epsilon,
            rope_theta=rope_theta,
            new_decoder_architecture=True,
            multi_query=True,
            parallel_attn=True,
            num_ln_in_parallel_attn=1,
            bias=False,
            ffn_hidden_size=4 * hidden_size,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            max_position_embeddings=2048,
        )
        self.num_heads = config.num_attention_heads

        self.self_attention = FalconAttention(config, layer_idx)
        self.mlp = FalconMLP(config)
        self.hidden_dropout = config.hidden_dropout
        self.config = config

        if config.num_ln_in_parallel_attn is None and config.new_decoder_architecture:
            config.num_ln_in_parallel_attn = 2

        if not config.parallel_attn:
            self.post_attention_layernorm = LayerNorm(hidden_size, eps=config.layer_norm_epsilon)
            self.input_layernorm = LayerNorm(hidden_size, eps=config.layer_norm_epsilon)
        else:
            if config.num_ln_in_parallel_attn == 2:
                # The layer norm before self-attention
                self.ln_attn = LayerNorm(hidden_size, eps=config.layer_norm_epsilon)
                # The layer norm before the MLP
                self.ln_mlp = LayerNorm(hidden_size, eps=config.layer_norm_epsilon)
            else:
                self.input_layernorm = LayerNorm(hidden_size, eps=config.layer_norm_epsilon)
        self.rotary_emb = FalconRotaryEmbedding(config=config)

    def forward(self, hidden_states: torch.Tensor):
        batch_size, seq_length, _ = hidden_states.shape
        position_ids = torch.arange(seq_length, device=hidden_states.device).unsqueeze(0)
        position_embeddings = self.rotary_emb(hidden_states, position_ids)
        min_dtype = torch.finfo(hidden_states.dtype).min
        attention_mask = torch.full(
            (seq_length, seq_length), min_dtype, dtype=hidden_states.dtype, device=hidden_states.device
        )
        attention_mask = torch.triu(attention_mask, diagonal=1)[None, None, :, :]

        residual = hidden_states

        if self.config.new_decoder_architecture and self.config.num_ln_in_parallel_attn == 2:
            attention_layernorm_out = self.ln_attn(hidden_states)
            mlp_layernorm_out = self.ln_mlp(hidden_states)
        else:
            attention_layernorm_out = self.input_layernorm(hidden_states)

        # Self attention.
        attention_output = self.self_attention(
            attention_layernorm_out,
            attention_mask=attention_mask,
            position_embeddings=position_embeddings,
        )

        if not self.config.new_decoder_architecture:
            if self.config.parallel_attn:
                mlp_layernorm_out = attention_layernorm_out
            else:
                residual = dropout_add(
                    attention_output, residual, self.config.attention_dropout, training=self.training
                )
                mlp_layernorm_out = self.post_attention_layernorm(residual)

        if (
            self.config.new_decoder_architecture
            and self.config.parallel_attn
            and self.config.num_ln_in_parallel_attn == 1
        ):
            mlp_layernorm_out = attention_layernorm_out

        # MLP.
        mlp_output = self.mlp(mlp_layernorm_out)

        if self.config.new_decoder_architecture or self.config.parallel_attn:
            mlp_output += attention_output

        output = dropout_add(mlp_output, residual, self.config.hidden_dropout, training=self.training)
        return output


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "huggingface/transformers src/transformers/models/falcon/modeling_falcon.py"
BLOCK = FalconDecoderLayer
ARGS = {"hidden_size": 32, "num_attention_heads": 4, "num_kv_heads": 2}
REFERENCE = {
    "n_head": 4,
    "n_kv_head": 2,
    "norm": "layernorm",
    "mlp": "dense",
    "activation": "gelu",
    "norm_eps": 1e-5,
    "parallel_residual": True,
    "position": "rope",
    "rope_pairing": "halves",
}
TOLERANCE = 1e-6  # the rotary table computes in float32, as Hugging Face's does


def weights(b):
    a, m = b.self_attention, b.mlp
    nkv, hs = a.num_kv_heads, a.head_dim
    C = a.hidden_size
    w = a.query_key_value.weight.reshape(nkv, a.num_heads // nkv + 2, hs, C)  # per group: q heads, k, v
    return {
        "norm1.weight": b.input_layernorm.weight,
        "norm1.bias": b.input_layernorm.bias,
        "self_attn.in_proj_weight": torch.cat(
            [w[:, :-2].reshape(-1, C), w[:, -2].reshape(-1, C), w[:, -1].reshape(-1, C)]
        ),
        "self_attn.out_proj.weight": a.dense.weight,
        "linear1.weight": m.dense_h_to_4h.weight,
        "linear2.weight": m.dense_4h_to_h.weight,
    }


SCORES = "attention_scores = F.softmax(attention_scores + attention_mask, dim=-1, dtype=hidden_states.dtype)"
ROPE = "query_layer, key_layer = apply_rotary_pos_emb(query_layer, key_layer, cos, sin)"
MISTAKES = {
    "future_leak": [
        (SCORES, "attention_scores = F.softmax(attention_scores, dim=-1, dtype=hidden_states.dtype)"),
    ],
    "softmax_dim": [
        (SCORES, "attention_scores = F.softmax(attention_scores + attention_mask, dim=-2, dtype=hidden_states.dtype)"),
    ],
    "no_scaling": [("        attention_scores /= math.sqrt(self.head_dim)\n", "")],
    "wrong_scale": [
        ("attention_scores /= math.sqrt(self.head_dim)", "attention_scores /= math.sqrt(self.hidden_size)"),
    ],
    "rope_v": [(ROPE, ROPE + "\n        value_layer, _ = apply_rotary_pos_emb(value_layer, value_layer, cos, sin)")],
    "rope_pairing": [("emb = torch.cat((freqs, freqs), dim=-1)", "emb = torch.repeat_interleave(freqs, 2, dim=-1)")],
    "heads_mixed:split": [
        (
            "query_layer = query_layer.transpose(1, 2).reshape(",
            "query_layer = query_layer.reshape(",
        ),
        ("key_layer = key_layer.transpose(1, 2).reshape(", "key_layer = key_layer.reshape("),
        ("value_layer = value_layer.transpose(1, 2).reshape(", "value_layer = value_layer.reshape("),
    ],
    "heads_mixed:merge": [("attn_output = attn_output.permute(0, 2, 1, 3)", "attn_output = attn_output")],
    "no_residual:dropped": [
        (
            "output = dropout_add(mlp_output, residual, self.config.hidden_dropout, training=self.training)",
            "output = F.dropout(mlp_output, p=self.config.hidden_dropout, training=self.training)",
        )
    ],
}
PAIRS = [("rope_pairing", "no_scaling"), ("future_leak", "heads_mixed:merge")]
