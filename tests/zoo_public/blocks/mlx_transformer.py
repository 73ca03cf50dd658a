# Source: ml-explore/mlx, python/mlx/nn/layers/transformer.py
#   commit 0372cbbcbfbaebd27d5f001332c5e0efe3b1b395: MultiHeadAttention (with its
#   create_additive_causal_mask), TransformerEncoderLayer.
# Ported from MLX to torch, keeping MLX's shapes: TransformerEncoderLayer(dims, num_heads,
# mlp_dims, dropout, activation, norm_first) with ln1 / ln2, linear1 / linear2 and both wirings
# (norm_first or not) in __call__; MultiHeadAttention(dims, num_heads, ..., bias=False) with
# bias-free query_proj / key_proj / value_proj / out_proj, the keys reshaped and transposed to
# (B, H, hd, S) in one step (transpose(0, 2, 3, 1), written with permute), scale =
# math.sqrt(1 / queries.shape[-1]) applied to the queries before `@ keys`, the additive mask
# added (`scores + mask`), softmax over the last axis, values_hat transposed and reshaped;
# create_additive_causal_mask as a static method (indices[:, None] < indices[None] times -1e9);
# relu as the default activation, LayerNorm with MLX's eps 1e-5.
# Reduced: the layer's mask is a required argument in MLX: here it defaults to the additive causal
# mask; norm_first=True (the lessons' pre-norm) is passed as an argument. No post_norm case: MLX's
# own post-norm branch (kept above) adds the block's input x, not the stream, to the MLP's output,
# which is post-norm and a second wiring mistake the catalogue does not name.
import math
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

relu = F.relu


class MultiHeadAttention(nn.Module):
    def __init__(
        self,
        dims: int,
        num_heads: int,
        query_input_dims: Optional[int] = None,
        key_input_dims: Optional[int] = None,
        value_input_dims: Optional[int] = None,
        value_dims: Optional[int] = None,
        value_output_dims: Optional[int] = None,
        bias: bool = False,
    ):
        super().__init__()

        if (dims % num_heads) != 0:
            raise ValueError(
                f"The input feature dimensions should be divisible by the number of heads ({dims} % {num_heads}) != 0"
            )

        query_input_dims = query_input_dims or dims
        key_input_dims = key_input_dims or dims
        value_input_dims = value_input_dims or key_input_dims
        value_dims = value_dims or dims
        value_output_dims = value_output_dims or dims

        self.num_heads = num_heads
        self.query_proj = nn.Linear(query_input_dims, dims, bias=bias)
        self.key_proj = nn.Linear(key_input_dims, dims, bias=bias)
        self.value_proj = nn.Linear(value_input_dims, value_dims, bias=bias)
        self.out_proj = nn.Linear(value_dims, value_output_dims, bias=bias)

    def forward(self, queries, keys, values, mask=None):
        queries = self.query_proj(queries)
        keys = self.key_proj(keys)
        values = self.value_proj(values)

        num_heads = self.num_heads
        B, L, D = queries.shape
        _, S, _ = keys.shape
        queries = queries.reshape(B, L, num_heads, -1).permute(0, 2, 1, 3)
        keys = keys.reshape(B, S, num_heads, -1).permute(0, 2, 3, 1)
        values = values.reshape(B, S, num_heads, -1).permute(0, 2, 1, 3)

        # Dimensions are [batch x num heads x sequence x hidden dim]
        scale = math.sqrt(1 / queries.shape[-1])
        scores = (queries * scale) @ keys
        if mask is not None:
            scores = scores + mask.to(scores.dtype)
        scores = torch.softmax(scores, dim=-1)
        values_hat = (scores @ values).permute(0, 2, 1, 3).reshape(B, L, -1)

        return self.out_proj(values_hat)

    @staticmethod
    def create_additive_causal_mask(N: int, dtype: torch.dtype = torch.float32):
        indices = torch.arange(N)
        mask = indices[:, None] < indices[None]
        # usually inf but 1e9 is as good and softmax(full(1e9)) != nan
        # TODO: Should replace this with finfo(dtype).min
        mask = mask.to(dtype) * -1e9
        return mask


class TransformerEncoderLayer(nn.Module):
    def __init__(
        self,
        dims: int,
        num_heads: int,
        mlp_dims: Optional[int] = None,
        dropout: float = 0.0,
        activation: Callable[[Any], Any] = relu,
        norm_first: bool = False,
    ):
        super().__init__()
        mlp_dims = mlp_dims or dims * 4
        self.attention = MultiHeadAttention(dims, num_heads)
        self.ln1 = nn.LayerNorm(dims, eps=1e-5)
        self.ln2 = nn.LayerNorm(dims, eps=1e-5)
        self.linear1 = nn.Linear(dims, mlp_dims)
        self.linear2 = nn.Linear(mlp_dims, dims)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.activation = activation
        self.norm_first = norm_first

    def forward(self, x, mask=None):
        if mask is None:
            mask = MultiHeadAttention.create_additive_causal_mask(x.shape[1])
        if self.norm_first:
            y = self.ln1(x)
            y = self.attention(y, y, y, mask)
            y = self.dropout1(y)
            x = x + y

            y = self.ln2(x)
            y = self.linear1(y)
            y = self.activation(y)
            y = self.dropout2(y)
            y = self.linear2(y)
            y = x + y

        else:
            y = self.attention(x, x, x, mask)
            y = self.dropout1(y)
            y = self.ln1(x + y)

            y = self.linear1(y)
            y = self.activation(y)
            y = self.dropout2(y)
            y = self.linear2(y)
            y = self.ln2(x + y)

        return y


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "ml-explore/mlx python/mlx/nn/layers/transformer.py @ 0372cbbcbfbaebd27d5f001332c5e0efe3b1b395"
REFERENCE = {"n_head": 4, "activation": "relu", "norm_eps": 1e-5}
BLOCK = TransformerEncoderLayer
ARGS = {"dims": 32, "num_heads": 4, "mlp_dims": 128, "dropout": 0.1, "norm_first": True}


def weights(b):
    a = b.attention
    return {
        "ln1": (b.ln1.weight, b.ln1.bias),
        "q": (a.query_proj.weight, None),
        "k": (a.key_proj.weight, None),
        "v": (a.value_proj.weight, None),
        "proj": (a.out_proj.weight, None),
        "ln2": (b.ln2.weight, b.ln2.bias),
        "fc1": (b.linear1.weight, b.linear1.bias),
        "fc2": (b.linear2.weight, b.linear2.bias),
    }


SCALE = "scale = math.sqrt(1 / queries.shape[-1])"
MASKLINE = "mask = indices[:, None] < indices[None]"
SOFTMAX = "scores = torch.softmax(scores, dim=-1)"
MISTAKES = {
    "no_scaling": [(SCALE, "scale = 1.0")],
    "wrong_scale": [(SCALE, "scale = math.sqrt(1 / D)")],
    "wrong_scale:1/hs": [(SCALE, "scale = 1 / queries.shape[-1]")],
    "future_leak": [("scores = scores + mask.to(scores.dtype)", "scores = scores")],
    "mask_reversed": [(MASKLINE, "mask = indices[:, None] >= indices[None]")],
    "softmax_dim": [(SOFTMAX, "scores = torch.softmax(scores, dim=-2)")],
    "heads_mixed:merge": [("values_hat = (scores @ values).permute(0, 2, 1, 3).reshape(B, L, -1)",
                           "values_hat = (scores @ values).reshape(B, L, -1)")],
    "no_residual:attn": [("            x = x + y\n", "            x = y\n")],
    "no_residual:mlp": [("            y = x + y\n\n", "\n")],
    "shared_norm": [("            y = self.ln2(x)\n", "            y = self.ln1(x)\n")],
}
PAIRS = [("wrong_scale", "no_residual:attn")]
