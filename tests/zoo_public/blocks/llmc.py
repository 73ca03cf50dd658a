# Source: karpathy/llm.c, train_gpt2.py
#   commit 00627070aaf71756ba12acb6d32ae151f25b4a24: NewGELU, CausalSelfAttention, MLP, Block,
#   GPTConfig (the PyTorch reference the C code is checked against).
# Kept: Block(config) with the GPTConfig dataclass, nn.LayerNorm ln_1 / ln_2, c_attn split in
# thirds after `qkv = self.c_attn(x)`, the (1, 1, T, T) `bias` mask buffer ("not really a 'bias',
# more of a mask"), the manual attention (masked_fill with -inf, F.softmax), NewGELU (tanh)
# between c_fc and c_proj, no dropout anywhere. Reduced: nothing.
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F


class NewGELU(nn.Module):
    """Careful there are a few versions of GeLU, this one is the exact one used by OpenAI"""

    def forward(self, input):
        return 0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (input + 0.044715 * torch.pow(input, 3.0))))


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        # key, query, value projections for all heads, but in a batch
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        # output projection
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        # regularization
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        # not really a 'bias', more of a mask, but following the OpenAI/HF naming though
        self.register_buffer(
            "bias",
            torch.tril(torch.ones(config.block_size, config.block_size)).view(
                1, 1, config.block_size, config.block_size
            ),
        )

    def forward(self, x):
        B, T, C = x.size()  # batch size, sequence length, embedding dimensionality (n_embd)
        # calculate query, key, values for all heads in batch and move head forward to be the batch dim
        qkv = self.c_attn(x)
        q, k, v = qkv.split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        # manual implementation of attention
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v  # (B, nh, T, T) x (B, nh, T, hs) -> (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble all head outputs side by side
        # output projection
        y = self.c_proj(y)
        return y


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.gelu = NewGELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x):
        x = self.c_fc(x)
        x = self.gelu(x)
        x = self.c_proj(x)
        return x


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50257
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "karpathy/llm.c train_gpt2.py @ 00627070aaf71756ba12acb6d32ae151f25b4a24"
REFERENCE = {"n_head": 4, "activation": "gelu_tanh"}


BLOCK = Block
ARGS = {"config": GPTConfig(block_size=16, n_layer=1, n_head=4, n_embd=32)}


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
ATTN = "x = x + self.attn(self.ln_1(x))"
MLP_ = "x = x + self.mlp(self.ln_2(x))"
MISTAKES = {
    "no_scaling": [(SCORES, "att = q @ k.transpose(-2, -1)")],
    "wrong_scale": [(SCORES, "att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C))")],
    "wrong_scale:1/hs": [(SCORES, "att = (q @ k.transpose(-2, -1)) * (1.0 / k.size(-1))")],
    "wrong_scale:sqrt": [(SCORES, "att = (q @ k.transpose(-2, -1)) * math.sqrt(k.size(-1))")],
    "future_leak": [(MASK, "# " + MASK)],
    "mask_zero": [(MASK, MASK.replace('float("-inf")', "0"))],
    "mask_reversed": [(MASK, MASK.replace("== 0", "== 1"))],
    "mask_after_softmax": [(MASK + "        " + SOFTMAX, SOFTMAX + "        " + MASK.replace('float("-inf")', "0.0"))],
    "softmax_dim": [(SOFTMAX, SOFTMAX.replace("dim=-1", "dim=-2"))],
    "heads_mixed:merge": [(MERGE, "y = y.contiguous().view(B, T, C)")],
    "heads_mixed:order": [(MERGE, "y = y.permute(0, 2, 3, 1).contiguous().view(B, T, C)")],
    "post_norm": [(ATTN, "x = self.ln_1(x + self.attn(x))"), (MLP_, "x = self.ln_2(x + self.mlp(x))")],
    "no_residual:attn": [(ATTN, "x = self.attn(self.ln_1(x))")],
    "no_residual:both": [(ATTN, "x = self.attn(self.ln_1(x))"), (MLP_, "x = self.mlp(self.ln_2(x))")],
    "shared_norm": [(MLP_, "x = x + self.mlp(self.ln_1(x))")],
    "inplace": [(ATTN, "x += self.attn(self.ln_1(x))"), (MLP_, "x += self.mlp(self.ln_2(x))")],
}
PAIRS = [("wrong_scale", "post_norm"), ("mask_after_softmax", "shared_norm"), ("softmax_dim", "no_residual:attn")]
