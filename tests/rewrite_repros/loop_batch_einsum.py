"""A correct TransformerLens-style block (W_Q, W_K, W_V (nh, C, hs), W_O (nh, hs, C), einsum)
whose forward pass runs one sequence at a time and concatenates them (the ``loop_batch``
rewrite of ``tests/rewrites.py``).

``gptblock check tests/rewrite_repros/loop_batch_einsum.py:Block`` gives FAIL ``heads_mixed``;
with ``LOOP = False`` (the whole batch at once) it gives PASS."""

import torch
import torch.nn as nn
from torch.nn import functional as F

LOOP = True


class Block(nn.Module):
    def __init__(self, d_model=32, n_heads=4):
        super().__init__()
        C, hs = d_model, d_model // n_heads
        g = torch.Generator().manual_seed(0)
        self.W_Q, self.W_K, self.W_V = (
            nn.Parameter(torch.randn(n_heads, C, hs, generator=g) * C**-0.5) for _ in range(3)
        )
        self.W_O = nn.Parameter(torch.randn(n_heads, hs, C, generator=g) * C**-0.5)
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.fc1, self.fc2 = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def attention(self, x):
        q, k, v = (torch.einsum("btc,hcd->bhtd", x, W) for W in (self.W_Q, self.W_K, self.W_V))
        T, hs = x.shape[1], q.shape[-1]
        att = torch.einsum("bhqd,bhkd->bhqk", q, k) / hs**0.5
        keep = torch.ones(T, T, dtype=torch.bool).tril()
        z = att.masked_fill(~keep, float("-inf")).softmax(-1) @ v  # (B, nh, T, hs)
        return torch.einsum("bhtd,hdc->btc", z, self.W_O)

    def one(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    def forward(self, x):
        if LOOP:
            return torch.cat([self.one(x[i : i + 1]) for i in range(len(x))])
        return self.one(x)
