# Source: keras-team/keras-io, examples/generative/text_generation_with_miniature_gpt.py
#   commit 040e8ba4b4bf32ba42d56130fd0f793bec57d097: MultiHeadSelfAttention, TransformerBlock.
# Ported from Keras (TensorFlow 2) to torch, keeping Keras' shapes: a Dense layer with its
# kernel stored (in, out) and an optional activation by name (Dense(ff_dim, activation="relu"));
# MultiHeadSelfAttention(embed_dim, num_heads) with query_dense / key_dense / value_dense /
# combine_heads; separate_heads (reshape (batch, -1, nh, projection_dim), transpose [0, 2, 1, 3]);
# attention() with matmul(query, key, transpose_b=True), division by sqrt(dim_key) cast to
# float32, the static causal_attention_mask (1's in the lower triangle, counting from the lower
# right corner: i >= j - n_src + n_dest) applied multiplicatively `s * m - 1e4 * (1 - m)`,
# softmax over the last axis and (output, weights) returned; the block's ffn as a Sequential of two
# Dense layers; LayerNormalization(epsilon=1e-6); dropout1 / dropout2.
# Reduced: the block is post-norm in the example (layernorm1(inputs + attention_output)): here
# pre-norm; ff_dim = 4 * embed_dim (the example uses 256 = embed_dim).

import torch
import torch.nn.functional as F
from torch import nn


class Dense(nn.Module):
    def __init__(self, units, input_dim, activation=None):
        super().__init__()
        self.kernel = nn.Parameter(torch.empty(input_dim, units))
        self.bias = nn.Parameter(torch.zeros(units))
        nn.init.xavier_uniform_(self.kernel)
        self.activation = {None: lambda x: x, "relu": F.relu}[activation]

    def forward(self, inputs):
        return self.activation(torch.matmul(inputs, self.kernel) + self.bias)


class MultiHeadSelfAttention(nn.Module):
    def __init__(self, embed_dim, num_heads=8):
        super(MultiHeadSelfAttention, self).__init__()
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        if embed_dim % num_heads != 0:
            raise ValueError(
                f"embedding dimension = {embed_dim} should be divisible by number of heads = {num_heads}"
            )
        self.projection_dim = embed_dim // num_heads
        self.query_dense = Dense(embed_dim, embed_dim)
        self.key_dense = Dense(embed_dim, embed_dim)
        self.value_dense = Dense(embed_dim, embed_dim)
        self.combine_heads = Dense(embed_dim, embed_dim)

    @staticmethod
    def causal_attention_mask(n_dest, n_src, dtype):
        """
        1's in the lower triangle, counting from the lower right corner.
        """
        i = torch.arange(n_dest)[:, None]
        j = torch.arange(n_src)
        m = i >= j - n_src + n_dest
        return m.to(dtype)

    def attention(self, query, key, value):
        score = torch.matmul(query, key.transpose(-1, -2))
        dim_key = torch.tensor(key.shape[-1], dtype=torch.float32)
        scaled_score = score / torch.sqrt(dim_key)

        # prevent information flow from future tokens
        shape = scaled_score.shape
        dim_dest, dim_src = shape[2], shape[3]
        attention_mask = self.causal_attention_mask(
            dim_dest, dim_src, scaled_score.dtype
        )
        attention_mask = torch.reshape(attention_mask, [1, 1, dim_dest, dim_src])
        scaled_score = scaled_score * attention_mask - 1e4 * (1 - attention_mask)

        weights = F.softmax(scaled_score, dim=-1)
        output = torch.matmul(weights, value)
        return output, weights

    def separate_heads(self, x, batch_size):
        x = torch.reshape(x, (batch_size, -1, self.num_heads, self.projection_dim))
        return x.permute(0, 2, 1, 3)

    def forward(self, inputs):
        # x.shape = [batch_size, seq_len, embedding_dim]
        batch_size = inputs.shape[0]
        query = self.query_dense(inputs)  # (batch_size, seq_len, embed_dim)
        key = self.key_dense(inputs)  # (batch_size, seq_len, embed_dim)
        value = self.value_dense(inputs)  # (batch_size, seq_len, embed_dim)
        query = self.separate_heads(
            query, batch_size
        )  # (batch_size, num_heads, seq_len, projection_dim)
        key = self.separate_heads(
            key, batch_size
        )  # (batch_size, num_heads, seq_len, projection_dim)
        value = self.separate_heads(
            value, batch_size
        )  # (batch_size, num_heads, seq_len, projection_dim)
        attention, weights = self.attention(query, key, value)
        attention = attention.permute(
            0, 2, 1, 3
        )  # (batch_size, seq_len, num_heads, projection_dim)
        concat_attention = torch.reshape(
            attention, (batch_size, -1, self.embed_dim)
        )  # (batch_size, seq_len, embed_dim)
        output = self.combine_heads(
            concat_attention
        )  # (batch_size, seq_len, embed_dim)
        return output


class TransformerBlock(nn.Module):
    def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1):
        super(TransformerBlock, self).__init__()
        self.att = MultiHeadSelfAttention(embed_dim, num_heads)
        self.ffn = nn.Sequential(
            Dense(ff_dim, embed_dim, activation="relu"), Dense(embed_dim, ff_dim),
        )
        self.layernorm1 = nn.LayerNorm(embed_dim, eps=1e-6)
        self.layernorm2 = nn.LayerNorm(embed_dim, eps=1e-6)
        self.dropout1 = nn.Dropout(rate)
        self.dropout2 = nn.Dropout(rate)

    def forward(self, inputs):
        attention_output = self.att(self.layernorm1(inputs))
        attention_output = self.dropout1(attention_output)
        out1 = inputs + attention_output
        ffn_output = self.ffn(self.layernorm2(out1))
        ffn_output = self.dropout2(ffn_output)
        return out1 + ffn_output


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "keras-team/keras-io examples/generative/text_generation_with_miniature_gpt.py @ 040e8ba4b4bf32ba42d56130fd0f793bec57d097"
REFERENCE = {"n_head": 4, "activation": "relu", "norm_eps": 1e-6}
TOLERANCE = 1e-6  # sqrt(dim_key) is a float32 constant, as the example casts it
BLOCK = TransformerBlock
ARGS = {"embed_dim": 32, "num_heads": 4, "ff_dim": 128, "rate": 0.1}


def weights(b):
    a = b.att
    return {
        "ln1": (b.layernorm1.weight, b.layernorm1.bias),
        "q": (a.query_dense.kernel.T, a.query_dense.bias),
        "k": (a.key_dense.kernel.T, a.key_dense.bias),
        "v": (a.value_dense.kernel.T, a.value_dense.bias),
        "proj": (a.combine_heads.kernel.T, a.combine_heads.bias),
        "ln2": (b.layernorm2.weight, b.layernorm2.bias),
        "fc1": (b.ffn[0].kernel.T, b.ffn[0].bias),
        "fc2": (b.ffn[1].kernel.T, b.ffn[1].bias),
    }


SCALE = "scaled_score = score / torch.sqrt(dim_key)"
MASK = "scaled_score = scaled_score * attention_mask - 1e4 * (1 - attention_mask)"
SOFTMAX = "weights = F.softmax(scaled_score, dim=-1)"
A1 = "attention_output = self.att(self.layernorm1(inputs))"
R1 = "out1 = inputs + attention_output"
F1 = "ffn_output = self.ffn(self.layernorm2(out1))"
R2 = "return out1 + ffn_output"
MISTAKES = {
    "no_scaling": [(SCALE, "scaled_score = score")],
    "wrong_scale": [("dim_key = torch.tensor(key.shape[-1], dtype=torch.float32)",
                     "dim_key = torch.tensor(self.embed_dim, dtype=torch.float32)")],
    "wrong_scale:1/hs": [(SCALE, "scaled_score = score / dim_key")],
    "future_leak": [(MASK, "scaled_score = scaled_score")],
    "mask_zero": [(MASK, "scaled_score = scaled_score * attention_mask")],
    "mask_reversed": [("m = i >= j - n_src + n_dest", "m = i < j - n_src + n_dest")],
    "mask_after_softmax": [(MASK + "\n\n        " + SOFTMAX, "weights = F.softmax(scaled_score, dim=-1) * attention_mask")],
    "softmax_dim": [(SOFTMAX, "weights = F.softmax(scaled_score, dim=-2)")],
    "heads_mixed:split": [("x = torch.reshape(x, (batch_size, -1, self.num_heads, self.projection_dim))\n        return x.permute(0, 2, 1, 3)",
                           "return torch.reshape(x, (batch_size, self.num_heads, -1, self.projection_dim))")],
    "no_residual:attn": [(R1, "out1 = attention_output")],
    "no_residual:mlp": [(R2, "return ffn_output")],
    "shared_norm": [(F1, "ffn_output = self.ffn(self.layernorm1(out1))")],
    "post_norm": [
        (A1, "attention_output = self.att(inputs)"),
        (R1, "out1 = self.layernorm1(inputs + attention_output)"),
        (F1, "ffn_output = self.ffn(out1)"),
        (R2, "return self.layernorm2(out1 + ffn_output)"),
    ],
}
PAIRS = [("mask_zero", "wrong_scale")]
