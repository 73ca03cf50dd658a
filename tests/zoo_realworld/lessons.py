"""The lessons' family: the lecture video's flat block, the lesson's, and per-head variants.

Per-head attention: one ``Head`` module per head, each with its own query / key / value
``nn.Linear``, concatenated along channels.
"""

import torch
import torch.nn as nn
from torch.nn import functional as F

from .common import (
    MANUAL_BUGS,
    WIRING_BUGS,
    Style,
    dropout,
    finish,
    residual,
    scale,
    softmax_masked,
)


class Head(nn.Module):
    """The lesson's head; the lecture's scales by C (the model width) when asked to."""

    def __init__(self, n_embd, head_size, block_size, p, bugs):
        super().__init__()
        self.key = nn.Linear(n_embd, head_size, bias=False)
        self.query = nn.Linear(n_embd, head_size, bias=False)
        self.value = nn.Linear(n_embd, head_size, bias=False)
        self.register_buffer("tril", torch.tril(torch.ones(block_size, block_size)))
        self.dropout = nn.Dropout(p)
        self.bugs = bugs

    def forward(self, x, key=None):
        B, T, C = x.shape
        k = (key or self.key)(x)  # (B, T, hs)
        q = self.query(x)
        wei = q @ k.transpose(-2, -1) * scale(self.bugs, k.shape[-1] ** -0.5, k.shape[-1], C)
        wei = softmax_masked(wei, self.tril[:T, :T] == 1, self.bugs)
        wei = dropout(wei, self.dropout.p, self.training, self.bugs)
        return wei @ self.value(x)


class Lecture(nn.Module):
    """The lecture video's Block: heads, proj, ffwd, ln1, ln2 directly on the block."""

    def __init__(self, n_embd, n_head, block_size, dropout=0.2, bugs=frozenset()):
        super().__init__()
        head_size = n_embd // n_head
        self.heads = nn.ModuleList(
            [Head(n_embd, head_size, block_size, dropout, bugs) for _ in range(n_head)]
        )
        self.proj = nn.Linear(n_embd, n_embd)
        self.ffwd = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd),
            nn.ReLU(),
            nn.Linear(4 * n_embd, n_embd),
            nn.Dropout(dropout),
        )
        self.ln1 = nn.LayerNorm(n_embd, eps=0.0 if "nonfinite:norm" in bugs else 1e-5)
        self.ln2 = nn.LayerNorm(n_embd, eps=0.0 if "nonfinite:norm" in bugs else 1e-5)
        self.bugs = bugs

    def sa(self, x):
        if "shape" in self.bugs:
            return torch.cat([h(x) for h in self.heads], dim=1)  # along time: (B, nh*T, hs)
        key = shared_key(self.heads, self.bugs)
        return self.proj(torch.cat([h(x, key) for h in self.heads], dim=-1))

    def forward(self, x):
        return finish(residual(x, self.sa, self.ffwd, self.ln1, self.ln2, self.bugs), set())


def shared_key(heads, bugs):
    """Head 0's key projection for every head ("the keys are the same for all heads"), or
    None: each head its own."""
    return heads[0].key if "unused_parameters:shared_key" in bugs else None


class MultiHeadAttention(nn.Module):
    def __init__(self, n_head, n_embd, block_size, p, bugs):
        super().__init__()
        hs = n_embd // n_head
        self.heads = nn.ModuleList([Head(n_embd, hs, block_size, p, bugs) for _ in range(n_head)])
        self.proj = nn.Linear(n_embd, n_embd)
        self.dropout = nn.Dropout(p)
        self.bugs = bugs

    def forward(self, x):
        key = shared_key(self.heads, self.bugs)
        return self.dropout(self.proj(torch.cat([h(x, key) for h in self.heads], dim=-1)))


class FeedForward(nn.Module):
    def __init__(self, n_embd, p):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd), nn.ReLU(), nn.Linear(4 * n_embd, n_embd), nn.Dropout(p)
        )

    def forward(self, x):
        return self.net(x)


class Lesson(nn.Module):
    """The first lesson's Block (sa, ffwd, ln1, ln2), ln2 registered before ln1."""

    def __init__(self, n_embd, n_head, block_size, dropout=0.2, bugs=frozenset()):
        super().__init__()
        self.sa = MultiHeadAttention(n_head, n_embd, block_size, dropout, bugs)
        self.ffwd = FeedForward(n_embd, dropout)
        self.ln2 = nn.LayerNorm(n_embd)
        self.ln1 = nn.LayerNorm(n_embd)
        self.bugs = bugs

    def forward(self, x):
        return finish(residual(x, self.sa, self.ffwd, self.ln1, self.ln2, self.bugs), self.bugs)


class ShortHead(nn.Module):
    """A head with biased q / k / v named q, k, v, the mask made on the fly."""

    def __init__(self, n_embd, hs, bugs):
        super().__init__()
        self.q = nn.Linear(n_embd, hs)
        self.k = nn.Linear(n_embd, hs)
        self.v = nn.Linear(n_embd, hs)
        self.bugs = bugs

    def forward(self, x):
        T = x.shape[1]
        q, k, v = self.q(x), self.k(x), self.v(x)
        hs, C = q.size(-1), x.shape[-1]
        att = torch.matmul(q, k.transpose(1, 2)) * scale(self.bugs, hs**-0.5, hs, C)
        allowed = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        return softmax_masked(att, allowed, self.bugs, fill=-1e9) @ v


class PerHeadNamed(nn.Module):
    """Per-head q/k/v with biases under `mh`, an MLP `mlp.fc1/fc2`, norms norm_attn / norm_mlp."""

    def __init__(self, n_embd, n_head, dropout=0.0, bugs=frozenset()):
        super().__init__()
        self.norm_attn = nn.LayerNorm(n_embd)
        self.mh = nn.ModuleList([ShortHead(n_embd, n_embd // n_head, bugs) for _ in range(n_head)])
        self.out = nn.Linear(n_embd, n_embd)
        self.norm_mlp = nn.LayerNorm(n_embd)
        self.mlp = nn.ModuleDict(
            {"fc1": nn.Linear(n_embd, 4 * n_embd), "fc2": nn.Linear(4 * n_embd, n_embd)}
        )
        self.bugs = bugs

    def attend(self, h):
        return self.out(torch.cat([head(h) for head in self.mh], dim=-1))

    def ff(self, h):
        return self.mlp["fc2"](F.gelu(self.mlp["fc1"](h)))

    def forward(self, x):
        return finish(
            residual(x, self.attend, self.ff, self.norm_attn, self.norm_mlp, self.bugs), self.bugs
        )


LESSON_ARGS = {"n_embd": 32, "n_head": 4, "block_size": 16, "dropout": 0.1}

STYLES = [
    Style(
        "lecture-flat",
        "the lecture video's gpt.py (heads, proj, ffwd, ln1, ln2 on the block)",
        Lecture,
        LESSON_ARGS,
        (
            *MANUAL_BUGS,
            "dropout_in_eval",
            *WIRING_BUGS,
            "nonfinite:norm",
            "shape",
            "unused_parameters:shared_key",
        ),
        (
            ("wrong_scale", "post_norm"),
            ("no_scaling", "shared_norm"),
            ("mask_zero", "no_residual:mlp"),
            ("wrong_scale", "future_leak", "post_norm"),
            ("post_norm", "nonfinite:softmax"),
        ),
    ),
    Style(
        "lesson",
        "lesson 1's Block (sa = MultiHeadAttention, ffwd = FeedForward)",
        Lesson,
        {"n_embd": 48, "n_head": 6, "block_size": 8, "dropout": 0.2},
        (
            *MANUAL_BUGS,
            "dropout_in_eval",
            *WIRING_BUGS,
            "shape",
            "dtype_device",
            "unused_parameters:shared_key",
        ),
        (
            ("softmax_dim", "post_norm"),
            ("mask_after_softmax", "no_scaling"),
            ("mask_reversed", "shared_norm"),
        ),
    ),
    Style(
        "per-head-named",
        "per-head q/k/v with biases, a ModuleDict MLP (a learner's own names)",
        PerHeadNamed,
        {"n_embd": 24, "n_head": 3},
        (*MANUAL_BUGS, *WIRING_BUGS),
        (("wrong_scale:1/hs", "no_residual:attn"), ("future_leak", "shared_norm")),
    ),
]
