"""Einsum-based attention, raw weight matrices, and packed q/k/v projections.

Raw ``nn.Parameter`` matrices carry no orientation in their names: ``x @ W`` stores them (in, out),
``F.linear(x, W)`` (out, in); the checker has to work out which.
"""

import math

import torch
import torch.nn as nn
from torch.nn import functional as F

from .common import (
    HEAD_BUGS,
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


def _param(*shape):
    return nn.Parameter(torch.randn(*shape) / math.sqrt(shape[0]))


class EinsumParams(nn.Module):
    """Raw (in, out) matrices W_q, W_k, W_v, W_o and an MLP W1/W2, all with biases, via einsum."""

    def __init__(self, d_model, n_heads, bugs=frozenset()):
        super().__init__()
        C = d_model
        self.n_heads = n_heads
        self.W_q, self.W_k, self.W_v, self.W_o = (
            _param(C, C),
            _param(C, C),
            _param(C, C),
            _param(C, C),
        )
        self.b_q, self.b_k, self.b_v = (
            nn.Parameter(torch.zeros(C)),
            nn.Parameter(torch.zeros(C)),
            nn.Parameter(torch.zeros(C)),
        )
        self.b_o = nn.Parameter(torch.zeros(C))
        self.W1, self.b1 = _param(C, 4 * C), nn.Parameter(torch.zeros(4 * C))
        self.W2, self.b2 = _param(4 * C, C), nn.Parameter(torch.zeros(C))
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.bugs = bugs

    def attention(self, x):
        B, T, C = x.shape
        q = torch.einsum("btc,cd->btd", x, self.W_q) + self.b_q
        k = torch.einsum("btc,cd->btd", x, self.W_k) + self.b_k
        v = torch.einsum("btc,cd->btd", x, self.W_v) + self.b_v
        q, k, v = (split_heads(t, self.n_heads, self.bugs) for t in (q, k, v))  # (B, nh, T, hs)
        hs = C // self.n_heads
        scores = torch.einsum("bhqd,bhkd->bhqk", q, k) * scale(self.bugs, 1 / math.sqrt(hs), hs, C)
        allowed = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        out = torch.einsum("bhqk,bhkd->bhqd", softmax_masked(scores, allowed, self.bugs), v)
        return torch.einsum("btd,dc->btc", merge_heads(out, self.bugs), self.W_o) + self.b_o

    def mlp(self, x):
        return F.gelu(x @ self.W1 + self.b1) @ self.W2 + self.b2

    def forward(self, x):
        return finish(
            residual(x, self.attention, self.mlp, self.ln1, self.ln2, self.bugs), self.bugs
        )


class LinearParams(nn.Module):
    """Raw (out, in) matrices used through F.linear: wq, wk, wv, wo (no biases), w_fc, w_out."""

    def __init__(self, n_embd, n_head, bugs=frozenset()):
        super().__init__()
        C = n_embd
        self.n_head = n_head
        self.wq, self.wk, self.wv, self.wo = _param(C, C), _param(C, C), _param(C, C), _param(C, C)
        self.w_fc = nn.Parameter(torch.randn(4 * C, C) / math.sqrt(C))
        self.w_out = nn.Parameter(torch.randn(C, 4 * C) / math.sqrt(4 * C))
        self.norm1, self.norm2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.bugs = bugs

    def attn(self, x):
        B, T, C = x.shape
        q, k, v = (
            split_heads(F.linear(x, w), self.n_head, self.bugs) for w in (self.wq, self.wk, self.wv)
        )
        hs = C // self.n_head
        att = q @ k.transpose(-1, -2) * scale(self.bugs, hs**-0.5, hs, C)
        att = softmax_masked(att, torch.tril(torch.ones(T, T, device=x.device)) > 0, self.bugs)
        return F.linear(merge_heads(att @ v, self.bugs), self.wo)

    def mlp(self, x):
        return F.linear(F.relu(F.linear(x, self.w_fc)), self.w_out)

    def forward(self, x):
        return finish(
            residual(x, self.attn, self.mlp, self.norm1, self.norm2, self.bugs), self.bugs
        )


class EinsumLinear(nn.Module):
    """lucidrains-style: to_q / to_k / to_v / to_out Linears, einsum attention, an `ff` Sequential."""

    def __init__(self, dim, heads, dim_head, bugs=frozenset()):
        super().__init__()
        inner = heads * dim_head
        self.heads, self.scale, self.bugs = heads, dim_head**-0.5, bugs
        self.norm = nn.LayerNorm(dim)
        self.to_q = nn.Linear(dim, inner, bias=False)
        self.to_k = nn.Linear(dim, inner, bias=False)
        self.to_v = nn.Linear(dim, inner, bias=False)
        self.to_out = nn.Sequential(nn.Linear(inner, dim), nn.Dropout(0.0))
        self.ff_norm = nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, dim * 4), nn.GELU(), nn.Linear(dim * 4, dim))

    def attend(self, x):
        b, n, _ = x.shape
        h = self.heads
        q, k, v = (split_heads(f(x), h, self.bugs) for f in (self.to_q, self.to_k, self.to_v))
        dots = torch.einsum("b h i d, b h j d -> b h i j", q, k)
        dots = dots * scale(self.bugs, self.scale, q.shape[-1], x.shape[-1])
        allowed = ~torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1)
        out = torch.einsum(
            "b h i j, b h j d -> b h i d", softmax_masked(dots, allowed, self.bugs), v
        )
        return self.to_out(merge_heads(out, self.bugs))

    def forward(self, x):
        return finish(
            residual(x, self.attend, self.ff, self.norm, self.ff_norm, self.bugs), self.bugs
        )


class PackedChunk(nn.Module):
    """A packed qkv Linear split with chunk(3, dim=-1), an `out` projection, fc1 / fc2."""

    def __init__(self, n_embd, n_head, bugs=frozenset()):
        super().__init__()
        self.n_head, self.bugs = n_head, bugs
        self.ln1 = nn.LayerNorm(n_embd)
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.out = nn.Linear(n_embd, n_embd)
        self.ln2 = nn.LayerNorm(n_embd)
        self.fc1 = nn.Linear(n_embd, 4 * n_embd)
        self.fc2 = nn.Linear(4 * n_embd, n_embd)

    def attention(self, h):
        B, T, C = h.shape
        q, k, v = (split_heads(t, self.n_head, self.bugs) for t in self.qkv(h).chunk(3, dim=-1))
        hs = C // self.n_head
        w = (q @ k.mT) * scale(self.bugs, 1.0 / hs**0.5, hs, C)
        mask = torch.triu(torch.full((T, T), float("-inf"), device=h.device), 1)
        if set(self.bugs) & {
            "future_leak",
            "mask_reversed",
            "mask_zero",
            "mask_after_softmax",
            "softmax_dim",
        }:
            w = softmax_masked(w, mask == 0, self.bugs)
        else:
            w = torch.softmax(w + mask, dim=-1)  # an additive -inf mask
        return self.out(merge_heads(w @ v, self.bugs))

    def forward(self, x):
        mlp = lambda h: self.fc2(F.gelu(self.fc1(h)))  # noqa: E731
        return finish(residual(x, self.attention, mlp, self.ln1, self.ln2, self.bugs), self.bugs)


class TimmStyle(nn.Module):
    """timm's ViT Block with a causal mask: attn.qkv reshaped (B, N, 3, nh, hs), self.scale,
    norm1 / norm2, mlp.fc1 / mlp.act / mlp.fc2."""

    def __init__(self, dim, num_heads, bugs=frozenset()):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = nn.Module()
        self.attn.num_heads = num_heads
        self.attn.scale = (dim // num_heads) ** -0.5
        self.attn.qkv = nn.Linear(dim, dim * 3, bias=True)
        self.attn.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Module()
        self.mlp.fc1, self.mlp.act, self.mlp.fc2 = (
            nn.Linear(dim, 4 * dim),
            nn.GELU(),
            nn.Linear(4 * dim, dim),
        )
        self.bugs = bugs

    def attention(self, x):
        B, N, C = x.shape
        a, bugs = self.attn, self.bugs
        if "heads_mixed:split" in bugs:
            q, k, v = (split_heads(t, a.num_heads, bugs) for t in a.qkv(x).chunk(3, -1))
        else:
            qkv = a.qkv(x).reshape(B, N, 3, a.num_heads, C // a.num_heads).permute(2, 0, 3, 1, 4)
            q, k, v = qkv.unbind(0)  # (B, nh, N, hs)
        q = q * scale(bugs, a.scale, C // a.num_heads, C)
        allowed = torch.ones(N, N, dtype=torch.bool, device=x.device).tril()
        attn = softmax_masked(q @ k.transpose(-2, -1), allowed, bugs)
        return a.proj(merge_heads(attn @ v, bugs))

    def forward(self, x):
        mlp = lambda h: self.mlp.fc2(self.mlp.act(self.mlp.fc1(h)))  # noqa: E731
        return finish(
            residual(x, self.attention, mlp, self.norm1, self.norm2, self.bugs), self.bugs
        )


STYLES = [
    Style(
        "einsum-params",
        "einsum attention over raw (in, out) nn.Parameter matrices with biases",
        EinsumParams,
        {"d_model": 32, "n_heads": 4},
        (*MANUAL_BUGS, *HEAD_BUGS, *WIRING_BUGS),
        (("wrong_scale", "post_norm"), ("heads_mixed:order", "shared_norm")),
    ),
    Style(
        "linear-params",
        "raw (out, in) nn.Parameter matrices used through F.linear, no biases, ReLU",
        LinearParams,
        {"n_embd": 32, "n_head": 8},
        (*MANUAL_BUGS, *HEAD_BUGS, *WIRING_BUGS),
        (("no_scaling", "no_residual:mlp"), ("mask_zero", "heads_mixed:split")),
    ),
    Style(
        "einsum-linear",
        "lucidrains-style to_q / to_k / to_v / to_out with einsum attention",
        EinsumLinear,
        {"dim": 32, "heads": 4, "dim_head": 8},
        (*MANUAL_BUGS, *HEAD_BUGS, *WIRING_BUGS),
        (("wrong_scale:1/hs", "post_norm"), ("future_leak", "no_residual:both")),
    ),
    Style(
        "packed-chunk",
        "one packed qkv Linear, chunk(3, dim=-1), an additive -inf mask",
        PackedChunk,
        {"n_embd": 40, "n_head": 5},
        (*MANUAL_BUGS, *HEAD_BUGS, *WIRING_BUGS, "dtype_device"),
        (("mask_after_softmax", "post_norm"), ("no_scaling", "heads_mixed:merge", "shared_norm")),
    ),
    Style(
        "timm",
        "timm's ViT Block (qkv reshaped to (B, N, 3, nh, hs), q * self.scale), made causal",
        TimmStyle,
        {"dim": 32, "num_heads": 4},
        (*MANUAL_BUGS, *HEAD_BUGS, *WIRING_BUGS),
        (("wrong_scale", "heads_mixed:merge"), ("softmax_dim", "shared_norm")),
    ),
]
