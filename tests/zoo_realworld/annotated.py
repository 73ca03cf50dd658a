"""The Annotated Transformer's encoder layer, made causal: clones(nn.Linear, 4), an
``attention()`` function with a -1e9 mask, its own LayerNorm (unbiased std, eps added to the std),
``SublayerConnection`` holding each branch's norm, ``PositionwiseFeedForward`` (w_1, w_2).
"""

import copy
import math

import torch
import torch.nn as nn

from .common import HEAD_BUGS, MANUAL_BUGS, Style, merge_heads, scale, softmax_masked, split_heads


def clones(module, N):
    return nn.ModuleList([copy.deepcopy(module) for _ in range(N)])


class LayerNorm(nn.Module):
    """The Annotated Transformer's LayerNorm: a_2 * (x - mean) / (std + eps) + b_2."""

    def __init__(self, features, eps=1e-6):
        super().__init__()
        self.a_2 = nn.Parameter(torch.ones(features))
        self.b_2 = nn.Parameter(torch.zeros(features))
        self.eps = eps

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        std = x.std(-1, keepdim=True)
        return self.a_2 * (x - mean) / (std + self.eps) + self.b_2


def attention(query, key, value, mask, bugs, C):
    d_k = query.size(-1)
    scores = torch.matmul(query, key.transpose(-2, -1)) * scale(bugs, 1 / math.sqrt(d_k), d_k, C)
    return softmax_masked(scores, mask, bugs, fill=-1e9) @ value


class MultiHeadedAttention(nn.Module):
    def __init__(self, h, d_model, bugs, dropout=0.1):
        super().__init__()
        self.d_k, self.h, self.bugs = d_model // h, h, bugs
        self.linears = clones(nn.Linear(d_model, d_model), 4)
        self.dropout = nn.Dropout(p=dropout)

    def forward(self, query, key, value, mask):
        C = query.size(-1)
        query, key, value = [
            split_heads(lin(x), self.h, self.bugs)
            for lin, x in zip(self.linears, (query, key, value), strict=False)
        ]
        x = attention(query, key, value, mask, self.bugs, C)
        return self.linears[-1](merge_heads(x, self.bugs))


class PositionwiseFeedForward(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.1):
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.w_2(self.dropout(self.w_1(x).relu()))


class SublayerConnection(nn.Module):
    """x + dropout(sublayer(norm(x))); post-norm puts the norm after the sum."""

    def __init__(self, size, dropout, bugs):
        super().__init__()
        self.norm = LayerNorm(size)
        self.dropout = nn.Dropout(dropout)
        self.bugs = bugs

    def forward(self, x, sublayer):
        if "post_norm" in self.bugs:
            return self.norm(x + self.dropout(sublayer(x)))
        if "no_residual:normed" in self.bugs:
            x = self.norm(x)
            return x + self.dropout(sublayer(x))
        return x + self.dropout(sublayer(self.norm(x)))


class EncoderLayer(nn.Module):
    """EncoderLayer(size, self_attn, feed_forward, dropout), with a subsequent_mask inside."""

    def __init__(self, size, self_attn, feed_forward, dropout, bugs):
        super().__init__()
        self.self_attn, self.feed_forward, self.size = self_attn, feed_forward, size
        self.sublayer = clones(SublayerConnection(size, dropout, bugs), 2)
        self.bugs = bugs

    def forward(self, x):
        T = x.size(1)
        mask = torch.triu(torch.ones((1, T, T), device=x.device), diagonal=1).type(torch.uint8) == 0
        x = self.sublayer[0](x, lambda x: self.self_attn(x, x, x, mask))
        return self.sublayer[1](x, self.feed_forward)


def make_layer(d_model, h, dropout=0.1, bugs=frozenset()):
    """The Annotated Transformer's make_model, for one layer."""
    attn = MultiHeadedAttention(h, d_model, bugs, dropout)
    ff = PositionwiseFeedForward(d_model, 4 * d_model, dropout)
    return EncoderLayer(d_model, attn, ff, dropout, bugs)


class SequentialFFN(nn.Module):
    """The Annotated attention with the FFN as an nn.Sequential and norms as nn.LayerNorm."""

    def __init__(self, d_model, h, bugs=frozenset()):
        super().__init__()
        self.norm_1 = nn.LayerNorm(d_model)
        self.attn = MultiHeadedAttention(h, d_model, bugs)
        self.norm_2 = nn.LayerNorm(d_model)
        self.ffn = nn.Sequential(
            nn.Linear(d_model, 4 * d_model),
            nn.ReLU(),
            nn.Dropout(0.1),
            nn.Linear(4 * d_model, d_model),
        )
        self.bugs = bugs

    def forward(self, x):
        T = x.size(1)
        mask = torch.tril(torch.ones(T, T, device=x.device)).unsqueeze(0) == 1
        h = self.norm_1(x)
        x = x + self.attn(h, h, h, mask)
        ln = self.norm_1 if "shared_norm" in self.bugs else self.norm_2
        return x + self.ffn(ln(x))


STYLES = [
    Style(
        "annotated",
        "the Annotated Transformer's EncoderLayer (its own LayerNorm, SublayerConnection), causal",
        make_layer,
        {"d_model": 32, "h": 4, "dropout": 0.1},
        (*MANUAL_BUGS, *HEAD_BUGS, "post_norm", "no_residual:normed"),
        (
            ("wrong_scale", "post_norm"),
            ("mask_zero", "heads_mixed:merge"),
            ("no_scaling", "no_residual:normed"),
        ),
    ),
    Style(
        "annotated-sequential",
        "the Annotated Transformer's MultiHeadedAttention with an nn.Sequential FFN",
        SequentialFFN,
        {"d_model": 24, "h": 2},
        (*MANUAL_BUGS, *HEAD_BUGS, "shared_norm"),
        (("softmax_dim", "shared_norm"),),
    ),
]
