# Source: huggingface/transformers, src/transformers/models/gpt_bigcode/modeling_gpt_bigcode.py
#   commit 00574544580e648fa0c9aa9934640b2902959078: GPTBigCodeAttention (multi_query=False),
#   GPTBigCodeMLP, GPTBigCodeBlock.
# Kept: GPTBigCodeBlock(config) with a GPTBigCodeConfig-like config; one c_attn whose output is
# packed per head (view(B, T, nh, 3 * hs), transpose, split into hs | 2 * hs, then key_value split
# into k | v: q_h, k_h, v_h side by side for each head, "not the same as GPT2"); keys passed to
# _attn already transposed; the CPU path's torch.baddbmm(zeros, query, key, beta=1,
# alpha=scale_factor) on (B * nh, T, hs) views; torch.where(attention_mask, attn_weights,
# mask_value) with the cached finfo.min mask value; the attention returning (a, present); the
# block reading attn_outputs[0]; c_fc / c_proj with gelu_pytorch_tanh.
# Reduced: multi_query=False (no MQA); attention_softmax_in_fp32=False, so the jit-scripted
# upcast softmax kernels are not used and are left out; the bool causal mask (the model's `bias`
# buffer, sliced and unsqueezed) is built by the block when given none; no cache, no
# cross-attention, no head mask; the block returns the hidden states alone.
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn


class GPTBigCodeAttention(nn.Module):
    def __init__(self, config, is_cross_attention=False, layer_idx=None):
        super().__init__()
        self.mask_value = None

        self.multi_query = config.multi_query
        self.embed_dim = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_dim = self.embed_dim // self.num_heads
        self.kv_heads = 1 if self.multi_query else self.num_heads
        self.kv_dim = self.kv_heads * self.head_dim
        self.split_size = self.embed_dim
        if self.head_dim * self.num_heads != self.embed_dim:
            raise ValueError(
                f"`embed_dim` must be divisible by num_heads (got `embed_dim`: {self.embed_dim} and `num_heads`:"
                f" {self.num_heads})."
            )

        self.scale_attn_weights = config.scale_attn_weights
        self.is_cross_attention = is_cross_attention

        self.layer_idx = layer_idx

        self.c_attn = nn.Linear(self.embed_dim, self.embed_dim + 2 * self.kv_dim)

        self.c_proj = nn.Linear(self.embed_dim, self.embed_dim)

        self.attn_dropout = nn.Dropout(config.attn_pdrop)
        self.resid_dropout = nn.Dropout(config.resid_pdrop)

    def _get_mask_value(self, device, dtype):
        # torch.where expects a tensor. We use a cache to avoid recreating it every time.
        if self.mask_value is None or self.mask_value.dtype != dtype or self.mask_value.device != device:
            self.mask_value = torch.full([], torch.finfo(dtype).min, dtype=dtype, device=device)
        return self.mask_value

    def _attn(self, query, key, value, attention_mask=None, head_mask=None):
        dtype = query.dtype
        softmax_dtype = dtype

        unscale = 1
        scale_factor = unscale**-1
        if self.scale_attn_weights:
            scale_factor /= self.head_dim**0.5

        # MHA models: (batch_size, num_heads, query_length, head_dim)
        query_shape = query.shape
        batch_size = query_shape[0]
        key_length = key.size(-1)
        # (batch_size, num_heads, query_length, head_dim) x (batch_size, num_heads, head_dim, key_length)
        # -> (batch_size, num_heads, query_length, key_length)
        query_length = query_shape[2]
        attn_shape = (batch_size, self.num_heads, query_length, key_length)
        attn_view = (batch_size * self.num_heads, query_length, key_length)
        # Always copies
        query = query.reshape(batch_size * self.num_heads, query_length, self.head_dim)
        # No copy when layer_past is provided.
        key = key.reshape(batch_size * self.num_heads, self.head_dim, key_length)

        # this seemed to be needed - on CPU only
        zeros = torch.zeros(attn_view, dtype=query.dtype, device=query.device)
        attn_weights = torch.baddbmm(zeros, query, key, beta=1, alpha=scale_factor).view(attn_shape)

        if attention_mask is not None:
            mask_value = self._get_mask_value(attn_weights.device, softmax_dtype)

            # The fused kernel is very slow when the key length is not a multiple of 8, so we skip fusion.
            attn_weights = torch.where(attention_mask, attn_weights, mask_value)

        attn_weights = torch.nn.functional.softmax(attn_weights, dim=-1)

        attn_weights = self.attn_dropout(attn_weights)

        # Mask heads if we want to
        if head_mask is not None:
            attn_weights = attn_weights * head_mask

        attn_output = torch.matmul(attn_weights, value)

        return attn_output, attn_weights

    def forward(self, hidden_states, layer_past=None, attention_mask=None, head_mask=None, use_cache=False):
        # Note: We split as (self.num_heads, 3, self.head_dim) instead of (3, self.num_heads, self.head_dim),
        # i.e., the memory layout is not the same as GPT2.
        # This makes the concatenation with past_key_value more efficient.
        query, key_value = (
            self.c_attn(hidden_states)
            .view(*hidden_states.shape[:2], self.num_heads, 3 * self.head_dim)
            .transpose(1, 2)
            .split((self.head_dim, 2 * self.head_dim), dim=3)
        )

        if layer_past is not None:
            key_value = torch.cat((layer_past, key_value), dim=-2)
        present = key_value if use_cache else None

        key, value = key_value.split((self.head_dim, self.head_dim), dim=-1)

        attn_output, attn_weights = self._attn(query, key.transpose(-1, -2), value, attention_mask, head_mask)

        attn_output = attn_output.transpose(1, 2).reshape(hidden_states.shape)
        attn_output = self.c_proj(attn_output)
        attn_output = self.resid_dropout(attn_output)

        outputs = (attn_output, present)
        return outputs  # a, present, (attentions)


class GPTBigCodeMLP(nn.Module):
    def __init__(self, intermediate_size, config):
        super().__init__()
        embed_dim = config.hidden_size
        self.c_fc = nn.Linear(embed_dim, intermediate_size)
        self.c_proj = nn.Linear(intermediate_size, embed_dim)
        self.act = lambda x: F.gelu(x, approximate="tanh")  # ACT2FN["gelu_pytorch_tanh"]
        self.dropout = nn.Dropout(config.resid_pdrop)

    # Copied from transformers.models.gpt2.modeling_gpt2.GPT2MLP.forward
    def forward(self, hidden_states):
        hidden_states = self.c_fc(hidden_states)
        hidden_states = self.act(hidden_states)
        hidden_states = self.c_proj(hidden_states)
        hidden_states = self.dropout(hidden_states)
        return hidden_states


class GPTBigCodeBlock(nn.Module):
    def __init__(self, config, layer_idx=None):
        super().__init__()
        hidden_size = config.hidden_size
        self.inner_dim = config.n_inner if config.n_inner is not None else 4 * hidden_size

        self.ln_1 = nn.LayerNorm(hidden_size, eps=config.layer_norm_epsilon)
        self.attn = GPTBigCodeAttention(config, layer_idx=layer_idx)
        self.ln_2 = nn.LayerNorm(hidden_size, eps=config.layer_norm_epsilon)

        self.mlp = GPTBigCodeMLP(self.inner_dim, config)
        max_positions = config.max_position_embeddings
        self.register_buffer(
            "bias", torch.tril(torch.ones((max_positions, max_positions), dtype=torch.bool)), persistent=False
        )

    def forward(self, hidden_states, layer_past=None, attention_mask=None, head_mask=None):
        if attention_mask is None:
            query_length = key_length = hidden_states.shape[1]
            self_attention_mask = self.bias[None, key_length - query_length : key_length, :key_length]
            attention_mask = self_attention_mask.unsqueeze(1)
        residual = hidden_states
        hidden_states = self.ln_1(hidden_states)
        attn_outputs = self.attn(
            hidden_states,
            layer_past=layer_past,
            attention_mask=attention_mask,
            head_mask=head_mask,
        )
        attn_output = attn_outputs[0]  # output_attn: a, present, (attentions)
        # residual connection
        hidden_states = attn_output + residual

        residual = hidden_states
        hidden_states = self.ln_2(hidden_states)
        feed_forward_hidden_states = self.mlp(hidden_states)
        # residual connection
        hidden_states = residual + feed_forward_hidden_states

        return hidden_states


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "huggingface/transformers src/transformers/models/gpt_bigcode/modeling_gpt_bigcode.py @ 00574544580e648fa0c9aa9934640b2902959078"
REFERENCE = {"n_head": 4, "activation": "gelu_tanh", "norm_eps": 1e-5}
BLOCK = GPTBigCodeBlock
ARGS = {
    "config": SimpleNamespace(
        hidden_size=32, num_attention_heads=4, n_inner=None, max_position_embeddings=16, multi_query=False,
        layer_norm_epsilon=1e-5, scale_attn_weights=True, attn_pdrop=0.1, resid_pdrop=0.1,
    )
}  # fmt: skip


def weights(b):
    a, m = b.attn, b.mlp
    nh, hs = a.num_heads, a.head_dim
    W = a.c_attn.weight.view(nh, 3, hs, -1)  # per head: q_h, k_h, v_h
    bias = a.c_attn.bias.view(nh, 3, hs)
    return {
        "ln1": (b.ln_1.weight, b.ln_1.bias),
        "q": (W[:, 0].reshape(nh * hs, -1), bias[:, 0].reshape(-1)),
        "k": (W[:, 1].reshape(nh * hs, -1), bias[:, 1].reshape(-1)),
        "v": (W[:, 2].reshape(nh * hs, -1), bias[:, 2].reshape(-1)),
        "proj": (a.c_proj.weight, a.c_proj.bias),
        "ln2": (b.ln_2.weight, b.ln_2.bias),
        "fc1": (m.c_fc.weight, m.c_fc.bias),
        "fc2": (m.c_proj.weight, m.c_proj.bias),
    }


WHERE = "attn_weights = torch.where(attention_mask, attn_weights, mask_value)"
SOFTMAX = "attn_weights = torch.nn.functional.softmax(attn_weights, dim=-1)"
R1 = "hidden_states = attn_output + residual"
R2 = "hidden_states = residual + feed_forward_hidden_states"
MISTAKES = {
    "no_scaling": [("if self.scale_attn_weights:", "if False:  # self.scale_attn_weights")],
    "wrong_scale": [("scale_factor /= self.head_dim**0.5", "scale_factor /= self.embed_dim**0.5")],
    "wrong_scale:1/hs": [("scale_factor /= self.head_dim**0.5", "scale_factor /= self.head_dim")],
    "future_leak": [("if attention_mask is not None:\n            mask_value", "if False:\n            mask_value")],
    "mask_reversed": [(WHERE, "attn_weights = torch.where(~attention_mask, attn_weights, mask_value)")],
    "mask_zero": [("self.mask_value = torch.full([], torch.finfo(dtype).min,", "self.mask_value = torch.full([], 0.0,")],
    "softmax_dim": [(SOFTMAX, "attn_weights = torch.nn.functional.softmax(attn_weights, dim=-2)")],
    "heads_mixed:merge": [("attn_output = attn_output.transpose(1, 2).reshape(hidden_states.shape)", "attn_output = attn_output.reshape(hidden_states.shape)")],
    "no_residual:attn": [(R1, "hidden_states = attn_output")],
    "no_residual:mlp": [(R2, "hidden_states = feed_forward_hidden_states")],
    "shared_norm": [("hidden_states = self.ln_2(hidden_states)", "hidden_states = self.ln_1(hidden_states)")],
}
PAIRS = [("mask_zero", "no_residual:mlp")]
