"""A correct pre-norm block whose ``att @ v`` is ``torch.baddbmm(zeros, att, v, beta=0)``
(the ``baddbmm`` rewrite of ``tests/rewrites.py``), norms a hand-written LN class.

``gptblock check tests/rewrite_repros/baddbmm_av.py:Block`` gives FAIL with no mistake named;
with ``BADDBMM = False`` (``torch.bmm(att, v)``) it gives PASS."""

import math

import torch
import torch.nn as nn
from torch.nn import functional as F

BADDBMM = True


class LN(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.g, self.b = nn.Parameter(torch.ones(n)), nn.Parameter(torch.zeros(n))

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) ** 2).mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + 1e-5) * self.g + self.b


class Block(nn.Module):
    def __init__(self, n_embd=32, n_head=4):
        super().__init__()
        self.n_head = n_head
        self.ln1, self.ln2 = LN(n_embd), LN(n_embd)
        self.wqkv, self.wo = nn.Linear(n_embd, 3 * n_embd), nn.Linear(n_embd, n_embd)
        self.up, self.down = nn.Linear(n_embd, 4 * n_embd), nn.Linear(4 * n_embd, n_embd)

    def attn(self, x):
        B, T, C = x.shape
        nh, hs = self.n_head, C // self.n_head
        q, k, v = self.wqkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, nh, hs).transpose(1, 2).reshape(B * nh, T, hs) for t in (q, k, v))
        att = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(hs)
        keep = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~keep, float("-inf")).softmax(-1)
        if BADDBMM:
            y = torch.baddbmm(att.new_zeros(B * nh, T, hs), att, v, beta=0.0)
        else:
            y = torch.bmm(att, v)
        return self.wo(y.view(B, nh, T, hs).transpose(1, 2).reshape(B, T, C))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.down(F.gelu(self.up(self.ln2(x))))
