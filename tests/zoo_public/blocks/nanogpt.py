# Source: karpathy/nanoGPT, model.py
#   commit 04a1d697ddc57aadb2edbe95816bf86c6b8918b0: LayerNorm, CausalSelfAttention, MLP, Block.
# Kept: Block(config) with the GPTConfig dataclass, the bias-optional LayerNorm class over
# F.layer_norm, packed c_attn split in thirds, flash attention (F.scaled_dot_product_attention)
# where PyTorch has it. Reduced: nothing.
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F


class LayerNorm(nn.Module):
    """LayerNorm but with an optional bias. PyTorch doesn't support simply bias=False"""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, input):
        return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        # key, query, value projections for all heads, but in a batch
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        # output projection
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        # regularization
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout
        # flash attention make GPU go brrrrr but support is only in PyTorch >= 2.0
        self.flash = hasattr(torch.nn.functional, "scaled_dot_product_attention")
        if not self.flash:
            print("WARNING: using slow attention. Flash Attention requires PyTorch >= 2.0")
            # causal mask to ensure that attention is only applied to the left in the input sequence
            self.register_buffer(
                "bias",
                torch.tril(torch.ones(config.block_size, config.block_size)).view(
                    1, 1, config.block_size, config.block_size
                ),
            )

    def forward(self, x):
        B, T, C = x.size()  # batch size, sequence length, embedding dimensionality (n_embd)

        # calculate query, key, values for all heads in batch and move head forward to be the batch dim
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)

        # causal self-attention; Self-attend: (B, nh, T, hs) x (B, nh, hs, T) -> (B, nh, T, T)
        if self.flash:
            # efficient attention using Flash Attention CUDA kernels
            y = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=None, dropout_p=self.dropout if self.training else 0, is_causal=True
            )
        else:
            # manual implementation of attention
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            att = self.attn_dropout(att)
            y = att @ v  # (B, nh, T, T) x (B, nh, T, hs) -> (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble all head outputs side by side

        # output projection
        y = self.resid_dropout(self.c_proj(y))
        return y


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        x = self.c_fc(x)
        x = self.gelu(x)
        x = self.c_proj(x)
        x = self.dropout(x)
        return x


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304  # GPT-2 vocab_size of 50257, padded up to nearest multiple of 64 for efficiency
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True  # True: bias in Linears and LayerNorms, like GPT-2. False: a bit better and faster


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "karpathy/nanoGPT model.py @ 04a1d697ddc57aadb2edbe95816bf86c6b8918b0 (flash path)"
REFERENCE = {"n_head": 4, "activation": "gelu"}


BLOCK = Block
ARGS = {"config": GPTConfig(block_size=16, n_layer=1, n_head=4, n_embd=32, dropout=0.1)}


def weights(b):
    a, m = b.attn, b.mlp
    q, k, v = a.c_attn.weight.chunk(3)
    bq, bk, bv = a.c_attn.bias.chunk(3)
    return {
        "ln1": (b.ln_1.weight, b.ln_1.bias),
        "q": (q, bq),
        "k": (k, bk),
        "v": (v, bv),
        "proj": (a.c_proj.weight, a.c_proj.bias),
        "ln2": (b.ln_2.weight, b.ln_2.bias),
        "fc1": (m.c_fc.weight, m.c_fc.bias),
        "fc2": (m.c_proj.weight, m.c_proj.bias),
    }


SDPA = "q, k, v, attn_mask=None, dropout_p=self.dropout if self.training else 0, is_causal=True"
Q = "q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)"
MERGE = "y = y.transpose(1, 2).contiguous().view(B, T, C)"
ATTN = "x = x + self.attn(self.ln_1(x))"
MLP_ = "x = x + self.mlp(self.ln_2(x))"
MISTAKES = {
    "no_scaling": [(SDPA, SDPA + ", scale=1.0")],
    "wrong_scale": [(SDPA, SDPA + ", scale=1.0 / math.sqrt(C)")],
    "wrong_scale:1/hs": [(SDPA, SDPA + ", scale=1.0 / k.size(-1)")],
    "future_leak": [(SDPA, SDPA.replace("is_causal=True", "is_causal=False"))],
    "mask_reversed": [  # nn.MultiheadAttention's convention (True = blocked) given to SDPA
        (
            SDPA,
            SDPA.replace("attn_mask=None", "attn_mask=torch.ones(T, T, dtype=torch.bool).triu(1)").replace(
                ", is_causal=True", ""
            ),
        )
    ],
    "heads_mixed:split": [
        (Q, "q = q.reshape(B, self.n_head, T, C // self.n_head)"),
        (
            "k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)",
            "k = k.reshape(B, self.n_head, T, C // self.n_head)",
        ),
        (
            "v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)",
            "v = v.reshape(B, self.n_head, T, C // self.n_head)",
        ),
    ],
    "heads_mixed:merge": [(MERGE, "y = y.contiguous().view(B, T, C)")],
    "dropout_in_eval": [(SDPA, SDPA.replace(" if self.training else 0", ""))],
    "post_norm": [(ATTN, "x = self.ln_1(x + self.attn(x))"), (MLP_, "x = self.ln_2(x + self.mlp(x))")],
    "no_residual:attn": [(ATTN, "x = self.attn(self.ln_1(x))")],
    "no_residual:mlp": [(MLP_, "x = self.mlp(self.ln_2(x))")],
    "no_residual:normed": [
        (ATTN, "x = self.ln_1(x)\n        x = x + self.attn(x)"),
        (MLP_, "x = self.ln_2(x)\n        x = x + self.mlp(x)"),
    ],
    "shared_norm": [(MLP_, "x = x + self.mlp(self.ln_1(x))")],
}
PAIRS = [("no_scaling", "post_norm"), ("future_leak", "shared_norm"), ("heads_mixed:merge", "wrong_scale")]
