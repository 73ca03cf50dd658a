"""Blocks on PyTorch's own modules: nn.MultiheadAttention wrappers, nn.TransformerEncoderLayer.

The mistakes these invite are the second lesson's "common mistakes": batch_first forgotten, a
mask with True on the allowed positions, post-norm by accident, and a mask not passed at all.
"""

import torch
import torch.nn as nn
from torch.nn import functional as F

from .common import WIRING_BUGS, Style, dropout, finish, residual

MHA_BUGS = ("batch_mixing", "mask_reversed", "future_leak", "dropout_in_eval")


def causal_mask(T, bugs, device=None):
    """lesson 2's bool mask (True = may not attend), or the mistaken one."""
    if "mask_reversed" in bugs:
        return torch.tril(torch.ones(T, T, dtype=torch.bool, device=device))
    return torch.triu(torch.ones(T, T, dtype=torch.bool, device=device), diagonal=1)


class Lesson2(nn.Module):
    """lesson 2's block: norm1, self_attn, norm2, linear1, linear2 (the encoder layer's names)."""

    def __init__(self, d_model, n_heads, dropout=0.1, bugs=frozenset()):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model, eps=0.0 if "nonfinite:norm" in bugs else 1e-5)
        self.self_attn = nn.MultiheadAttention(
            d_model, n_heads, dropout=dropout, batch_first="batch_mixing" not in bugs
        )
        self.norm2 = nn.LayerNorm(d_model)
        self.linear1 = nn.Linear(d_model, 4 * d_model)
        self.linear2 = nn.Linear(4 * d_model, d_model)
        self.p, self.bugs = dropout, bugs

    def attn(self, h):
        mask = None if "future_leak" in self.bugs else causal_mask(h.shape[1], self.bugs, h.device)
        a, _ = self.self_attn(h, h, h, attn_mask=mask, need_weights=False)
        return dropout(a, self.p, self.training, self.bugs)  # on the attention output

    def mlp(self, h):
        return self.linear2(F.gelu(self.linear1(h)))

    def forward(self, x):
        return finish(
            residual(x, self.attn, self.mlp, self.norm1, self.norm2, self.bugs), self.bugs
        )


class MhaSequential(nn.Module):
    """A learner's block: ln_a / attn / ln_b and an nn.Sequential MLP; a float -inf mask."""

    def __init__(self, embed_dim, num_heads, dropout=0.1, bugs=frozenset()):
        super().__init__()
        self.ln_a = nn.LayerNorm(embed_dim)
        self.attn = nn.MultiheadAttention(
            embed_dim, num_heads, dropout, bias=False, batch_first="batch_mixing" not in bugs
        )
        self.ln_b = nn.LayerNorm(embed_dim)
        self.mlp = nn.Sequential(
            nn.Linear(embed_dim, 4 * embed_dim), nn.GELU(approximate="tanh"),
            nn.Linear(4 * embed_dim, embed_dim), nn.Dropout(dropout),
        )  # fmt: skip
        self.bugs = bugs

    def sa(self, h):
        T = h.shape[1]
        if "future_leak" in self.bugs:
            return self.attn(h, h, h)[0]
        if "mask_reversed" in self.bugs:
            return self.attn(h, h, h, attn_mask=causal_mask(T, self.bugs, h.device))[0]
        mask = nn.Transformer.generate_square_subsequent_mask(T, device=h.device, dtype=h.dtype)
        out = self.attn(h, h, h, attn_mask=mask, is_causal=True, need_weights=False)[0]
        return F.dropout(out, 0.1) if "dropout_in_eval" in self.bugs else out

    def forward(self, x):
        return finish(residual(x, self.sa, self.mlp, self.ln_a, self.ln_b, self.bugs), self.bugs)


class EncoderLayer(nn.Module):
    """A user module around nn.TransformerEncoderLayer, called with a causal mask."""

    def __init__(self, d_model, nhead, dropout=0.1, bugs=frozenset()):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(
            d_model, nhead, 4 * d_model, dropout, activation="gelu",
            batch_first="batch_mixing" not in bugs, norm_first="post_norm" not in bugs,
        )  # fmt: skip
        self.bugs = bugs

    def forward(self, x):
        if "future_leak" in self.bugs:
            return self.layer(x)
        T = x.shape[0 if "batch_mixing" in self.bugs else 1]
        mask = causal_mask(T, self.bugs, x.device)
        return self.layer(x, src_mask=mask, is_causal="mask_reversed" not in self.bugs)


class ReluEncoderLayer(nn.Module):
    """The encoder layer with its defaults (ReLU, dim_feedforward 2048) and a float mask."""

    def __init__(self, d_model, nhead, dropout=0.1, bugs=frozenset()):
        super().__init__()
        self.block = nn.TransformerEncoderLayer(
            d_model, nhead, dropout=dropout, batch_first=True, norm_first="post_norm" not in bugs
        )
        self.bugs = bugs

    def forward(self, src):
        mask = nn.Transformer.generate_square_subsequent_mask(src.size(1), device=src.device)
        if "future_leak" in self.bugs:
            mask = None
        return self.block(src, src_mask=mask)


STYLES = [
    Style(
        "mha-lesson2",
        "lesson 2's block on nn.MultiheadAttention",
        Lesson2,
        {"d_model": 32, "n_heads": 4, "dropout": 0.1},
        (*MHA_BUGS, *WIRING_BUGS, "nonfinite:norm", "dtype_device"),
        (
            ("batch_mixing", "post_norm"),
            ("mask_reversed", "shared_norm"),
            ("future_leak", "no_residual:attn"),
            ("batch_mixing", "future_leak", "post_norm"),
        ),
    ),
    Style(
        "mha-sequential",
        "nn.MultiheadAttention (no bias) with an nn.Sequential MLP (tanh GELU)",
        MhaSequential,
        {"embed_dim": 48, "num_heads": 3, "dropout": 0.1},
        (*MHA_BUGS, *WIRING_BUGS),
        (("batch_mixing", "no_residual:normed"), ("future_leak", "shared_norm")),
    ),
    Style(
        "encoder-layer",
        "nn.TransformerEncoderLayer(norm_first=True, batch_first=True) in a wrapper",
        EncoderLayer,
        {"d_model": 32, "nhead": 2, "dropout": 0.1},
        ("batch_mixing", "post_norm", "future_leak", "mask_reversed"),
        (
            ("batch_mixing", "post_norm"),
            ("future_leak", "post_norm"),
            ("batch_mixing", "future_leak"),
        ),
    ),
    Style(
        "encoder-layer-relu",
        "nn.TransformerEncoderLayer's defaults (ReLU, 2048 wide) with a float mask",
        ReluEncoderLayer,
        {"d_model": 16, "nhead": 4, "dropout": 0.1},
        ("post_norm", "future_leak"),
        (("post_norm", "future_leak"),),
    ),
]
