# Source: huggingface/transformers, src/transformers/models/bloom/modeling_bloom.py
#   commit 0078a6cd96d5ab7c3c429b9fdc3fbc703d894dcc: dropout_add, bloom_gelu_forward / back,
#   GeLUFunction, BloomGelu, BloomAttention, BloomMLP, BloomBlock (and _make_causal_mask).
# Kept: BloomBlock(config, layer_number) with a BloomConfig-like config; the fused
# query_key_value packed per head (reshape(batch, seq, num_heads, 3 * head_dim), then split
# into q, k, v along the last axis); the layer-wise scaling (alpha = 1 / (sqrt(head_dim) *
# layer_number) in baddbmm, scores then multiplied back by layer_number); baddbmm onto the
# ALiBi bias with beta = 1 / layer_number; [batch * heads, ...] bmm views; the bool mask
# (True = masked) filled with float32's min after casting the scores to float32; _merge_heads;
# the residual handed into the attention and MLP and added by dropout_add; the
# apply_residual_connection_post_layernorm switch; BloomGelu (an autograd Function in training,
# the tanh formula with 0.79788456 in eval).
# Reduced: the ALiBi bias is zeros (the lessons' block has no position bias); pretraining_tp 1;
# no cache or head mask; the model's causal mask built in the block.
import math
from types import SimpleNamespace

import torch
from torch import nn
from torch.nn import LayerNorm


def dropout_add(x, residual, prob, training):
    out = nn.functional.dropout(x, p=prob, training=training)
    out = residual + out
    return out


def bloom_gelu_forward(x):
    return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))


def bloom_gelu_back(g, x):
    x = x[0]  # x is a tuple of 1 element, needs to unpack it first
    tanh_out = torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x))
    # sqrt(2/pi) * 3 * 0.044715 -> 0.1070322243
    ff = 0.5 * x * ((1 - tanh_out * tanh_out) * (0.79788456 + 0.1070322243 * x * x)) + 0.5 * (1 + tanh_out)
    return ff * g


class GeLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input):
        ctx.save_for_backward(input)
        return bloom_gelu_forward(input)

    @staticmethod
    def backward(ctx, grad_output):
        input = ctx.saved_tensors
        tmp = bloom_gelu_back(grad_output, input)
        return tmp


class BloomGelu(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        if self.training:
            return GeLUFunction.apply(x)
        else:
            return bloom_gelu_forward(x)


class BloomAttention(nn.Module):
    def __init__(self, config, layer_number):
        super().__init__()

        self.hidden_size = config.hidden_size
        self.num_heads = config.n_head
        self.head_dim = self.hidden_size // self.num_heads
        self.split_size = self.hidden_size
        self.hidden_dropout = config.hidden_dropout

        if self.head_dim * self.num_heads != self.hidden_size:
            raise ValueError(
                f"`hidden_size` must be divisible by num_heads (got `hidden_size`: {self.hidden_size} and `num_heads`:"
                f" {self.num_heads})."
            )

        # Layer-wise attention scaling
        self.layer_number = max(1, layer_number)
        self.inv_norm_factor = 1.0 / (math.sqrt(self.head_dim) * self.layer_number)
        self.beta = 1.0 / self.layer_number

        self.query_key_value = nn.Linear(self.hidden_size, 3 * self.hidden_size, bias=True)
        self.dense = nn.Linear(self.hidden_size, self.hidden_size)
        self.attention_dropout = nn.Dropout(config.attention_dropout)

    def _split_heads(self, fused_qkv):
        """
        Split the last dimension into (num_heads, head_dim)
        """
        batch_size, seq_length, three_times_hidden_size = fused_qkv.shape
        fused_qkv = fused_qkv.reshape(batch_size, seq_length, self.num_heads, 3 * self.head_dim)
        return torch.split(fused_qkv, self.head_dim, dim=-1)

    def _merge_heads(self, x):
        # What we want to achieve is:
        # batch_size * num_heads, seq_len, head_dim -> batch_size, seq_len, num_heads * head_dim
        batch_size_and_num_heads, seq_len, _ = x.shape
        batch_size = batch_size_and_num_heads // self.num_heads

        # First view to decompose the batch size
        # batch_size*num_heads, seq_len, head_dim -> batch_size, num_heads, seq_len, head_dim
        x = x.view(batch_size, self.num_heads, seq_len, self.head_dim)

        # batch_size, num_heads, seq_len, head_dim -> batch_size, seq_len, num_heads, head_dim
        x = x.permute(0, 2, 1, 3)

        # batch_size, seq_len, num_heads, head_dim -> batch_size, seq_len, num_heads * head_dim
        return x.reshape(batch_size, seq_len, self.num_heads * self.head_dim)

    def forward(self, hidden_states, residual, alibi, attention_mask):
        alibi = alibi.to(hidden_states.device)  # to make the model possible to run under accelerate
        fused_qkv = self.query_key_value(hidden_states)  # [batch_size, seq_length, 3 x hidden_size]

        # 3 x [batch_size, seq_length, num_heads, head_dim]
        (query_layer, key_layer, value_layer) = self._split_heads(fused_qkv)

        batch_size, q_length, _, _ = query_layer.shape
        _, kv_length, _, _ = key_layer.shape

        # [batch_size*num_heads, head_dim, q_length] x [batch_size*num_heads, head_dim, k_length] -> [batch_size*num_heads, q_length, k_length]
        matmul_result = torch.baddbmm(
            input=alibi,
            batch1=query_layer.transpose(1, 2).reshape(batch_size * self.num_heads, q_length, self.head_dim),
            batch2=key_layer.permute(0, 2, 3, 1).reshape(batch_size * self.num_heads, self.head_dim, kv_length),
            beta=self.beta,
            alpha=self.inv_norm_factor,
        )

        # change view to [batch_size, num_heads, q_length, k_length]
        attention_scores = matmul_result.view(batch_size, self.num_heads, q_length, kv_length)

        # we cast attention scores to fp32, compute scaled softmax and cast back into initial dtype
        input_dtype = attention_scores.dtype
        attention_scores = attention_scores.float()
        attn_weights = torch.masked_fill(
            attention_scores * self.layer_number, attention_mask, torch.finfo(torch.float32).min
        )
        attention_probs = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(input_dtype)

        # [batch_size, num_heads, q_length, k_length]
        attention_probs = self.attention_dropout(attention_probs)

        # change view [batch_size x num_heads, q_length, k_length]
        attention_probs_reshaped = attention_probs.view(batch_size * self.num_heads, q_length, kv_length)

        # matmul: [batch_size * num_heads, q_length, head_dim]
        context_layer = torch.bmm(
            attention_probs_reshaped,
            value_layer.transpose(1, 2).reshape(batch_size * self.num_heads, kv_length, self.head_dim),
        )

        # change view [batch_size, num_heads, q_length, head_dim]
        context_layer = self._merge_heads(context_layer)

        output_tensor = self.dense(context_layer)

        output_tensor = dropout_add(output_tensor, residual, self.hidden_dropout, self.training)

        return (output_tensor, None)


class BloomMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        hidden_size = config.hidden_size

        self.dense_h_to_4h = nn.Linear(hidden_size, 4 * hidden_size)
        self.gelu_impl = BloomGelu()
        self.dense_4h_to_h = nn.Linear(4 * hidden_size, hidden_size)
        self.hidden_dropout = config.hidden_dropout

    def forward(self, hidden_states, residual):
        hidden_states = self.gelu_impl(self.dense_h_to_4h(hidden_states))

        intermediate_output = self.dense_4h_to_h(hidden_states)

        output = dropout_add(intermediate_output, residual, self.hidden_dropout, self.training)

        return output


class BloomBlock(nn.Module):
    def __init__(self, config, layer_number):
        super().__init__()
        hidden_size = config.hidden_size

        self.input_layernorm = LayerNorm(hidden_size, eps=config.layer_norm_epsilon)
        self.n_head = config.n_head
        self.self_attention = BloomAttention(config, layer_number=layer_number)
        self.post_attention_layernorm = LayerNorm(hidden_size, eps=config.layer_norm_epsilon)

        self.mlp = BloomMLP(config)

        self.apply_residual_connection_post_layernorm = config.apply_residual_connection_post_layernorm
        self.hidden_dropout = config.hidden_dropout

    def forward(self, hidden_states, alibi=None, attention_mask=None):
        # hidden_states: [batch_size, seq_length, hidden_size]
        batch_size, seq_length, _ = hidden_states.shape
        if alibi is None:  # no position bias in the lessons' block
            alibi = torch.zeros(batch_size * self.n_head, 1, seq_length, dtype=hidden_states.dtype)
        if attention_mask is None:  # _make_causal_mask: True above the diagonal (masked)
            mask = torch.ones((seq_length, seq_length), dtype=torch.bool, device=hidden_states.device)
            attention_mask = torch.triu(mask, diagonal=1)[None, None, :, :]

        # Layer norm at the beginning of the transformer layer.
        layernorm_output = self.input_layernorm(hidden_states)

        # Layer norm post the self attention.
        if self.apply_residual_connection_post_layernorm:
            residual = layernorm_output
        else:
            residual = hidden_states

        # Self attention.
        attn_outputs = self.self_attention(layernorm_output, residual, attention_mask=attention_mask, alibi=alibi)

        attention_output = attn_outputs[0]

        layernorm_output = self.post_attention_layernorm(attention_output)

        # Get residual
        if self.apply_residual_connection_post_layernorm:
            residual = layernorm_output
        else:
            residual = attention_output

        # MLP.
        output = self.mlp(layernorm_output, residual)

        return output


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "huggingface/transformers src/transformers/models/bloom/modeling_bloom.py @ 0078a6cd96d5ab7c3c429b9fdc3fbc703d894dcc"
REFERENCE = {"n_head": 4, "activation": "gelu_tanh"}
BLOCK = BloomBlock
ARGS = {
    "config": SimpleNamespace(
        hidden_size=32, n_head=4, hidden_dropout=0.1, attention_dropout=0.1, layer_norm_epsilon=1e-5,
        apply_residual_connection_post_layernorm=False,
    ),
    "layer_number": 3,
}  # fmt: skip
TOLERANCE = 1e-6  # float32 scores and softmax, and 0.79788456 for sqrt(2 / pi), as BLOOM's


def weights(b):
    a, m = b.self_attention, b.mlp
    nh, hs = a.num_heads, a.head_dim
    W = a.query_key_value.weight.view(nh, 3, hs, -1)  # per head: q_h, k_h, v_h
    bias = a.query_key_value.bias.view(nh, 3, hs)
    return {
        "ln1": (b.input_layernorm.weight, b.input_layernorm.bias),
        "q": (W[:, 0].reshape(nh * hs, -1), bias[:, 0].reshape(-1)),
        "k": (W[:, 1].reshape(nh * hs, -1), bias[:, 1].reshape(-1)),
        "v": (W[:, 2].reshape(nh * hs, -1), bias[:, 2].reshape(-1)),
        "proj": (a.dense.weight, a.dense.bias),
        "ln2": (b.post_attention_layernorm.weight, b.post_attention_layernorm.bias),
        "fc1": (m.dense_h_to_4h.weight, m.dense_h_to_4h.bias),
        "fc2": (m.dense_4h_to_h.weight, m.dense_4h_to_h.bias),
    }


MISTAKES = {
    "no_scaling": [
        (
            "self.inv_norm_factor = 1.0 / (math.sqrt(self.head_dim) * self.layer_number)",
            "self.inv_norm_factor = 1.0 / self.layer_number",
        )
    ],
    "wrong_scale": [
        (
            "self.inv_norm_factor = 1.0 / (math.sqrt(self.head_dim) * self.layer_number)",
            "self.inv_norm_factor = 1.0 / (math.sqrt(self.hidden_size) * self.layer_number)",
        )
    ],
    "future_leak": [
        (
            "attention_mask = torch.triu(mask, diagonal=1)[None, None, :, :]",
            "attention_mask = torch.zeros_like(mask)[None, None, :, :]",
        )
    ],
    "mask_reversed": [
        (
            "attention_mask = torch.triu(mask, diagonal=1)[None, None, :, :]",
            "attention_mask = torch.tril(mask)[None, None, :, :]",
        )
    ],
    "softmax_dim": [
        (
            "nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32)",
            "nn.functional.softmax(attn_weights, dim=-2, dtype=torch.float32)",
        )
    ],
    "heads_mixed:merge": [("x = x.permute(0, 2, 1, 3)\n", "\n")],
    "no_residual:normed": [
        (
            "self.apply_residual_connection_post_layernorm = config.apply_residual_connection_post_layernorm",
            "self.apply_residual_connection_post_layernorm = True",
        )
    ],
    "no_residual:attn": [
        (
            "output_tensor = dropout_add(output_tensor, residual, self.hidden_dropout, self.training)",
            "output_tensor = nn.functional.dropout(output_tensor, p=self.hidden_dropout, training=self.training)",
        )
    ],
    "no_residual:mlp": [
        (
            "output = dropout_add(intermediate_output, residual, self.hidden_dropout, self.training)",
            "output = nn.functional.dropout(intermediate_output, p=self.hidden_dropout, training=self.training)",
        )
    ],
    "shared_norm": [
        (
            "layernorm_output = self.post_attention_layernorm(attention_output)",
            "layernorm_output = self.input_layernorm(attention_output)",
        )
    ],
    "dropout_in_eval": [
        ("    out = nn.functional.dropout(x, p=prob, training=training)", "    out = nn.functional.dropout(x, p=prob)")
    ],
}
PAIRS = [("no_scaling", "no_residual:normed"), ("mask_reversed", "shared_norm")]
