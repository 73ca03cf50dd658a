"""The zoo's blocks on PyTorch's modules, nanoGPT / GPT-2 layouts, and names nobody maps.

* ``Mha*`` / ``Wrapped*``: blocks on ``nn.MultiheadAttention`` / ``nn.TransformerEncoderLayer``.
* ``Nano*``: nanoGPT's ``CausalSelfAttention`` / ``MLP`` / ``Block`` (names ``ln_1``,
  ``attn.c_attn``, ``attn.c_proj``, ``ln_2``, ``mlp.c_fc``, ``mlp.c_proj``), and a GPT-2 style
  block with Hugging Face's ``Conv1D`` layout and tanh GELU.
* ``Opaque*``: q, k and v in one 3-D parameter, which no role fits, so the checker has only its
  black-box probes.
"""

import math

import torch
import torch.nn as nn
from torch.nn import functional as F

# ----- nn.MultiheadAttention / nn.TransformerEncoderLayer blocks -------------------------------


class MhaBlock(nn.Module):
    """Correct: the second lesson's block on nn.MultiheadAttention (encoder-layer names)."""

    batch_first = True

    def __init__(self, d_model, n_heads, dropout=0.1):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.self_attn = nn.MultiheadAttention(
            d_model, n_heads, dropout=dropout, batch_first=self.batch_first
        )
        self.norm2 = nn.LayerNorm(d_model)
        self.linear1 = nn.Linear(d_model, 4 * d_model)
        self.linear2 = nn.Linear(4 * d_model, d_model)
        self.p = dropout

    def mask(self, T):
        return torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)

    def mlp(self, h):
        return self.linear2(F.gelu(self.linear1(h)))

    def forward(self, x):
        h = self.norm1(x)
        a, _ = self.self_attn(h, h, h, attn_mask=self.mask(x.shape[1]), need_weights=False)
        x = x + a
        return x + self.mlp(self.norm2(x))


class MhaNotBatchFirst(MhaBlock):
    batch_first = False


class MhaTrilMask(MhaBlock):
    def mask(self, T):
        return torch.tril(torch.ones(T, T, dtype=torch.bool))  # True on the allowed positions


class MhaNoMask(MhaBlock):
    def forward(self, x):
        h = self.norm1(x)
        a, _ = self.self_attn(h, h, h, need_weights=False)
        x = x + a
        return x + self.mlp(self.norm2(x))


class MhaFunctionalDropout(MhaBlock):
    def mlp(self, h):
        return F.dropout(self.linear2(F.gelu(self.linear1(h))), self.p)  # training=True default


class Wrapped(nn.Module):
    """A user module holding an nn.TransformerEncoderLayer (correct with the defaults here)."""

    def __init__(self, d_model, nhead, dropout=0.1, norm_first=True, batch_first=True, causal=True):
        super().__init__()
        self.causal = causal
        self.layer = nn.TransformerEncoderLayer(
            d_model, nhead, 4 * d_model, dropout, activation="gelu",
            batch_first=batch_first, norm_first=norm_first,
        )  # fmt: skip

    def forward(self, x):
        if not self.causal:
            return self.layer(x)
        mask = torch.triu(torch.ones(x.shape[1], x.shape[1], dtype=torch.bool), diagonal=1)
        return self.layer(x, src_mask=mask)


def wrapped_post_norm(d_model, nhead, dropout=0.1):
    return Wrapped(d_model, nhead, dropout, norm_first=False)


def wrapped_seq_first_unmasked(d_model, nhead, dropout=0.1):
    """nn.TransformerEncoderLayer's defaults: batch_first=False, and no mask passed."""
    return Wrapped(d_model, nhead, dropout, batch_first=False, causal=False)


# ----- nanoGPT / GPT-2 ---------------------------------------------------------------------------


class Conv1D(nn.Module):
    """Hugging Face GPT-2's linear layer: weight stored (in, out)."""

    def __init__(self, nf, nx):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.02)
        self.bias = nn.Parameter(torch.randn(nf) * 0.02)

    def forward(self, x):
        return x @ self.weight + self.bias


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, block_size, dropout, linear):
        super().__init__()
        self.c_attn = linear(n_embd, 3 * n_embd)
        self.c_proj = linear(n_embd, n_embd)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)
        self.n_head, self.n_embd, self.dropout = n_head, n_embd, dropout
        self.register_buffer(
            "bias",
            torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size),
        )

    def attend(self, q, k, v, T):
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        return self.attn_dropout(att) @ v

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = self.attend(q, k, v, T).transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class FlashAttention(CausalSelfAttention):
    def attend(self, q, k, v, T):
        p = self.dropout if self.training else 0.0
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)


class FlashAttentionDropoutAlways(CausalSelfAttention):
    def attend(self, q, k, v, T):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout, is_causal=True)


class ScaleByCAttention(CausalSelfAttention):
    def attend(self, q, k, v, T):
        att = (q @ k.transpose(-2, -1)) * self.n_embd**-0.5
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        return self.attn_dropout(F.softmax(att, dim=-1)) @ v


class SdpaReversedMask(CausalSelfAttention):
    def attend(self, q, k, v, T):
        blocked = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=blocked)  # SDPA: True = allowed


class MLP(nn.Module):
    def __init__(self, n_embd, dropout, linear, act):
        super().__init__()
        self.c_fc = linear(n_embd, 4 * n_embd)
        self.act = act
        self.c_proj = linear(4 * n_embd, n_embd)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.act(self.c_fc(x))))


class NanoBlock(nn.Module):
    """Correct: nanoGPT's Block (exact GELU, nn.Linear)."""

    attention = CausalSelfAttention

    def __init__(self, n_embd, n_head, block_size, dropout=0.1):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = self.attention(n_embd, n_head, block_size, dropout, nn.Linear)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd, dropout, nn.Linear, nn.GELU())

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class NanoFlashBlock(NanoBlock):
    attention = FlashAttention


class NanoScaleByC(NanoBlock):
    attention = ScaleByCAttention


class NanoSdpaReversedMask(NanoBlock):
    attention = SdpaReversedMask


class NanoFlashDropoutAlways(NanoBlock):
    attention = FlashAttentionDropoutAlways


class Gpt2Block(nn.Module):
    """Correct: Hugging Face GPT-2's layout (Conv1D weights (in, out)) and tanh GELU."""

    def __init__(self, n_embd, n_head, block_size, dropout=0.1):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, eps=1e-5)
        self.attn = CausalSelfAttention(
            n_embd, n_head, block_size, dropout, lambda i, o: Conv1D(o, i)
        )
        self.ln_2 = nn.LayerNorm(n_embd, eps=1e-5)
        self.mlp = MLP(n_embd, dropout, lambda i, o: Conv1D(o, i), nn.GELU(approximate="tanh"))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


# ----- blocks whose names the checker cannot map: black-box probes only -------------------------


class Opaque(nn.Module):
    """Correct, but q, k and v come from one (3, C, C) parameter, which no role fits."""

    causal = True

    def __init__(self, n_embd, n_head, dropout=0.1):
        super().__init__()
        self.n_head = n_head
        self.norm_a = nn.LayerNorm(n_embd)
        self.w_qkv = nn.Parameter(torch.randn(3, n_embd, n_embd) * n_embd**-0.5)
        self.out = nn.Linear(n_embd, n_embd)
        self.norm_b = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd)
        )

    def attention(self, h):
        B, T, C = h.shape
        qkv = torch.einsum("btc,ncd->nbtd", h, self.w_qkv)  # (3, B, T, C)
        q, k, v = qkv.view(3, B, T, self.n_head, C // self.n_head).transpose(2, 3)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.out(y.transpose(1, 2).reshape(B, T, C))

    def forward(self, x):
        x = x + self.attention(self.norm_a(x))
        return x + self.mlp(self.norm_b(x))


class OpaqueNoMask(Opaque):
    causal = False


class OpaquePostNorm(Opaque):
    def forward(self, x):
        x = self.norm_a(x + self.attention(x))
        return self.norm_b(x + self.mlp(x))
