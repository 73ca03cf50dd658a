"""The eight code shapes issue 18 reports the checker misread, each correct and with mistakes.

Written from real codebases' ways of holding weights: ``nn.Conv1d(kernel_size=1)`` layers with
channels first inside; heads as ``nn.ParameterList``s of raw (C, hs) matrices used as ``x @ W``;
one qkv projection packed per head (``[q_h k_h v_h]`` for each head: BLOOM, GPT-NeoX, Megatron);
TransformerLens's 3-D ``W_Q`` (nh, C, hs) and ``W_O`` (nh, hs, C) with einsum; picoGPT's plain
functions over an ``nn.ParameterDict`` stored (in, out); a hand-written LayerNorm class ``LN``
with ``g`` / ``b``; a class that needs more constructor arguments; and a ``Block(config)``.
``tests/test_check_reported.py`` checks that each correct one equals gptblock's lesson block with
the same weights.
"""

from dataclasses import dataclass

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

MERGE_BUGS = ("heads_mixed:merge", "heads_mixed:order")


def _attend(q, k, v, bugs, C):
    """(B, nh, T, hs) q, k, v -> (B, nh, T, hs), the lesson's masked softmax attention."""
    T, hs = q.shape[-2], q.shape[-1]
    att = (q @ k.transpose(-2, -1)) * scale(bugs, hs**-0.5, hs, C)
    allowed = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    return softmax_masked(att, allowed, bugs) @ v


class ConvBlock(nn.Module):
    """Every layer an nn.Conv1d(kernel_size=1): the block works channels-first, (B, C, T)."""

    def __init__(self, n_embd, n_head, bugs=frozenset()):
        super().__init__()
        C = n_embd
        self.n_head, self.bugs = n_head, bugs
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv = nn.Conv1d(C, 3 * C, kernel_size=1)
        self.proj = nn.Conv1d(C, C, kernel_size=1)
        self.fc1, self.fc2 = nn.Conv1d(C, 4 * C, 1), nn.Conv1d(4 * C, C, 1)

    def attn(self, x):
        B, T, C = x.shape
        qkv = self.qkv(x.transpose(1, 2)).transpose(1, 2)  # (B, 3C, T) -> (B, T, 3C)
        q, k, v = (split_heads(t, self.n_head, self.bugs) for t in qkv.split(C, dim=-1))
        y = merge_heads(_attend(q, k, v, self.bugs, C), self.bugs)  # (B, T, C)
        return self.proj(y.transpose(1, 2)).transpose(1, 2)

    def mlp(self, x):
        return self.fc2(F.gelu(self.fc1(x.transpose(1, 2)))).transpose(1, 2)

    def forward(self, x):
        return finish(residual(x, self.attn, self.mlp, self.ln1, self.ln2, self.bugs), self.bugs)


class ParamListHeads(nn.Module):
    """Heads as nn.ParameterLists of raw (C, hs) matrices, each used as x @ W."""

    def __init__(self, n_embd, n_head, bugs=frozenset()):
        super().__init__()
        C, hs = n_embd, n_embd // n_head
        self.bugs = bugs
        make = lambda: nn.ParameterList(  # noqa: E731
            nn.Parameter(torch.randn(C, hs) * C**-0.5) for _ in range(n_head)
        )
        self.wq, self.wk, self.wv = make(), make(), make()
        self.proj = nn.Linear(C, C)
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.mlp = nn.Sequential(nn.Linear(C, 4 * C), nn.ReLU(), nn.Linear(4 * C, C))

    def attn(self, x):
        heads = [
            _attend((x @ wq)[:, None], (x @ wk)[:, None], (x @ wv)[:, None], self.bugs, x.shape[-1])
            for wq, wk, wv in zip(self.wq, self.wk, self.wv, strict=True)
        ]  # nh x (B, 1, T, hs)
        return self.proj(merge_heads(torch.cat(heads, dim=1), self.bugs))

    def forward(self, x):
        return finish(residual(x, self.attn, self.mlp, self.ln1, self.ln2, self.bugs), self.bugs)


class PerHeadPacked(nn.Module):
    """One qkv Linear packed per head, [q_h k_h v_h] for each head (BLOOM / GPT-NeoX)."""

    def __init__(self, hidden_size, num_attention_heads, bugs=frozenset()):
        super().__init__()
        C = hidden_size
        self.nh, self.bugs = num_attention_heads, bugs
        self.input_layernorm = nn.LayerNorm(C)
        self.query_key_value = nn.Linear(C, 3 * C)
        self.dense = nn.Linear(C, C)
        self.post_attention_layernorm = nn.LayerNorm(C)
        self.dense_h_to_4h, self.dense_4h_to_h = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def attn(self, x):
        B, T, C = x.shape
        qkv = self.query_key_value(x).view(B, T, self.nh, 3 * (C // self.nh))
        q, k, v = (t.transpose(1, 2) for t in qkv.chunk(3, dim=-1))  # (B, nh, T, hs)
        return self.dense(merge_heads(_attend(q, k, v, self.bugs, C), self.bugs))

    def mlp(self, x):
        return self.dense_4h_to_h(F.gelu(self.dense_h_to_4h(x), approximate="tanh"))

    def forward(self, x):
        ln1, ln2 = self.input_layernorm, self.post_attention_layernorm
        return finish(residual(x, self.attn, self.mlp, ln1, ln2, self.bugs), self.bugs)


class LayerNormTL(nn.Module):
    """TransformerLens's LayerNorm: parameters w and b, the normalisation written out."""

    def __init__(self, d_model, eps=1e-5):
        super().__init__()
        self.w, self.b, self.eps = nn.Parameter(torch.ones(d_model)), nn.Parameter(torch.zeros(d_model)), eps  # fmt: skip

    def forward(self, x):
        x = x - x.mean(-1, keepdim=True)
        return x / (x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt() * self.w + self.b


class TransformerLensBlock(nn.Module):
    """TransformerLens's attention: W_Q/W_K/W_V (nh, C, hs), W_O (nh, hs, C), einsum."""

    def __init__(self, d_model, n_heads, bugs=frozenset()):
        super().__init__()
        C, hs = d_model, d_model // n_heads
        self.bugs = bugs
        self.attn = nn.Module()
        for name in ("W_Q", "W_K", "W_V"):
            setattr(self.attn, name, nn.Parameter(torch.randn(n_heads, C, hs) * C**-0.5))
            setattr(self.attn, "b_" + name[-1], nn.Parameter(torch.zeros(n_heads, hs)))
        self.attn.W_O = nn.Parameter(torch.randn(n_heads, hs, C) * C**-0.5)
        self.attn.b_O = nn.Parameter(torch.zeros(C))
        self.ln1, self.ln2 = LayerNormTL(C), LayerNormTL(C)
        self.W_in, self.b_in = nn.Parameter(torch.randn(C, 4 * C) * C**-0.5), nn.Parameter(torch.zeros(4 * C))  # fmt: skip
        self.W_out, self.b_out = nn.Parameter(torch.randn(4 * C, C) * C**-0.5), nn.Parameter(torch.zeros(C))  # fmt: skip

    def attention(self, x):
        a, C = self.attn, x.shape[-1]
        q, k, v = (
            torch.einsum("btc,hcd->bhtd", x, W) + bias[None, :, None]
            for W, bias in ((a.W_Q, a.b_Q), (a.W_K, a.b_K), (a.W_V, a.b_V))
        )  # (B, nh, T, hs)
        z = _attend(q, k, v, self.bugs, C)  # (B, nh, T, hs)
        if self.bugs & set(MERGE_BUGS):
            B, nh, T, hs = z.shape
            return merge_heads(z, self.bugs) @ a.W_O.reshape(nh * hs, C) + a.b_O
        return torch.einsum("bhtd,hdc->btc", z, a.W_O) + a.b_O

    def mlp(self, x):
        return (
            F.gelu(torch.einsum("btc,ch->bth", x, self.W_in) + self.b_in) @ self.W_out + self.b_out
        )

    def forward(self, x):
        return finish(
            residual(x, self.attention, self.mlp, self.ln1, self.ln2, self.bugs), self.bugs
        )


# ----- picoGPT: plain functions, weights in a ParameterDict stored (in, out) ----------------------


def _layer_norm(x, g, b, eps=1e-5):
    mean = x.mean(-1, keepdim=True)
    variance = x.var(-1, keepdim=True, unbiased=False)
    return g * (x - mean) / torch.sqrt(variance + eps) + b


def _linear(x, w, b):  # [*, in] @ [in, out] + [out]
    return x @ w + b


def _mha(x, p, n_head, bugs):
    C = x.shape[-1]
    qkv = _linear(x, p["c_attn_w"], p["c_attn_b"]).split(C, dim=-1)
    heads = [list(t.split(C // n_head, dim=-1)) for t in qkv]  # 3 x nh x (B, T, hs)
    outs = [
        _attend(q[:, None], k[:, None], v[:, None], bugs, C) for q, k, v in zip(*heads, strict=True)
    ]
    return _linear(merge_heads(torch.cat(outs, dim=1), bugs), p["c_proj_w"], p["c_proj_b"])


class PicoGPT(nn.Module):
    """picoGPT's transformer_block: functions over an nn.ParameterDict of (in, out) weights."""

    def __init__(self, n_embd, n_head, bugs=frozenset()):
        super().__init__()
        C = n_embd
        self.n_head, self.bugs = n_head, bugs
        w = lambda *s: nn.Parameter(torch.randn(*s) * s[0] ** -0.5)  # noqa: E731
        z = lambda n: nn.Parameter(torch.zeros(n))  # noqa: E731
        o = lambda n: nn.Parameter(torch.ones(n))  # noqa: E731
        self.p = nn.ParameterDict({
            "ln_1_g": o(C), "ln_1_b": z(C), "ln_2_g": o(C), "ln_2_b": z(C),
            "c_attn_w": w(C, 3 * C), "c_attn_b": z(3 * C), "c_proj_w": w(C, C), "c_proj_b": z(C),
            "c_fc_w": w(C, 4 * C), "c_fc_b": z(4 * C), "mlp_proj_w": w(4 * C, C), "mlp_proj_b": z(C),
        })  # fmt: skip

    def forward(self, x):
        p, bugs = self.p, self.bugs
        ln1 = lambda h: _layer_norm(h, p["ln_1_g"], p["ln_1_b"])  # noqa: E731
        ln2 = lambda h: _layer_norm(h, p["ln_2_g"], p["ln_2_b"])  # noqa: E731
        attn = lambda h: _mha(h, p, self.n_head, bugs)  # noqa: E731
        mlp = lambda h: _linear(F.gelu(_linear(h, p["c_fc_w"], p["c_fc_b"])), p["mlp_proj_w"], p["mlp_proj_b"])  # noqa: E731  # fmt: skip
        return finish(residual(x, attn, mlp, ln1, ln2, bugs), bugs)


# ----- a hand-written LN class, more constructor arguments, a config ---------------------------


class LN(nn.Module):
    """A LayerNorm nobody calls a norm: g and b, the unbiased=False variance, eps inside."""

    def __init__(self, n, eps=1e-5):
        super().__init__()
        self.g, self.b, self.eps = nn.Parameter(torch.ones(n)), nn.Parameter(torch.zeros(n)), eps

    def forward(self, x):
        mu = x.mean(-1, keepdim=True)
        return (
            self.g * (x - mu) * torch.rsqrt(((x - mu) ** 2).mean(-1, keepdim=True) + self.eps)
            + self.b
        )


class CustomLN(nn.Module):
    """A plain Linear block whose norms are the LN class above."""

    def __init__(self, n_embd, n_head, bugs=frozenset()):
        super().__init__()
        C = n_embd
        self.n_head, self.bugs = n_head, bugs
        self.a, self.b = LN(C), LN(C)
        self.wqkv, self.wo = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.up, self.down = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def attn(self, x):
        C = x.shape[-1]
        q, k, v = (split_heads(t, self.n_head, self.bugs) for t in self.wqkv(x).chunk(3, dim=-1))
        return self.wo(merge_heads(_attend(q, k, v, self.bugs, C), self.bugs))

    def forward(self, x):
        mlp = lambda h: self.down(F.gelu(self.up(h)))  # noqa: E731
        return finish(residual(x, self.attn, mlp, self.a, self.b, self.bugs), self.bugs)


class ExtraArgs(CustomLN):
    """A block built with arguments the checker has no default for (a layer index, a count)."""

    def __init__(self, n_embd, n_head, layer_idx, n_layer, bugs=frozenset()):
        super().__init__(n_embd, n_head, bugs)
        self.layer_idx, self.n_layer = layer_idx, n_layer


@dataclass
class BlockConfig:
    n_embd: int = 32
    n_head: int = 4
    dropout: float = 0.0


class ConfigOnly(ConvBlock):
    """Block(config): every size read from one config object."""

    def __init__(self, config, bugs=frozenset()):
        super().__init__(config.n_embd, config.n_head, bugs)
        self.drop = nn.Dropout(config.dropout)


ALL = (*MANUAL_BUGS, *WIRING_BUGS)
WRITTEN_LN = tuple(b for b in ALL if b != "inplace")  # a written-out norm saves no input
STYLES = [
    Style("conv1d", "nn.Conv1d(kernel_size=1) layers, channels first inside", ConvBlock,
          {"n_embd": 32, "n_head": 4}, (*ALL, *HEAD_BUGS), (("no_scaling", "post_norm"),)),
    Style("paramlist-heads", "heads as nn.ParameterList of raw (C, hs) matrices used as x @ W",
          ParamListHeads, {"n_embd": 32, "n_head": 4}, (*ALL, *MERGE_BUGS),
          (("wrong_scale", "shared_norm"),)),
    Style("per-head-packed", "qkv packed per head [q_h k_h v_h] (BLOOM / GPT-NeoX / Megatron)",
          PerHeadPacked, {"hidden_size": 32, "num_attention_heads": 4}, (*ALL, *MERGE_BUGS),
          (("mask_after_softmax", "no_residual:mlp"),)),
    Style("transformerlens", "TransformerLens-style 3-D W_Q (nh, C, hs) / W_O (nh, hs, C), einsum",
          TransformerLensBlock, {"d_model": 32, "n_heads": 4}, (*WRITTEN_LN, *MERGE_BUGS),
          (("no_scaling", "heads_mixed:order"),)),
    Style("picogpt", "picoGPT-style functions over an nn.ParameterDict stored (in, out)", PicoGPT,
          {"n_embd": 32, "n_head": 4}, (*WRITTEN_LN, *MERGE_BUGS), (("softmax_dim", "post_norm"),)),
    Style("custom-ln", "a hand-written LayerNorm class LN with g / b", CustomLN,
          {"n_embd": 32, "n_head": 4}, (*WRITTEN_LN, *HEAD_BUGS), (("wrong_scale", "no_residual:attn"),)),
    Style("extra-args", "a class taking more constructor arguments (layer_idx, n_layer)",
          ExtraArgs, {"n_embd": 32, "n_head": 4, "layer_idx": 0, "n_layer": 2}, WRITTEN_LN),
    Style("config-only", "a Block(config) class", ConfigOnly, {"config": BlockConfig()}, ALL),
]  # fmt: skip
