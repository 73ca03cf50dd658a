# Source: harvardnlp/annotated-transformer, the_annotated_transformer.py
#   commit 0a91a254735c07532e23733dce8a693e504f3a08: clones, LayerNorm,
#   SublayerConnection, attention, MultiHeadedAttention, PositionwiseFeedForward,
#   subsequent_mask, DecoderLayer (self-attention part).
# Kept: MultiHeadedAttention(h, d_model) with clones(nn.Linear, 4) zipped with (query, key,
# value), the module-level attention() function with masked_fill(mask == 0, -1e9), the
# SublayerConnection (already pre-norm: x + dropout(sublayer(norm(x)))) called with lambdas,
# a_2 / b_2 LayerNorm, w_1 / w_2 ReLU MLP, subsequent_mask built with triu.
# Reduced: the LayerNorm's maths to the lessons' (biased variance, eps inside the root; the
# source divides by the unbiased std + eps); no cross-attention (a decoder-only layer).
import copy
import math

import torch
import torch.nn as nn


def clones(module, N):
    "Produce N identical layers."
    return nn.ModuleList([copy.deepcopy(module) for _ in range(N)])


class LayerNorm(nn.Module):
    "Construct a layernorm module (See citation for details)."

    def __init__(self, features, eps=1e-5):
        super().__init__()
        self.a_2 = nn.Parameter(torch.ones(features))
        self.b_2 = nn.Parameter(torch.zeros(features))
        self.eps = eps

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = x.var(-1, unbiased=False, keepdim=True)
        return self.a_2 * (x - mean) / torch.sqrt(var + self.eps) + self.b_2


class SublayerConnection(nn.Module):
    """
    A residual connection followed by a layer norm.
    Note for code simplicity the norm is first as opposed to last.
    """

    def __init__(self, size, dropout):
        super().__init__()
        self.norm = LayerNorm(size)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, sublayer):
        "Apply residual connection to any sublayer with the same size."
        return x + self.dropout(sublayer(self.norm(x)))


def subsequent_mask(size):
    "Mask out subsequent positions."
    attn_shape = (1, size, size)
    subsequent_mask = torch.triu(torch.ones(attn_shape), diagonal=1).type(torch.uint8)
    return subsequent_mask == 0


def attention(query, key, value, mask=None, dropout=None):
    "Compute 'Scaled Dot Product Attention'"
    d_k = query.size(-1)
    scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)
    p_attn = scores.softmax(dim=-1)
    if dropout is not None:
        p_attn = dropout(p_attn)
    return torch.matmul(p_attn, value), p_attn


class MultiHeadedAttention(nn.Module):
    def __init__(self, h, d_model, dropout=0.1):
        "Take in model size and number of heads."
        super().__init__()
        assert d_model % h == 0
        # We assume d_v always equals d_k
        self.d_k = d_model // h
        self.h = h
        self.linears = clones(nn.Linear(d_model, d_model), 4)
        self.attn = None
        self.dropout = nn.Dropout(p=dropout)

    def forward(self, query, key, value, mask=None):
        "Implements Figure 2"
        if mask is not None:
            # Same mask applied to all h heads.
            mask = mask.unsqueeze(1)
        nbatches = query.size(0)

        # 1) Do all the linear projections in batch from d_model => h x d_k
        query, key, value = [
            lin(x).view(nbatches, -1, self.h, self.d_k).transpose(1, 2)
            for lin, x in zip(self.linears, (query, key, value))
        ]

        # 2) Apply attention on all the projected vectors in batch.
        x, self.attn = attention(query, key, value, mask=mask, dropout=self.dropout)

        # 3) "Concat" using a view and apply a final linear.
        x = x.transpose(1, 2).contiguous().view(nbatches, -1, self.h * self.d_k)
        del query
        del key
        del value
        return self.linears[-1](x)


class PositionwiseFeedForward(nn.Module):
    "Implements FFN equation."

    def __init__(self, d_model, d_ff, dropout=0.1):
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.w_2(self.dropout(self.w_1(x).relu()))


class DecoderLayer(nn.Module):
    "Decoder is made of self-attn and feed forward (the source's src-attn left out)"

    def __init__(self, size, self_attn, feed_forward, dropout):
        super().__init__()
        self.size = size
        self.self_attn = self_attn
        self.feed_forward = feed_forward
        self.sublayer = clones(SublayerConnection(size, dropout), 2)

    def forward(self, x, tgt_mask):
        "Follow Figure 1 (right) for connections."
        x = self.sublayer[0](x, lambda x: self.self_attn(x, x, x, tgt_mask))
        return self.sublayer[1](x, self.feed_forward)


class Block(nn.Module):
    """The layer as make_model builds it, given the target mask the way run_epoch does."""

    def __init__(self, d_model=32, h=4, dropout=0.1):
        super().__init__()
        c = copy.deepcopy
        attn = MultiHeadedAttention(h, d_model)
        ff = PositionwiseFeedForward(d_model, 4 * d_model, dropout)
        self.layer = DecoderLayer(d_model, c(attn), c(ff), dropout)

    def forward(self, x):
        return self.layer(x, subsequent_mask(x.size(1)).to(x.device))


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "harvardnlp/annotated-transformer the_annotated_transformer.py @ 0a91a254735c07532e23733dce8a693e504f3a08"
REFERENCE = {"n_head": 4, "activation": "relu"}
BLOCK = Block
ARGS = {"d_model": 32, "h": 4}


def weights(b):
    layer = b.layer
    lin, ff = layer.self_attn.linears, layer.feed_forward
    n1, n2 = layer.sublayer[0].norm, layer.sublayer[1].norm
    return {
        "ln1": (n1.a_2, n1.b_2),
        "q": (lin[0].weight, lin[0].bias),
        "k": (lin[1].weight, lin[1].bias),
        "v": (lin[2].weight, lin[2].bias),
        "proj": (lin[3].weight, lin[3].bias),
        "ln2": (n2.a_2, n2.b_2),
        "fc1": (ff.w_1.weight, ff.w_1.bias),
        "fc2": (ff.w_2.weight, ff.w_2.bias),
    }


SCORES = "scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(d_k)"
FILL = "scores = scores.masked_fill(mask == 0, -1e9)"
MISTAKES = {
    "no_scaling": [(SCORES, "scores = torch.matmul(query, key.transpose(-2, -1))")],
    "wrong_scale:1/hs": [(SCORES, "scores = torch.matmul(query, key.transpose(-2, -1)) / d_k")],
    "future_leak": [("return self.layer(x, subsequent_mask(x.size(1)).to(x.device))", "return self.layer(x, None)")],
    "mask_zero": [(FILL, "scores = scores.masked_fill(mask == 0, 0)")],
    "mask_reversed": [(FILL, "scores = scores.masked_fill(mask == 1, -1e9)")],
    "softmax_dim": [("p_attn = scores.softmax(dim=-1)", "p_attn = scores.softmax(dim=-2)")],
    "heads_mixed:merge": [
        (
            "x = x.transpose(1, 2).contiguous().view(nbatches, -1, self.h * self.d_k)",
            "x = x.contiguous().view(nbatches, -1, self.h * self.d_k)",
        )
    ],
    "no_residual:both": [
        ("return x + self.dropout(sublayer(self.norm(x)))", "return self.dropout(sublayer(self.norm(x)))")
    ],  # in both sublayers
    "post_norm": [
        ("return x + self.dropout(sublayer(self.norm(x)))", "return self.norm(x + self.dropout(sublayer(x)))")
    ],
    "shared_norm": [
        ("return self.sublayer[1](x, self.feed_forward)", "return x + self.feed_forward(self.sublayer[0].norm(x))")
    ],
}
PAIRS = [("no_scaling", "post_norm"), ("mask_zero", "shared_norm")]
