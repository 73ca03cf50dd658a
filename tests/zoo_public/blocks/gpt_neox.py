# Source: EleutherAI/gpt-neox, megatron/model/transformer.py
#   commit ce9bee3b081370add472cfc24ef343b5691a19c8: ParallelMLP, ParallelSelfAttention,
#   ParallelTransformerLayer.
# Kept: the sequence-first layout [sq, b, h], the fused query_key_value packed per head
# ([np, 3 * hn]: q_h k_h v_h for each head), baddbmm with alpha = 1 / norm_factor on
# [b * np, sq, hn] views, the -10000.0 masked fill of the (unfused) scale-mask-softmax,
# input_layernorm / post_attention_layernorm, dense_h_to_4h / dense_4h_to_h with GELU.
# Reduced: one partition (no tensor parallelism: Column/RowParallelLinear -> nn.Linear), no
# rotary, gpt_j_residual=False (sequential residuals), no fusions; a Block that takes (B, T, C)
# and hands the layer its [sq, b, h].
import math
from types import SimpleNamespace

import torch
import torch.nn as nn
import torch.nn.functional as F


class ParallelMLP(nn.Module):
    def __init__(self, neox_args):
        super().__init__()
        ff_dim = 4 * neox_args.hidden_size
        self.dense_h_to_4h = nn.Linear(neox_args.hidden_size, ff_dim)
        self.activation_func = F.gelu
        self.dense_4h_to_h = nn.Linear(ff_dim, neox_args.hidden_size)

    def forward(self, hidden_states):
        intermediate_parallel = self.dense_h_to_4h(hidden_states)
        intermediate_parallel = self.activation_func(intermediate_parallel)
        output = self.dense_4h_to_h(intermediate_parallel)
        return output


class ParallelSelfAttention(nn.Module):
    def __init__(self, neox_args):
        super().__init__()
        self.hidden_size_per_partition = neox_args.hidden_size
        self.hidden_size_per_attention_head = neox_args.hidden_size // neox_args.num_attention_heads
        self.num_attention_heads_per_partition = neox_args.num_attention_heads
        self.query_key_value = nn.Linear(neox_args.hidden_size, 3 * neox_args.hidden_size)
        self.norm_factor = math.sqrt(self.hidden_size_per_attention_head)
        self.dense = nn.Linear(neox_args.hidden_size, neox_args.hidden_size)

    def attention_mask_func(self, attention_scores, ltor_mask):
        attention_scores.masked_fill_(ltor_mask, -10000.0)
        return attention_scores

    def attention(self, query_layer, key_layer, value_layer, attention_mask):
        # [b, np, sq, sk]
        output_size = (query_layer.size(1), query_layer.size(2), query_layer.size(0), key_layer.size(0))

        # [sq, b, np, hn] -> [sq, b * np, hn]
        query_layer = query_layer.view(output_size[2], output_size[0] * output_size[1], -1)
        key_layer = key_layer.view(output_size[3], output_size[0] * output_size[1], -1)

        # preallocating result tensor: [b * np, sq, sk]
        matmul_result = torch.empty(
            output_size[0] * output_size[1], output_size[2], output_size[3],
            dtype=query_layer.dtype, device=query_layer.device,
        )  # fmt: skip

        # Raw attention scores. [b * np, sq, sk]
        matmul_result = torch.baddbmm(
            matmul_result,
            query_layer.transpose(0, 1),  # [b * np, sq, hn]
            key_layer.transpose(0, 1).transpose(1, 2),  # [b * np, hn, sk]
            beta=0.0,
            alpha=(1.0 / self.norm_factor),
        )

        # change view to [b, np, sq, sk]
        attention_scores = matmul_result.view(*output_size)

        # attention scores and attention mask [b, np, sq, sk]
        attention_scores = self.attention_mask_func(attention_scores, attention_mask)
        attention_probs = torch.nn.Softmax(dim=-1)(attention_scores)

        # context layer shape: [b, np, sq, hn]
        output_size = (value_layer.size(1), value_layer.size(2), query_layer.size(0), value_layer.size(3))

        # change view [sk, b * np, hn]
        value_layer = value_layer.view(value_layer.size(0), output_size[0] * output_size[1], -1)

        # change view [b * np, sq, sk]
        attention_probs = attention_probs.view(output_size[0] * output_size[1], output_size[2], -1)

        # matmul: [b * np, sq, hn]
        context_layer = torch.bmm(attention_probs, value_layer.transpose(0, 1))

        # change view [b, np, sq, hn]
        context_layer = context_layer.view(*output_size)
        return context_layer

    def forward(self, hidden_states, attention_mask):
        # hidden_states: [sq, b, h]

        # Attention heads [sq, b, h] --> [sq, b, (np * 3 * hn)]
        mixed_x_layer = self.query_key_value(hidden_states)

        # [sq, b, (np * 3 * hn)] --> [sq, b, np, 3 * hn]
        new_tensor_shape = mixed_x_layer.size()[:-1] + (
            self.num_attention_heads_per_partition,
            3 * self.hidden_size_per_attention_head,
        )
        mixed_x_layer = mixed_x_layer.view(*new_tensor_shape)

        # [sq, b, np, 3 * hn] --> 3 [sq, b, np, hn]
        query_layer, key_layer, value_layer = torch.split(mixed_x_layer, self.hidden_size_per_attention_head, dim=-1)

        context_layer = self.attention(query_layer, key_layer, value_layer, attention_mask)

        # [b, np, sq, hn] --> [sq, b, np, hn]
        context_layer = context_layer.permute(2, 0, 1, 3).contiguous()

        # [sq, b, np, hn] --> [sq, b, hp]
        new_context_layer_shape = context_layer.size()[:-2] + (self.hidden_size_per_partition,)
        context_layer = context_layer.view(*new_context_layer_shape)

        output = self.dense(context_layer)
        return output


class ParallelTransformerLayer(nn.Module):
    def __init__(self, neox_args):
        super().__init__()
        self.input_layernorm = nn.LayerNorm(neox_args.hidden_size, eps=neox_args.layernorm_epsilon)
        self.attention = ParallelSelfAttention(neox_args)
        self.post_attention_layernorm = nn.LayerNorm(neox_args.hidden_size, eps=neox_args.layernorm_epsilon)
        self.mlp = ParallelMLP(neox_args)

    def forward(self, x, attention_mask):
        # x: [b, s, h]
        residual = x
        # x = x + attn(ln1(x))
        attention_output = self.attention(self.input_layernorm(x), attention_mask)
        attention_output = attention_output + residual
        # output = x + mlp(ln2(x))
        mlp_output = self.mlp(self.post_attention_layernorm(attention_output))
        output = mlp_output + attention_output
        return output


class Block(nn.Module):
    """One layer, as gpt-neox's GPT2ModelPipe runs it: sequence first, a bool mask (True = hidden)."""

    def __init__(self, neox_args):
        super().__init__()
        self.layer = ParallelTransformerLayer(neox_args)

    def forward(self, x):  # (B, T, C)
        T = x.size(1)
        attention_mask = torch.tril(torch.ones((1, 1, T, T), device=x.device)) < 0.5
        return self.layer(x.transpose(0, 1).contiguous(), attention_mask).transpose(0, 1)


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "EleutherAI/gpt-neox megatron/model/transformer.py @ ce9bee3b081370add472cfc24ef343b5691a19c8"
REFERENCE = {"n_head": 4, "activation": "gelu"}
BLOCK = Block
ARGS = {"neox_args": SimpleNamespace(hidden_size=32, num_attention_heads=4, layernorm_epsilon=1e-5)}


def weights(b):
    layer = b.layer
    a, m = layer.attention, layer.mlp
    nh, hs = a.num_attention_heads_per_partition, a.hidden_size_per_attention_head
    W = a.query_key_value.weight.view(nh, 3, hs, -1)  # per head: q_h, k_h, v_h
    bias = a.query_key_value.bias.view(nh, 3, hs)
    return {
        "ln1": (layer.input_layernorm.weight, layer.input_layernorm.bias),
        "q": (W[:, 0].reshape(nh * hs, -1), bias[:, 0].reshape(-1)),
        "k": (W[:, 1].reshape(nh * hs, -1), bias[:, 1].reshape(-1)),
        "v": (W[:, 2].reshape(nh * hs, -1), bias[:, 2].reshape(-1)),
        "proj": (a.dense.weight, a.dense.bias),
        "ln2": (layer.post_attention_layernorm.weight, layer.post_attention_layernorm.bias),
        "fc1": (m.dense_h_to_4h.weight, m.dense_h_to_4h.bias),
        "fc2": (m.dense_4h_to_h.weight, m.dense_4h_to_h.bias),
    }


ALPHA = "alpha=(1.0 / self.norm_factor),"
FILL = "attention_scores.masked_fill_(ltor_mask, -10000.0)"
MISTAKES = {
    "no_scaling": [(ALPHA, "alpha=1.0,")],
    "wrong_scale": [
        (
            "self.norm_factor = math.sqrt(self.hidden_size_per_attention_head)",
            "self.norm_factor = math.sqrt(neox_args.hidden_size)",
        )
    ],
    "wrong_scale:1/hs": [
        (
            "self.norm_factor = math.sqrt(self.hidden_size_per_attention_head)",
            "self.norm_factor = self.hidden_size_per_attention_head",
        )
    ],
    "future_leak": [
        ("attention_scores = self.attention_mask_func(attention_scores, attention_mask)", "pass  # no mask")
    ],
    "mask_zero": [(FILL, "attention_scores.masked_fill_(ltor_mask, 0.0)")],
    "mask_reversed": [(FILL, "attention_scores.masked_fill_(~ltor_mask, -10000.0)")],
    "softmax_dim": [("torch.nn.Softmax(dim=-1)", "torch.nn.Softmax(dim=-2)")],
    "heads_mixed:merge": [
        (
            "context_layer = context_layer.permute(2, 0, 1, 3).contiguous()",
            "context_layer = context_layer.permute(2, 0, 3, 1).contiguous()",
        )
    ],
    "no_residual:attn": [("attention_output = attention_output + residual", "attention_output = attention_output")],
    "no_residual:mlp": [("output = mlp_output + attention_output", "output = mlp_output")],
    "shared_norm": [
        (
            "mlp_output = self.mlp(self.post_attention_layernorm(attention_output))",
            "mlp_output = self.mlp(self.input_layernorm(attention_output))",
        )
    ],
}
PAIRS = [("no_scaling", "no_residual:mlp"), ("mask_reversed", "shared_norm")]
