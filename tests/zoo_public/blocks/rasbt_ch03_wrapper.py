# Source: rasbt/LLMs-from-scratch, ch03/01_main-chapter-code/ch03.ipynb
#   commit 80c95987c1c16ce9895ce708dc7b9180317e8599: CausalAttention and
#   MultiHeadAttentionWrapper (section 3.6.1), used in ch04's TransformerBlock.
# Kept: each head a CausalAttention module of its own, with W_query / W_key / W_value
# (qkv_bias=False), its own triu `mask` buffer and in-place masked_fill_ with -torch.inf, the
# scaling by keys.shape[-1] ** 0.5 inside the softmax call; the wrapper concatenating the heads
# with torch.cat(..., dim=-1) and *no output projection*; the book's LayerNorm, GELU and
# FeedForward imported from the previous chapter's module, as the book's chapters import
# `previous_chapters`; TransformerBlock(cfg) with its `shortcut` residuals.
# Reduced: ch04's block uses ch03's MultiHeadAttention; here the wrapper stands in for it, each
# head of width emb_dim // n_heads (as exercise 3.2 sizes them).
import torch
import torch.nn as nn

from zoo_public.blocks.rasbt_ch04 import FeedForward, LayerNorm


class CausalAttention(nn.Module):
    def __init__(self, d_in, d_out, context_length, dropout, qkv_bias=False):
        super().__init__()
        self.d_out = d_out
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.dropout = nn.Dropout(dropout)  # New
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))  # New

    def forward(self, x):
        b, num_tokens, d_in = x.shape  # New batch dimension b
        keys = self.W_key(x)
        queries = self.W_query(x)
        values = self.W_value(x)

        attn_scores = queries @ keys.transpose(1, 2)  # Changed transpose
        attn_scores.masked_fill_(  # New, _ ops are in-place
            self.mask.bool()[:num_tokens, :num_tokens], -torch.inf
        )  # `:num_tokens` to account for cases where the number of tokens in the batch is smaller than the supported context_size
        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
        attn_weights = self.dropout(attn_weights)  # New

        context_vec = attn_weights @ values
        return context_vec


class MultiHeadAttentionWrapper(nn.Module):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        self.heads = nn.ModuleList(
            [CausalAttention(d_in, d_out, context_length, dropout, qkv_bias) for _ in range(num_heads)]
        )

    def forward(self, x):
        return torch.cat([head(x) for head in self.heads], dim=-1)


class TransformerBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.att = MultiHeadAttentionWrapper(
            d_in=cfg["emb_dim"],
            d_out=cfg["emb_dim"] // cfg["n_heads"],
            context_length=cfg["context_length"],
            num_heads=cfg["n_heads"],
            dropout=cfg["drop_rate"],
            qkv_bias=cfg["qkv_bias"],
        )
        self.ff = FeedForward(cfg)
        self.norm1 = LayerNorm(cfg["emb_dim"])
        self.norm2 = LayerNorm(cfg["emb_dim"])
        self.drop_shortcut = nn.Dropout(cfg["drop_rate"])

    def forward(self, x):
        # Shortcut connection for attention block
        shortcut = x
        x = self.norm1(x)
        x = self.att(x)  # Shape [batch_size, num_tokens, emb_size]
        x = self.drop_shortcut(x)
        x = x + shortcut  # Add the original input back

        # Shortcut connection for feed forward block
        shortcut = x
        x = self.norm2(x)
        x = self.ff(x)
        x = self.drop_shortcut(x)
        x = x + shortcut  # Add the original input back

        return x


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "rasbt/LLMs-from-scratch ch03/01_main-chapter-code/ch03.ipynb @ 80c95987c1c16ce9895ce708dc7b9180317e8599 (+ ch04's TransformerBlock)"
REFERENCE = {"n_head": 4, "activation": "gelu_tanh"}
BLOCK = TransformerBlock
ARGS = {"cfg": {"emb_dim": 32, "context_length": 16, "n_heads": 4, "drop_rate": 0.1, "qkv_bias": False}}
TOLERANCE = 1e-6  # the book's GELU constant is a float32 tensor


def weights(b):
    heads, f = b.att.heads, b.ff.layers
    C = b.norm1.scale.shape[0]
    return {
        "ln1": (b.norm1.scale, b.norm1.shift),
        "q": (torch.cat([h.W_query.weight for h in heads]), None),
        "k": (torch.cat([h.W_key.weight for h in heads]), None),
        "v": (torch.cat([h.W_value.weight for h in heads]), None),
        "proj": (torch.eye(C, dtype=b.norm1.scale.dtype), None),  # no output projection: the identity
        "ln2": (b.norm2.scale, b.norm2.shift),
        "fc1": (f[0].weight, f[0].bias),
        "fc2": (f[2].weight, f[2].bias),
    }


SOFTMAX = "attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)"
ATT = "x = self.att(x)  # Shape [batch_size, num_tokens, emb_size]\n        x = self.drop_shortcut(x)\n        x = x + shortcut  # Add the original input back"
FF = "x = self.ff(x)\n        x = self.drop_shortcut(x)\n        x = x + shortcut  # Add the original input back"
MISTAKES = {
    "no_scaling": [(SOFTMAX, "attn_weights = torch.softmax(attn_scores, dim=-1)")],
    "wrong_scale": [(SOFTMAX, "attn_weights = torch.softmax(attn_scores / d_in**0.5, dim=-1)")],
    "wrong_scale:1/hs": [(SOFTMAX, "attn_weights = torch.softmax(attn_scores / keys.shape[-1], dim=-1)")],
    "future_leak": [
        (
            "self.mask.bool()[:num_tokens, :num_tokens], -torch.inf",
            "self.mask.bool()[:num_tokens, :num_tokens] & False, -torch.inf",
        )
    ],
    "mask_zero": [
        ("self.mask.bool()[:num_tokens, :num_tokens], -torch.inf", "self.mask.bool()[:num_tokens, :num_tokens], 0.0")
    ],
    "mask_reversed": [
        (
            "self.mask.bool()[:num_tokens, :num_tokens], -torch.inf",
            "~self.mask.bool()[:num_tokens, :num_tokens], -torch.inf",
        )
    ],
    "softmax_dim": [(SOFTMAX, SOFTMAX.replace("dim=-1", "dim=1"))],
    "no_residual:attn": [(ATT, ATT.replace("x = x + shortcut", "x = x"))],
    "no_residual:mlp": [(FF, FF.replace("x = x + shortcut", "x = x"))],
    "shared_norm": [("x = self.norm2(x)", "x = self.norm1(x)")],
    "post_norm": [
        ("        x = self.norm1(x)\n", ""),
        (ATT, ATT.replace("x = x + shortcut", "x = self.norm1(x + shortcut)")),
        ("        x = self.norm2(x)\n", ""),
        (FF, FF.replace("x = x + shortcut", "x = self.norm2(x + shortcut)")),
    ],
}
PAIRS = [("wrong_scale", "post_norm"), ("mask_reversed", "no_residual:attn")]
