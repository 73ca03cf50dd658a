# Source: karpathy/minGPT, mingpt/model.py
#   commit bbbdac74fa9b2e55574d70056163ffbae42310c1: NewGELU, CausalSelfAttention, Block.
# Kept: Block(config) with a CfgNode-like config, packed c_attn split in thirds, the (1, 1, T, T)
# `bias` mask buffer, the MLP as an nn.ModuleDict run through the `mlpf` lambda, NewGELU (tanh).
# Reduced: nothing (CfgNode replaced by a SimpleNamespace).
import math
from types import SimpleNamespace

import torch
import torch.nn as nn
from torch.nn import functional as F


class NewGELU(nn.Module):
    """
    Implementation of the GELU activation function currently in Google BERT repo (identical to OpenAI GPT).
    Reference: Gaussian Error Linear Units (GELU) paper: https://arxiv.org/abs/1606.08415
    """

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class CausalSelfAttention(nn.Module):
    """
    A vanilla multi-head masked self-attention layer with a projection at the end.
    It is possible to use torch.nn.MultiheadAttention here but I am including an
    explicit implementation here to show that there is nothing too scary here.
    """

    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        # key, query, value projections for all heads, but in a batch
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        # output projection
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        # regularization
        self.attn_dropout = nn.Dropout(config.attn_pdrop)
        self.resid_dropout = nn.Dropout(config.resid_pdrop)
        # causal mask to ensure that attention is only applied to the left in the input sequence
        self.register_buffer(
            "bias",
            torch.tril(torch.ones(config.block_size, config.block_size)).view(
                1, 1, config.block_size, config.block_size
            ),
        )
        self.n_head = config.n_head
        self.n_embd = config.n_embd

    def forward(self, x):
        B, T, C = x.size()  # batch size, sequence length, embedding dimensionality (n_embd)

        # calculate query, key, values for all heads in batch and move head forward to be the batch dim
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)

        # causal self-attention; Self-attend: (B, nh, T, hs) x (B, nh, hs, T) -> (B, nh, T, T)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v  # (B, nh, T, T) x (B, nh, T, hs) -> (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble all head outputs side by side

        # output projection
        y = self.resid_dropout(self.c_proj(y))
        return y


class Block(nn.Module):
    """an unassuming Transformer block"""

    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = nn.ModuleDict(
            dict(
                c_fc=nn.Linear(config.n_embd, 4 * config.n_embd),
                c_proj=nn.Linear(4 * config.n_embd, config.n_embd),
                act=NewGELU(),
                dropout=nn.Dropout(config.resid_pdrop),
            )
        )
        m = self.mlp
        self.mlpf = lambda x: m.dropout(m.c_proj(m.act(m.c_fc(x))))  # MLP forward

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlpf(self.ln_2(x))
        return x


# ----- the zoo's data (the checker never sees it) -----
from zoo_public.edits import residual  # noqa: E402

SOURCE = "karpathy/minGPT mingpt/model.py @ bbbdac74fa9b2e55574d70056163ffbae42310c1"
REFERENCE = {"n_head": 4, "activation": "gelu_tanh"}


BLOCK = Block
ARGS = {"config": SimpleNamespace(n_embd=32, n_head=4, block_size=16, attn_pdrop=0.1, resid_pdrop=0.1)}


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


SCORES = "att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))"
MASK = 'att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))\n'
SOFTMAX = "att = F.softmax(att, dim=-1)\n"
MERGE = "y = y.transpose(1, 2).contiguous().view(B, T, C)"
MISTAKES = {
    "no_scaling": [(SCORES, "att = q @ k.transpose(-2, -1)")],
    "wrong_scale": [(SCORES, "att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C))")],
    "wrong_scale:1/hs": [(SCORES, "att = (q @ k.transpose(-2, -1)) / k.size(-1)")],
    "future_leak": [(MASK, "# " + MASK)],
    "mask_zero": [(MASK, MASK.replace('float("-inf")', "0.0"))],
    "mask_reversed": [(MASK, MASK.replace("== 0", "== 1"))],
    "mask_after_softmax": [(MASK + "        " + SOFTMAX, SOFTMAX + "        " + MASK.replace('float("-inf")', "0.0"))],
    "softmax_dim": [(SOFTMAX, SOFTMAX.replace("dim=-1", "dim=2"))],
    "heads_mixed:split": [
        (
            f"{t} = {t}.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)",
            f"{t} = {t}.reshape(B, self.n_head, T, C // self.n_head)",
        )
        for t in "qkv"
    ],
    "heads_mixed:merge": [(MERGE, "y = y.reshape(B, T, C)")],
    **residual("self.attn", "self.ln_1", "self.mlpf", "self.ln_2"),
}
PAIRS = [("wrong_scale", "no_residual:attn"), ("mask_reversed", "no_scaling")]
