"""GPT-2 and its descendants: nanoGPT (manual and flash attention), minGPT, Hugging Face GPT-2's
``Conv1D``, a bias-free nanoGPT, a block built from a config, and the GPT-2 names flat on the block.

Packed attention: one ``c_attn`` projection to 3C, split into q, k, v and then into heads.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F

from .common import (
    HEAD_BUGS,
    MANUAL_BUGS,
    WIRING_BUGS,
    Style,
    dropout,
    finish,
    merge_heads,
    residual,
    scale,
    softmax_masked,
    split_heads,
)


class CausalSelfAttention(nn.Module):
    """nanoGPT's attention: c_attn, c_proj, a (1, 1, T, T) `bias` buffer, or flash attention."""

    def __init__(self, n_embd, n_head, block_size, p, bias, flash, bugs):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.attn_dropout = nn.Dropout(p)
        self.resid_dropout = nn.Dropout(p)
        self.n_head, self.n_embd, self.dropout, self.flash, self.bugs = (
            n_head,
            n_embd,
            p,
            flash,
            bugs,
        )
        mask = torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size)
        self.register_buffer("bias", mask)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (split_heads(t, self.n_head, self.bugs) for t in (q, k, v))  # (B, nh, T, hs)
        hs = k.size(-1)
        if self.flash:
            bugs = self.bugs
            p = self.dropout if (self.training or "dropout_in_eval" in bugs) else 0.0
            if "mask_reversed" in bugs:  # the MultiheadAttention convention given to SDPA
                blocked = torch.triu(torch.ones(T, T, dtype=torch.bool, device=x.device), 1)
                y = F.scaled_dot_product_attention(
                    q, k, v, attn_mask=blocked, dropout_p=p, scale=scale(bugs, None, hs, C)
                )
            else:
                y = F.scaled_dot_product_attention(
                    q,
                    k,
                    v,
                    dropout_p=p,
                    is_causal="future_leak" not in bugs,
                    scale=scale(bugs, None, hs, C),
                )
        else:
            att = (q @ k.transpose(-2, -1)) * scale(self.bugs, 1.0 / math.sqrt(hs), hs, C)
            att = softmax_masked(att, self.bias[:, :, :T, :T] == 1, self.bugs)
            y = dropout(att, self.dropout, self.training, self.bugs) @ v  # (B, nh, T, hs)
        return self.resid_dropout(self.c_proj(merge_heads(y, self.bugs)))


class MLP(nn.Module):
    def __init__(self, n_embd, p, bias):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * n_embd, n_embd, bias=bias)
        self.dropout = nn.Dropout(p)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class NanoGPT(nn.Module):
    """nanoGPT's Block."""

    def __init__(
        self, n_embd, n_head, block_size, dropout=0.1, bias=True, flash=False, bugs=frozenset()
    ):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, bias=bias)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size, dropout, bias, flash, bugs)
        self.ln_2 = nn.LayerNorm(n_embd, bias=bias)
        self.mlp = MLP(n_embd, dropout, bias)
        self.bugs = bugs
        if "unused_parameters:layer" in bugs:  # declared for a gated MLP, never called
            self.c_gate = nn.Linear(n_embd, 4 * n_embd, bias=bias)
        if "unused_parameters:frozen" in bugs:  # a fixed output gain, never applied
            self.gain = nn.Parameter(torch.full((n_embd,), 0.5), requires_grad=False)

    def forward(self, x):
        return finish(residual(x, self.attn, self.mlp, self.ln_1, self.ln_2, self.bugs), self.bugs)


def nanogpt_flash(**kw):
    return NanoGPT(flash=True, **kw)


def nanogpt_no_bias(**kw):
    return NanoGPT(bias=False, **kw)


@dataclass
class GPTConfig:
    n_embd: int = 32
    n_head: int = 4
    block_size: int = 16
    dropout: float = 0.1
    bias: bool = True


class ConfigBlock(NanoGPT):
    """nanoGPT's Block(config): every size from the config object."""

    def __init__(self, config, bugs=frozenset()):
        super().__init__(
            config.n_embd, config.n_head, config.block_size, config.dropout, config.bias, bugs=bugs
        )


class NewGELU(nn.Module):
    """minGPT's GELU, the tanh approximation written out."""

    def forward(self, x):
        return (
            0.5
            * x
            * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
        )


class MinGPT(nn.Module):
    """minGPT's Block: attn (c_attn, c_proj), mlp as a ModuleDict and an `mlpf` lambda."""

    def __init__(self, n_embd, n_head, block_size, dropout=0.1, bugs=frozenset()):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size, dropout, True, False, bugs)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.ModuleDict(dict(
            c_fc=nn.Linear(n_embd, 4 * n_embd),
            c_proj=nn.Linear(4 * n_embd, n_embd),
            act=NewGELU(),
            dropout=nn.Dropout(dropout),
        ))  # fmt: skip
        m = self.mlp
        self.mlpf = lambda x: m.dropout(m.c_proj(m.act(m.c_fc(x))))  # MLP forward
        self.bugs = bugs

    def forward(self, x):
        return finish(residual(x, self.attn, self.mlpf, self.ln_1, self.ln_2, self.bugs), self.bugs)


class Conv1D(nn.Module):
    """Hugging Face's Conv1D: a linear layer whose weight is stored (in, out)."""

    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x):
        size_out = (*x.size()[:-1], self.nf)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(size_out)


class GPT2Attention(nn.Module):
    """Hugging Face GPT-2's attention: Conv1D c_attn / c_proj, _split_heads, a finfo.min mask."""

    def __init__(self, n_embd, n_head, block_size, p, bugs):
        super().__init__()
        self.embed_dim, self.num_heads, self.head_dim = n_embd, n_head, n_embd // n_head
        self.c_attn = Conv1D(3 * n_embd, n_embd)
        self.c_proj = Conv1D(n_embd, n_embd)
        self.attn_dropout, self.resid_dropout = nn.Dropout(p), nn.Dropout(p)
        mask = torch.tril(torch.ones((block_size, block_size), dtype=torch.bool))
        self.register_buffer("bias", mask.view(1, 1, block_size, block_size), persistent=False)
        self.bugs = bugs

    def _split_heads(self, tensor):
        if "heads_mixed:split" in self.bugs:
            return split_heads(tensor, self.num_heads, self.bugs)
        new_shape = (*tensor.size()[:-1], self.num_heads, self.head_dim)
        return tensor.view(new_shape).permute(0, 2, 1, 3)  # (B, nh, T, hs)

    def _attn(self, query, key, value):
        T, bugs = query.size(-2), self.bugs
        w = torch.matmul(query, key.transpose(-1, -2))
        w = w * scale(bugs, 1.0 / math.sqrt(value.size(-1)), value.size(-1), self.embed_dim)
        causal = self.bias[:, :, :T, :T]
        if "future_leak" in bugs or "mask_reversed" in bugs or "softmax_dim" in bugs:
            return softmax_masked(w, causal, bugs) @ value
        w = torch.where(causal, w, torch.tensor(torch.finfo(w.dtype).min, dtype=w.dtype))
        return self.attn_dropout(nn.functional.softmax(w, dim=-1)) @ value

    def forward(self, hidden_states):
        query, key, value = self.c_attn(hidden_states).split(self.embed_dim, dim=2)
        query, key, value = (self._split_heads(t) for t in (query, key, value))
        out = merge_heads(self._attn(query, key, value), self.bugs)
        return self.resid_dropout(self.c_proj(out))


class GPT2MLP(nn.Module):
    def __init__(self, n_embd, p):
        super().__init__()
        self.c_fc = Conv1D(4 * n_embd, n_embd)
        self.c_proj = Conv1D(n_embd, 4 * n_embd)
        self.dropout = nn.Dropout(p)

    def forward(self, h):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(h), approximate="tanh")))  # gelu_new


class HFGPT2(nn.Module):
    """Hugging Face's GPT2Block (one layer): ln_1, attn, ln_2, mlp; Conv1D weights (in, out)."""

    def __init__(self, n_embd, n_head, block_size, dropout=0.1, bugs=frozenset()):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, eps=1e-5)
        self.attn = GPT2Attention(n_embd, n_head, block_size, dropout, bugs)
        self.ln_2 = nn.LayerNorm(n_embd, eps=1e-5)
        self.mlp = GPT2MLP(n_embd, dropout)
        self.bugs = bugs

    def forward(self, hidden_states):
        return finish(
            residual(hidden_states, self.attn, self.mlp, self.ln_1, self.ln_2, self.bugs), self.bugs
        )


class FlatGPT2(nn.Module):
    """GPT-2's names with no attn / mlp modules: c_attn, c_proj, c_fc, c_proj2 on the block."""

    def __init__(self, n_embd, n_head, bugs=frozenset()):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(n_embd)
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.c_proj2 = nn.Linear(4 * n_embd, n_embd)
        self.bugs = bugs

    def attn(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).chunk(3, dim=-1)
        q, k, v = (split_heads(t, self.n_head, self.bugs) for t in (q, k, v))
        att = (
            q
            @ k.transpose(-2, -1)
            * scale(self.bugs, (C // self.n_head) ** -0.5, C // self.n_head, C)
        )
        allowed = torch.tril(torch.ones(T, T, device=x.device)).bool()
        return self.c_proj(merge_heads(softmax_masked(att, allowed, self.bugs) @ v, self.bugs))

    def mlp(self, x):
        return self.c_proj2(F.gelu(self.c_fc(x)))

    def forward(self, x):
        return finish(residual(x, self.attn, self.mlp, self.ln_1, self.ln_2, self.bugs), self.bugs)


ARGS = {"n_embd": 32, "n_head": 4, "block_size": 16, "dropout": 0.1}
SDPA_BUGS = (
    "no_scaling",
    "wrong_scale",
    "wrong_scale:1/hs",
    "future_leak",
    "mask_reversed",
    "dropout_in_eval",
)

STYLES = [
    Style(
        "nanogpt",
        "nanoGPT model.py (manual attention)",
        NanoGPT,
        ARGS,
        (
            *MANUAL_BUGS,
            "dropout_in_eval",
            *HEAD_BUGS,
            *WIRING_BUGS,
            "shape",
            "dtype_device",
            "unused_parameters:layer",
            "unused_parameters:frozen",
        ),
        (
            ("wrong_scale", "post_norm"),
            ("heads_mixed:merge", "no_scaling"),
            ("softmax_dim", "no_residual:attn"),
            ("mask_zero", "shared_norm", "wrong_scale"),
            ("post_norm", "nonfinite:softmax"),
        ),
    ),
    Style(
        "nanogpt-flash",
        "nanoGPT model.py (F.scaled_dot_product_attention)",
        nanogpt_flash,
        {"n_embd": 64, "n_head": 8, "block_size": 32, "dropout": 0.1},
        (*SDPA_BUGS, *HEAD_BUGS, *WIRING_BUGS),
        (
            ("wrong_scale", "post_norm"),
            ("future_leak", "heads_mixed:order"),
            ("mask_reversed", "no_residual:mlp"),
        ),
    ),
    Style(
        "nanogpt-no-bias",
        "nanoGPT model.py with bias=False (LayerNorm and Linear)",
        nanogpt_no_bias,
        ARGS,
        (*MANUAL_BUGS, *WIRING_BUGS),
        (("no_scaling", "post_norm"), ("mask_after_softmax", "shared_norm")),
    ),
    Style(
        "nanogpt-config",
        "nanoGPT's Block(config), sizes from a config dataclass",
        ConfigBlock,
        {"config": GPTConfig(n_embd=24, n_head=2, block_size=8)},
        (
            "no_scaling",
            "wrong_scale",
            "future_leak",
            "post_norm",
            "no_residual:attn",
            "shared_norm",
        ),
        (("future_leak", "post_norm"),),
    ),
    Style(
        "mingpt",
        "minGPT model.py (ModuleDict MLP, NewGELU)",
        MinGPT,
        ARGS,
        (*MANUAL_BUGS, *HEAD_BUGS, *WIRING_BUGS),
        (("wrong_scale:sqrt", "post_norm"), ("mask_reversed", "no_scaling")),
    ),
    Style(
        "hf-gpt2",
        "Hugging Face modeling_gpt2.py (Conv1D, gelu_new, finfo.min mask)",
        HFGPT2,
        ARGS,
        (
            "no_scaling",
            "wrong_scale",
            "wrong_scale:1/hs",
            "future_leak",
            "mask_reversed",
            "softmax_dim",
            *HEAD_BUGS,
            *WIRING_BUGS,
            "dtype_device",
        ),
        (("wrong_scale", "no_residual:normed"), ("heads_mixed:split", "post_norm")),
    ),
    Style(
        "gpt2-flat",
        "GPT-2's names flat on the block (c_proj for attention, c_proj2 for the MLP)",
        FlatGPT2,
        {"n_embd": 32, "n_head": 2},
        (*MANUAL_BUGS, *HEAD_BUGS, *WIRING_BUGS),
        (("wrong_scale", "shared_norm"), ("future_leak", "no_residual:both")),
    ),
]
