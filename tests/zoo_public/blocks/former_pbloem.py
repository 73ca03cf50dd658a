# Source: pbloem/former, former/modules.py
#   commit 0b15530e59a9268636487805e9f0ad61bac4ca19: SelfAttention, TransformerBlock (and util.mask_).
# Kept: SelfAttention(emb, heads, mask) with three bias-free nn.Linear tokeys / toqueries / tovalues
# and unifyheads; heads folded into the batch (b * h, t, s) and torch.bmm; queries and keys each
# divided by a fourth root before the product; the in-place `mask_` helper that writes -inf above
# the diagonal through triu_indices; F.softmax(dot, dim=2); TransformerBlock(emb, heads, mask,
# seq_length, ff_hidden_mult=4, dropout) with norm1 / norm2, ff = Sequential(Linear, ReLU, Linear)
# and self.do.
# Reduced: the source divides by e ** (1/4) with e the full embedding width (overall 1/sqrt(emb));
# here by s ** (1/4), s the head size (the lessons' 1/sqrt(hs)); no kqnorm; the block is post-norm
# in the source (x = norm1(attended + x)): here pre-norm.
import torch
import torch.nn.functional as F
from torch import nn


def mask_(matrices, maskval=0.0, mask_diagonal=True):
    """
    Masks out all values in the given batch of matrices where i <= j holds,
    i < j if mask_diagonal is false

    In place operation
    """
    h, w = matrices.size(-2), matrices.size(-1)

    indices = torch.triu_indices(h, w, offset=0 if mask_diagonal else 1)
    matrices[..., indices[0], indices[1]] = maskval


class SelfAttention(nn.Module):
    """
    Canonical implementation of multi-head self attention.
    """

    def __init__(self, emb, heads=8, mask=False):
        super().__init__()

        assert emb % heads == 0, f'Embedding dimension ({emb}) should be divisible by nr. of heads ({heads})'

        self.emb = emb
        self.heads = heads
        self.mask = mask

        s = emb // heads
        # - We will break the embedding into `heads` chunks and feed each to a different attention head

        self.tokeys    = nn.Linear(emb, emb, bias=False)
        self.toqueries = nn.Linear(emb, emb, bias=False)
        self.tovalues  = nn.Linear(emb, emb, bias=False)

        self.unifyheads = nn.Linear(emb, emb)

    def forward(self, x):

        b, t, e = x.size()
        h = self.heads
        assert e == self.emb, f'Input embedding dim ({e}) should match layer embedding dim ({self.emb})'

        s = e // h

        keys    = self.tokeys(x)
        queries = self.toqueries(x)
        values  = self.tovalues(x)

        keys    = keys.view(b, t, h, s)
        queries = queries.view(b, t, h, s)
        values  = values.view(b, t, h, s)

        # - fold heads into the batch dimension
        keys = keys.transpose(1, 2).contiguous().view(b * h, t, s)
        queries = queries.transpose(1, 2).contiguous().view(b * h, t, s)
        values = values.transpose(1, 2).contiguous().view(b * h, t, s)

        queries = queries / (s ** (1/4))
        keys    = keys / (s ** (1/4))
        # - Instead of dividing the dot products by sqrt(e), we scale the keys and values.
        #   This should be more memory efficient

        # - get dot product of queries and keys, and scale
        dot = torch.bmm(queries, keys.transpose(1, 2))

        assert dot.size() == (b*h, t, t)

        if self.mask: # mask out the upper half of the dot matrix, excluding the diagonal
            mask_(dot, maskval=float('-inf'), mask_diagonal=False)

        dot = F.softmax(dot, dim=2)
        # - dot now has row-wise self-attention probabilities

        # apply the self attention to the values
        out = torch.bmm(dot, values).view(b, h, t, s)

        # swap h, t back, unify heads
        out = out.transpose(1, 2).contiguous().view(b, t, s * h)

        return self.unifyheads(out)


class TransformerBlock(nn.Module):

    def __init__(self, emb, heads, mask, seq_length, ff_hidden_mult=4, dropout=0.0):
        super().__init__()

        self.attention = SelfAttention(emb, heads=heads, mask=mask)
        self.mask = mask

        self.norm1 = nn.LayerNorm(emb)
        self.norm2 = nn.LayerNorm(emb)

        self.ff = nn.Sequential(
            nn.Linear(emb, ff_hidden_mult * emb),
            nn.ReLU(),
            nn.Linear(ff_hidden_mult * emb, emb)
        )

        self.do = nn.Dropout(dropout)

    def forward(self, x):

        attended = self.attention(self.norm1(x))

        x = attended + x

        x = self.do(x)

        fedforward = self.ff(self.norm2(x))

        x = fedforward + x

        x = self.do(x)

        return x


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "pbloem/former former/modules.py @ 0b15530e59a9268636487805e9f0ad61bac4ca19"
REFERENCE = {"n_head": 4, "activation": "relu"}
BLOCK = TransformerBlock
ARGS = {"emb": 32, "heads": 4, "mask": True, "seq_length": 16, "ff_hidden_mult": 4, "dropout": 0.1}


def weights(b):
    a = b.attention
    return {
        "ln1": (b.norm1.weight, b.norm1.bias),
        "q": (a.toqueries.weight, None),
        "k": (a.tokeys.weight, None),
        "v": (a.tovalues.weight, None),
        "proj": (a.unifyheads.weight, a.unifyheads.bias),
        "ln2": (b.norm2.weight, b.norm2.bias),
        "fc1": (b.ff[0].weight, b.ff[0].bias),
        "fc2": (b.ff[2].weight, b.ff[2].bias),
    }


QS = "queries = queries / (s ** (1/4))"
KS = "keys    = keys / (s ** (1/4))"
MASK = "mask_(dot, maskval=float('-inf'), mask_diagonal=False)"
SOFTMAX = "dot = F.softmax(dot, dim=2)"
A1 = "attended = self.attention(self.norm1(x))"
R1 = "x = attended + x"
F1 = "fedforward = self.ff(self.norm2(x))"
R2 = "x = fedforward + x"
MISTAKES = {
    "no_scaling": [(QS, "queries = queries"), (KS, "keys    = keys")],
    "wrong_scale": [(QS, "queries = queries / (e ** (1/4))"), (KS, "keys    = keys / (e ** (1/4))")],
    "wrong_scale:1/hs": [(QS, "queries = queries / (s ** (1/2))"), (KS, "keys    = keys / (s ** (1/2))")],
    "future_leak": [("if self.mask: # mask", "if False: # mask")],
    "mask_zero": [(MASK, "mask_(dot, maskval=0.0, mask_diagonal=False)")],
    "softmax_dim": [(SOFTMAX, "dot = F.softmax(dot, dim=1)")],
    "heads_mixed:merge": [("out = out.transpose(1, 2).contiguous().view(b, t, s * h)", "out = out.contiguous().view(b, t, s * h)")],
    "no_residual:attn": [(R1, "x = attended")],
    "no_residual:mlp": [(R2, "x = fedforward")],
    "shared_norm": [(F1, "fedforward = self.ff(self.norm1(x))")],
    "post_norm": [
        (A1, "attended = self.attention(x)"),
        (R1, "x = self.norm1(attended + x)"),
        (F1, "fedforward = self.ff(x)"),
        (R2, "x = self.norm2(fedforward + x)"),
    ],
}
PAIRS = [("wrong_scale", "no_residual:mlp")]
