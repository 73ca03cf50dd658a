"""Correct blocks that reuse tensors: they change their input in place or hand back a buffer they
overwrite on the next call. A checker that reused its own inputs or kept references to outputs
would see leaks and batch mixing that are not there (the in-place lesson block was once
diagnosed future_leak, batch_mixing). Also blocks whose head count no attribute names, whose
norms have names that say nothing, and a minGPT-like block that keeps its MLP in a lambda.
"""

import torch
import torch.nn as nn
from torch.nn import functional as F

from .common import (
    MANUAL_BUGS,
    WIRING_BUGS,
    Style,
    finish,
    merge_heads,
    residual,
    scale,
    softmax_masked,
    split_heads,
)


class Core(nn.Module):
    """A packed-qkv attention and an MLP, shared by the blocks below."""

    def __init__(self, C, nh, bugs):
        super().__init__()
        self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.nh, self.bugs = nh, bugs

    def forward(self, h):
        B, T, C = h.shape
        q, k, v = (split_heads(t, self.nh, self.bugs) for t in self.c_attn(h).split(C, dim=-1))
        att = q @ k.transpose(-2, -1) * scale(self.bugs, (C // self.nh) ** -0.5, C // self.nh, C)
        att = softmax_masked(
            att, torch.ones(T, T, dtype=torch.bool, device=h.device).tril(), self.bugs
        )
        return self.c_proj(merge_heads(att @ v, self.bugs))


class InPlaceInference(nn.Module):
    """x += ... under torch.no_grad (to save memory when generating), x = x + ... when training."""

    def __init__(self, n_embd, n_head, bugs=frozenset()):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.attn = Core(n_embd, n_head, bugs)
        self.mlp = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd)
        )
        self.bugs = bugs

    def forward(self, x):
        if torch.is_grad_enabled() or set(self.bugs) & set(WIRING_BUGS):
            return finish(
                residual(x, self.attn, self.mlp, self.ln_1, self.ln_2, self.bugs), self.bugs
            )
        x += self.attn(self.ln_1(x))  # the caller's tensor, changed in place
        x += self.mlp(self.ln_2(x))
        return x


class ReusedOutput(nn.Module):
    """Writes its result into one buffer it keeps, and returns that buffer every call."""

    def __init__(self, n_embd, n_head, bugs=frozenset()):
        super().__init__()
        self.norm_a, self.norm_b = (
            nn.LayerNorm(n_embd),
            nn.LayerNorm(n_embd),
        )  # names that say nothing
        self.attn = Core(n_embd, n_head, bugs)
        self.ff = nn.Sequential(
            nn.Linear(n_embd, 2 * n_embd), nn.ReLU(), nn.Linear(2 * n_embd, n_embd)
        )
        self.out = None
        self.bugs = bugs

    def forward(self, x):
        y = residual(x, self.attn, self.ff, self.norm_a, self.norm_b, self.bugs)
        if torch.is_grad_enabled():
            return finish(y, self.bugs)
        if self.out is None or self.out.shape != y.shape or self.out.dtype != y.dtype:
            self.out = torch.empty_like(y)
        self.out.copy_(y)
        return self.out


class NoHeadAttribute(nn.Module):
    """The head count only in forward's view(B, T, 4, -1): the checker must try them all. Norms
    registered in the opposite order to their use, with names that say nothing."""

    def __init__(self, n_embd, bugs=frozenset()):
        super().__init__()
        self.second, self.first = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.qkv, self.o = nn.Linear(n_embd, 3 * n_embd), nn.Linear(n_embd, n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd)
        )
        self.bugs = bugs

    def attn(self, h):
        B, T, C = h.shape
        q, k, v = (split_heads(t, 4, self.bugs) for t in self.qkv(h).chunk(3, -1))
        att = softmax_masked(
            q @ k.transpose(-2, -1) * scale(self.bugs, (C // 4) ** -0.5, C // 4, C),
            torch.ones(T, T, dtype=torch.bool, device=h.device).tril(),
            self.bugs,
        )
        return self.o(merge_heads(att @ v, self.bugs))

    def forward(self, x):
        return finish(
            residual(x, self.attn, self.mlp, self.first, self.second, self.bugs), self.bugs
        )


class LambdaMLP(nn.Module):
    """The MLP only reachable through a lambda's closure over a local module (minGPT's pattern)."""

    def __init__(self, n_embd, n_head, bugs=frozenset()):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.sa = Core(n_embd, n_head, bugs)
        self.ffwd = nn.ModuleDict(
            {"up": nn.Linear(n_embd, 4 * n_embd), "down": nn.Linear(4 * n_embd, n_embd)}
        )
        f = self.ffwd
        self.mlp = lambda h: f.down(F.gelu(f.up(h)))
        self.bugs = bugs

    def forward(self, x):
        return finish(residual(x, self.sa, self.mlp, self.ln1, self.ln2, self.bugs), self.bugs)


STYLES = [
    Style(
        "inplace-inference",
        "x += ... under torch.no_grad (in-place on the caller's tensor), out of place when training",
        InPlaceInference,
        {"n_embd": 32, "n_head": 4},
        (*MANUAL_BUGS, *WIRING_BUGS),
        (("wrong_scale", "post_norm"),),
    ),
    Style(
        "reused-output",
        "returns one buffer it overwrites on every call; norms called norm_a / norm_b",
        ReusedOutput,
        {"n_embd": 32, "n_head": 2},
        (*MANUAL_BUGS, *WIRING_BUGS),
        (("no_scaling", "shared_norm"),),
    ),
    Style(
        "no-head-attribute",
        "the head count only in forward (view(B, T, 4, -1)); norms registered in reverse order",
        NoHeadAttribute,
        {"n_embd": 32},
        (*MANUAL_BUGS, *WIRING_BUGS),
        (("wrong_scale", "no_residual:mlp"),),
    ),
    Style(
        "lambda-mlp",
        "the MLP called through a lambda over a local module (minGPT's mlpf pattern)",
        LambdaMLP,
        {"n_embd": 32, "n_head": 4},
        (*MANUAL_BUGS, *WIRING_BUGS),
        (("mask_zero", "post_norm"),),
    ),
]
