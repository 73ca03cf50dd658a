# Source: huggingface/transformers, src/transformers/models/opt/modeling_opt.py
#   commit 0184d2087e15afbd83ffa3cef25044a4f6c05047: eager_attention_forward, OPTAttention,
#   OPTDecoderLayer (and the 4-D causal mask OPTDecoder prepares).
# Kept: OPTDecoderLayer(config, layer_idx) with an OPTConfig-like config, the queries scaled
# right after q_proj ("we keep the original order of scaling") and the attention called with
# scaling=1.0, view(bsz, -1, num_heads, head_dim).transpose(1, 2), the additive mask, softmax in
# float32 cast back, functional dropout with training=self.training, do_layer_norm_before
# choosing pre- or post-norm, self_attn_layer_norm / final_layer_norm, the MLP run on a 2-D
# reshape(-1, C) and viewed back, fc1 / ReLU (activation_function="relu") / fc2.
# Reduced: eager attention only, no cache; the decoder's causal mask built in the layer.
from types import SimpleNamespace

import torch
from torch import nn

ACT2FN = {"relu": nn.ReLU(), "gelu": nn.GELU()}


def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    attn_weights = torch.matmul(query, key.transpose(-1, -2)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask

    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)

    attn_output = torch.matmul(attn_weights, value)
    attn_output = attn_output.transpose(1, 2).contiguous()

    return attn_output, attn_weights


class OPTAttention(nn.Module):
    """Multi-headed attention from 'Attention Is All You Need' paper"""

    def __init__(self, config, layer_idx=None, **kwargs):
        super().__init__()
        self.config = config
        self.embed_dim = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.dropout = config.attention_dropout
        self.enable_bias = config.enable_bias
        self.layer_idx = layer_idx

        self.head_dim = self.embed_dim // self.num_heads
        self.is_causal = True

        if (self.head_dim * self.num_heads) != self.embed_dim:
            raise ValueError(
                f"embed_dim must be divisible by num_heads (got `embed_dim`: {self.embed_dim} and `num_heads`: {self.num_heads})."
            )
        self.scaling = self.head_dim**-0.5

        self.k_proj = nn.Linear(self.embed_dim, self.embed_dim, bias=self.enable_bias)
        self.v_proj = nn.Linear(self.embed_dim, self.embed_dim, bias=self.enable_bias)
        self.q_proj = nn.Linear(self.embed_dim, self.embed_dim, bias=self.enable_bias)
        self.out_proj = nn.Linear(self.embed_dim, self.embed_dim, bias=self.enable_bias)

    def forward(self, hidden_states, attention_mask=None, **kwargs):
        """Input shape: Batch x Time x Channel"""
        bsz, tgt_len, _ = hidden_states.size()

        # Scaling is susceptible to floating point arithmetics' inprecisions
        # which can lead to different results (this is dependent from model
        # to model, e.g. whisper is one such case). We therefore keep the
        # original order of scaling to follow the original implementation
        # and enforce no scaling (1.0) in the attention call below.
        query_states = self.q_proj(hidden_states) * self.scaling
        query_states = query_states.view(bsz, -1, self.num_heads, self.head_dim).transpose(1, 2)

        key_states = self.k_proj(hidden_states)
        value_states = self.v_proj(hidden_states)
        key_states = key_states.view(bsz, -1, self.num_heads, self.head_dim).transpose(1, 2)
        value_states = value_states.view(bsz, -1, self.num_heads, self.head_dim).transpose(1, 2)

        attn_output, attn_weights = eager_attention_forward(
            self,
            query_states,
            key_states,
            value_states,
            attention_mask,
            dropout=0.0 if not self.training else self.dropout,
            scaling=1.0,
            **kwargs,
        )

        attn_output = attn_output.reshape(bsz, tgt_len, -1).contiguous()
        attn_output = self.out_proj(attn_output)

        return attn_output, attn_weights


class OPTDecoderLayer(nn.Module):
    def __init__(self, config, layer_idx=None):
        super().__init__()
        self.embed_dim = config.hidden_size

        self.self_attn = OPTAttention(config=config, layer_idx=layer_idx)

        self.do_layer_norm_before = config.do_layer_norm_before
        self.dropout = config.dropout
        self.activation_fn = ACT2FN[config.activation_function]

        self.self_attn_layer_norm = nn.LayerNorm(
            self.embed_dim, elementwise_affine=config.layer_norm_elementwise_affine
        )
        self.fc1 = nn.Linear(self.embed_dim, config.ffn_dim, bias=config.enable_bias)
        self.fc2 = nn.Linear(config.ffn_dim, self.embed_dim, bias=config.enable_bias)
        self.final_layer_norm = nn.LayerNorm(self.embed_dim, elementwise_affine=config.layer_norm_elementwise_affine)

    def forward(self, hidden_states, attention_mask=None):
        if attention_mask is None:  # OPTDecoder._prepare_4d_causal_attention_mask_with_cache_position
            sequence_length = hidden_states.shape[1]
            min_dtype = torch.finfo(hidden_states.dtype).min
            causal_mask = torch.full(
                (sequence_length, sequence_length),
                fill_value=min_dtype,
                dtype=hidden_states.dtype,
                device=hidden_states.device,
            )
            attention_mask = torch.triu(causal_mask, diagonal=1)[None, None, :, :]

        residual = hidden_states

        # 125m, 1.7B, ..., 175B applies layer norm BEFORE attention
        if self.do_layer_norm_before:
            hidden_states = self.self_attn_layer_norm(hidden_states)

        # Self Attention
        hidden_states, self_attn_weights = self.self_attn(hidden_states=hidden_states, attention_mask=attention_mask)
        hidden_states = nn.functional.dropout(hidden_states, p=self.dropout, training=self.training)
        hidden_states = residual + hidden_states

        # 350m applies layer norm AFTER attention
        if not self.do_layer_norm_before:
            hidden_states = self.self_attn_layer_norm(hidden_states)

        # Fully Connected
        hidden_states_shape = hidden_states.shape
        hidden_states = hidden_states.reshape(-1, hidden_states.size(-1))
        residual = hidden_states

        # 125m, 1.7B, ..., 175B applies layer norm BEFORE attention
        if self.do_layer_norm_before:
            hidden_states = self.final_layer_norm(hidden_states)

        hidden_states = self.fc1(hidden_states)
        hidden_states = self.activation_fn(hidden_states)

        hidden_states = self.fc2(hidden_states)
        hidden_states = nn.functional.dropout(hidden_states, p=self.dropout, training=self.training)

        hidden_states = (residual + hidden_states).view(hidden_states_shape)

        # 350m applies layer norm AFTER attention
        if not self.do_layer_norm_before:
            hidden_states = self.final_layer_norm(hidden_states)

        return hidden_states


# ----- the zoo's data (the checker never sees it) -----

SOURCE = (
    "huggingface/transformers src/transformers/models/opt/modeling_opt.py @ 0184d2087e15afbd83ffa3cef25044a4f6c05047"
)
REFERENCE = {"n_head": 4, "activation": "relu"}
BLOCK = OPTDecoderLayer
ARGS = {
    "config": SimpleNamespace(
        hidden_size=32, num_attention_heads=4, attention_dropout=0.1, enable_bias=True, do_layer_norm_before=True,
        dropout=0.1, activation_function="relu", layer_norm_elementwise_affine=True, ffn_dim=128,
    ),
    "layer_idx": 0,
}  # fmt: skip
TOLERANCE = 1e-6  # the softmax runs in float32, as OPT's does


def weights(b):
    a = b.self_attn
    return {
        "ln1": (b.self_attn_layer_norm.weight, b.self_attn_layer_norm.bias),
        "q": (a.q_proj.weight, a.q_proj.bias),
        "k": (a.k_proj.weight, a.k_proj.bias),
        "v": (a.v_proj.weight, a.v_proj.bias),
        "proj": (a.out_proj.weight, a.out_proj.bias),
        "ln2": (b.final_layer_norm.weight, b.final_layer_norm.bias),
        "fc1": (b.fc1.weight, b.fc1.bias),
        "fc2": (b.fc2.weight, b.fc2.bias),
    }


MISTAKES = {
    "no_scaling": [
        ("query_states = self.q_proj(hidden_states) * self.scaling", "query_states = self.q_proj(hidden_states)")
    ],
    "wrong_scale": [("self.scaling = self.head_dim**-0.5", "self.scaling = self.embed_dim**-0.5")],
    "wrong_scale:1/hs": [("self.scaling = self.head_dim**-0.5", "self.scaling = 1 / self.head_dim")],
    "future_leak": [
        ("attention_mask = torch.triu(causal_mask, diagonal=1)[None, None, :, :]", "attention_mask = None")
    ],
    "mask_reversed": [
        (
            "attention_mask = torch.triu(causal_mask, diagonal=1)[None, None, :, :]",
            "attention_mask = torch.tril(causal_mask)[None, None, :, :]",
        )
    ],
    "softmax_dim": [
        (
            "nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32)",
            "nn.functional.softmax(attn_weights, dim=-2, dtype=torch.float32)",
        )
    ],
    "heads_mixed:merge": [
        ("attn_output = attn_output.transpose(1, 2).contiguous()\n", "attn_output = attn_output.contiguous()\n")
    ],
    "post_norm": [
        ("self.do_layer_norm_before = config.do_layer_norm_before", "self.do_layer_norm_before = False")
    ],  # OPT-350m's wiring
    "no_residual:attn": [("hidden_states = residual + hidden_states\n", "hidden_states = hidden_states\n")],
    "no_residual:mlp": [
        (
            "hidden_states = (residual + hidden_states).view(hidden_states_shape)",
            "hidden_states = hidden_states.view(hidden_states_shape)",
        )
    ],
    "shared_norm": [
        (
            "hidden_states = self.final_layer_norm(hidden_states)\n\n        hidden_states = self.fc1",
            "hidden_states = self.self_attn_layer_norm(hidden_states)\n\n        hidden_states = self.fc1",
        )
    ],
    "dropout_in_eval": [
        ("dropout=0.0 if not self.training else self.dropout,", "dropout=self.dropout,"),
        ("p=dropout, training=module.training)", "p=dropout)"),
    ],
}
PAIRS = [("no_scaling", "post_norm"), ("mask_reversed", "no_residual:mlp")]
