"""A correct pre-norm block whose norms have no weights (as ``nn.LayerNorm(C)`` made in forward
does) and are written with ``torch.var_mean`` (the ``var_mean`` rewrite of ``tests/rewrites.py``);
its MLP is two 1x1 ``nn.Conv1d`` (as graykode's), so the module tree cannot stand in.

``gptblock check tests/rewrite_repros/var_mean_norm.py:Block`` gives UNVERIFIED ("no norm in the
forward pass"); with ``VAR_MEAN = False`` (mean, then the mean of squares) it gives PASS."""

import math

import torch
import torch.nn as nn
from torch.nn import functional as F

VAR_MEAN = True


def norm(x, eps=1e-5):
    if VAR_MEAN:
        var, mean = torch.var_mean(x, -1, correction=0, keepdim=True)
    else:
        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) * torch.rsqrt(var + eps)


class Block(nn.Module):
    def __init__(self, n_embd=32, n_head=4):
        super().__init__()
        self.n_head = n_head
        self.c_attn, self.c_proj = nn.Linear(n_embd, 3 * n_embd), nn.Linear(n_embd, n_embd)
        self.c_fc = nn.Conv1d(n_embd, 4 * n_embd, 1)
        self.mlp_proj = nn.Conv1d(4 * n_embd, n_embd, 1)

    def attn(self, x):
        B, T, C = x.shape
        nh, hs = self.n_head, C // self.n_head
        q, k, v = (t.view(B, T, nh, hs).transpose(1, 2) for t in self.c_attn(x).split(C, dim=2))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        keep = torch.ones(T, T, dtype=torch.bool).tril()
        y = att.masked_fill(~keep, float("-inf")).softmax(-1) @ v
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))

    def forward(self, x):
        x = x + self.attn(norm(x))
        h = norm(x).transpose(1, 2)
        return x + self.mlp_proj(F.gelu(self.c_fc(h))).transpose(1, 2)
