# Source: d2l-ai/d2l-en, d2l/torch.py
#   commit c3fb91b02a8ea24e15134326872983d773c494cf: masked_softmax, DotProductAttention, MultiHeadAttention
#   (transpose_qkv / transpose_output), PositionWiseFFN, AddNorm, TransformerDecoderBlock.
# Kept: MultiHeadAttention(num_hiddens, num_heads, dropout, bias=False) with W_q/W_k/W_v/W_o,
# heads folded into the batch by transpose_qkv (batch * heads, T, hs), bmm scores divided by
# math.sqrt(d), masked_softmax with valid lengths (dec_valid_lens = 1..T, the decoder's causal
# mask) filled with -1e6, PositionWiseFFN dense1/relu/dense2, AddNorm's dropout.
# Reduced: AddNorm is post-norm in d2l (ln(dropout(Y) + X)); here the pre-norm wiring, with the
# AddNorm modules' LayerNorms; no cross-attention; nn.Linear instead of nn.LazyLinear.
import math

import torch
from torch import nn


def sequence_mask(X, valid_len, value=0):
    """Mask irrelevant entries in sequences."""
    maxlen = X.size(1)
    mask = torch.arange((maxlen), dtype=torch.float32, device=X.device)[None, :] < valid_len[:, None]
    X[~mask] = value
    return X


def masked_softmax(X, valid_lens):
    """Perform softmax operation by masking elements on the last axis."""
    # X: 3D tensor, valid_lens: 1D or 2D tensor
    if valid_lens is None:
        return nn.functional.softmax(X, dim=-1)
    else:
        shape = X.shape
        if valid_lens.dim() == 1:
            valid_lens = torch.repeat_interleave(valid_lens, shape[1])
        else:
            valid_lens = valid_lens.reshape(-1)
        # On the last axis, replace masked elements with a very large negative
        # value, whose exponentiation outputs 0
        X = sequence_mask(X.reshape(-1, shape[-1]), valid_lens, value=-1e6)
        return nn.functional.softmax(X.reshape(shape), dim=-1)


class DotProductAttention(nn.Module):
    """Scaled dot product attention."""

    def __init__(self, dropout):
        super().__init__()
        self.dropout = nn.Dropout(dropout)

    # Shape of queries: (batch_size, no. of queries, d)
    # Shape of keys: (batch_size, no. of key-value pairs, d)
    # Shape of values: (batch_size, no. of key-value pairs, value dimension)
    # Shape of valid_lens: (batch_size,) or (batch_size, no. of queries)
    def forward(self, queries, keys, values, valid_lens=None):
        d = queries.shape[-1]
        # Swap the last two dimensions of keys with keys.transpose(1, 2)
        scores = torch.bmm(queries, keys.transpose(1, 2)) / math.sqrt(d)
        self.attention_weights = masked_softmax(scores, valid_lens)
        return torch.bmm(self.dropout(self.attention_weights), values)


class MultiHeadAttention(nn.Module):
    """Multi-head attention."""

    def __init__(self, num_hiddens, num_heads, dropout, bias=False, **kwargs):
        super().__init__()
        self.num_heads = num_heads
        self.attention = DotProductAttention(dropout)
        self.W_q = nn.Linear(num_hiddens, num_hiddens, bias=bias)
        self.W_k = nn.Linear(num_hiddens, num_hiddens, bias=bias)
        self.W_v = nn.Linear(num_hiddens, num_hiddens, bias=bias)
        self.W_o = nn.Linear(num_hiddens, num_hiddens, bias=bias)

    def forward(self, queries, keys, values, valid_lens):
        # Shape of queries, keys, or values:
        # (batch_size, no. of queries or key-value pairs, num_hiddens)
        # After transposing, shape of output queries, keys, or values:
        # (batch_size * num_heads, no. of queries or key-value pairs, num_hiddens / num_heads)
        queries = self.transpose_qkv(self.W_q(queries))
        keys = self.transpose_qkv(self.W_k(keys))
        values = self.transpose_qkv(self.W_v(values))

        if valid_lens is not None:
            # On axis 0, copy the first item (scalar or vector) for num_heads
            # times, then copy the next item, and so on
            valid_lens = torch.repeat_interleave(valid_lens, repeats=self.num_heads, dim=0)

        # Shape of output: (batch_size * num_heads, no. of queries, num_hiddens / num_heads)
        output = self.attention(queries, keys, values, valid_lens)
        # Shape of output_concat: (batch_size, no. of queries, num_hiddens)
        output_concat = self.transpose_output(output)
        return self.W_o(output_concat)

    def transpose_qkv(self, X):
        """Transposition for parallel computation of multiple attention heads."""
        # Shape of input X: (batch_size, no. of queries or key-value pairs, num_hiddens).
        # Shape of output X: (batch_size, no. of queries or key-value pairs, num_heads, num_hiddens / num_heads)
        X = X.reshape(X.shape[0], X.shape[1], self.num_heads, -1)
        # Shape of output X: (batch_size, num_heads, no. of queries or key-value pairs, num_hiddens / num_heads)
        X = X.permute(0, 2, 1, 3)
        # Shape of output: (batch_size * num_heads, no. of queries or key-value pairs, num_hiddens / num_heads)
        return X.reshape(-1, X.shape[2], X.shape[3])

    def transpose_output(self, X):
        """Reverse the operation of transpose_qkv."""
        X = X.reshape(-1, self.num_heads, X.shape[1], X.shape[2])
        X = X.permute(0, 2, 1, 3)
        return X.reshape(X.shape[0], X.shape[1], -1)


class PositionWiseFFN(nn.Module):
    """The positionwise feed-forward network."""

    def __init__(self, ffn_num_hiddens, ffn_num_outputs):
        super().__init__()
        self.dense1 = nn.Linear(ffn_num_outputs, ffn_num_hiddens)
        self.relu = nn.ReLU()
        self.dense2 = nn.Linear(ffn_num_hiddens, ffn_num_outputs)

    def forward(self, X):
        return self.dense2(self.relu(self.dense1(X)))


class TransformerDecoderBlock(nn.Module):
    # The i-th block in the Transformer decoder (self-attention and FFN only)
    def __init__(self, num_hiddens, ffn_num_hiddens, num_heads, dropout, i=0):
        super().__init__()
        self.i = i
        self.attention1 = MultiHeadAttention(num_hiddens, num_heads, dropout)
        self.ln1 = nn.LayerNorm(num_hiddens)
        self.drop1 = nn.Dropout(dropout)
        self.ffn = PositionWiseFFN(ffn_num_hiddens, num_hiddens)
        self.ln3 = nn.LayerNorm(num_hiddens)
        self.drop3 = nn.Dropout(dropout)

    def forward(self, X):
        batch_size, num_steps, _ = X.shape
        # Shape of dec_valid_lens: (batch_size, num_steps), where every
        # row is [1, 2, ..., num_steps]
        dec_valid_lens = torch.arange(1, num_steps + 1, device=X.device).repeat(batch_size, 1)
        Y = self.ln1(X)
        X = X + self.drop1(self.attention1(Y, Y, Y, dec_valid_lens))
        Z = self.ln3(X)
        return X + self.drop3(self.ffn(Z))


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "d2l-ai/d2l-en d2l/torch.py @ c3fb91b02a8ea24e15134326872983d773c494cf (MultiHeadAttention, TransformerDecoderBlock)"
REFERENCE = {"n_head": 4, "activation": "relu"}
BLOCK = TransformerDecoderBlock
ARGS = {"num_hiddens": 32, "ffn_num_hiddens": 128, "num_heads": 4, "dropout": 0.1}


def weights(b):
    a, f = b.attention1, b.ffn
    return {
        "ln1": (b.ln1.weight, b.ln1.bias),
        "q": (a.W_q.weight, None),
        "k": (a.W_k.weight, None),
        "v": (a.W_v.weight, None),
        "proj": (a.W_o.weight, None),
        "ln2": (b.ln3.weight, b.ln3.bias),
        "fc1": (f.dense1.weight, f.dense1.bias),
        "fc2": (f.dense2.weight, f.dense2.bias),
    }


SCORES = "scores = torch.bmm(queries, keys.transpose(1, 2)) / math.sqrt(d)"
MISTAKES = {
    "no_scaling": [(SCORES, "scores = torch.bmm(queries, keys.transpose(1, 2))")],
    "wrong_scale": [(SCORES, "scores = torch.bmm(queries, keys.transpose(1, 2)) / math.sqrt(d * 4)")],
    "wrong_scale:1/hs": [(SCORES, "scores = torch.bmm(queries, keys.transpose(1, 2)) / d")],
    "future_leak": [
        ("X + self.drop1(self.attention1(Y, Y, Y, dec_valid_lens))", "X + self.drop1(self.attention1(Y, Y, Y, None))")
    ],
    "mask_zero": [("valid_lens, value=-1e6)", "valid_lens, value=0)")],
    "softmax_dim": [
        (
            "return nn.functional.softmax(X.reshape(shape), dim=-1)",
            "return nn.functional.softmax(X.reshape(shape), dim=-2)",
        )
    ],
    "post_norm": [
        (
            "Y = self.ln1(X)\n        X = X + self.drop1(self.attention1(Y, Y, Y, dec_valid_lens))",
            "X = self.ln1(X + self.drop1(self.attention1(X, X, X, dec_valid_lens)))",
        ),
        (
            "Z = self.ln3(X)\n        return X + self.drop3(self.ffn(Z))",
            "return self.ln3(X + self.drop3(self.ffn(X)))",
        ),
    ],
    "no_residual:attn": [("X = X + self.drop1(", "X = self.drop1(")],
    "no_residual:mlp": [("return X + self.drop3(self.ffn(Z))", "return self.drop3(self.ffn(Z))")],
    "shared_norm": [("Z = self.ln3(X)", "Z = self.ln1(X)")],
}
PAIRS = [("wrong_scale", "no_residual:mlp"), ("mask_zero", "post_norm")]
