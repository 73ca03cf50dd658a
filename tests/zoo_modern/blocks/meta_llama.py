# Source: meta-llama/llama, llama/model.py (RMSNorm, precompute_freqs_cis,
#   reshape_for_broadcast, apply_rotary_emb, repeat_kv, Attention, FeedForward,
#   TransformerBlock), written for the zoo in its shape.
# Kept: the names (wq wk wv wo, w1 w2 w3, attention_norm ffn_norm), RMSNorm's _norm on
# x.float() then type_as(x), rotary as complex numbers (view_as_complex of adjacent pairs times
# freqs_cis from torch.polar, view_as_real, flatten), repeat_kv on the (bs, slen, n_kv_heads,
# head_dim) layout, the additive -inf mask, softmax in float32, h = x + ...; out = h + ...
# Kept too: the kv cache (cache_k, cache_v, written at start_pos, read up to start_pos + seqlen)
# and forward(x, start_pos)'s offset freqs_cis[start_pos : start_pos + seqlen] and mask.
# Reduced: ModelArgs as plain arguments; freqs_cis a buffer and the mask made in forward; start_pos
# None (the checker calls forward(x)) computes the whole sequence without the cache, as a training
# step does; no model parallel layers; SwiGLU's hidden width given.
import math

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(torch.nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        output = self._norm(x.float()).type_as(x)
        return output * self.weight


def precompute_freqs_cis(dim, end, theta=10000.0):
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device)
    freqs = torch.outer(t, freqs).float()
    freqs_cis = torch.polar(torch.ones_like(freqs), freqs)  # complex64
    return freqs_cis


def reshape_for_broadcast(freqs_cis, x):
    ndim = x.ndim
    assert 0 <= 1 < ndim
    assert freqs_cis.shape == (x.shape[1], x.shape[-1])
    shape = [d if i == 1 or i == ndim - 1 else 1 for i, d in enumerate(x.shape)]
    return freqs_cis.view(*shape)


def apply_rotary_emb(xq, xk, freqs_cis):
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = reshape_for_broadcast(freqs_cis, xq_)
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def repeat_kv(x, n_rep):
    bs, slen, n_kv_heads, head_dim = x.shape
    if n_rep == 1:
        return x
    return (
        x[:, :, :, None, :]
        .expand(bs, slen, n_kv_heads, n_rep, head_dim)
        .reshape(bs, slen, n_kv_heads * n_rep, head_dim)
    )


class Attention(nn.Module):
    def __init__(self, dim, n_heads, n_kv_heads, max_batch_size=16, max_seq_len=32):
        super().__init__()
        self.n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        self.n_local_heads = n_heads
        self.n_local_kv_heads = self.n_kv_heads
        self.n_rep = self.n_local_heads // self.n_local_kv_heads
        self.head_dim = dim // n_heads
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)
        self.cache_k = torch.zeros((max_batch_size, max_seq_len, self.n_local_kv_heads, self.head_dim))
        self.cache_v = torch.zeros((max_batch_size, max_seq_len, self.n_local_kv_heads, self.head_dim))

    def forward(self, x, freqs_cis, mask, start_pos=None):
        bsz, seqlen, _ = x.shape
        xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)

        xq = xq.view(bsz, seqlen, self.n_local_heads, self.head_dim)
        xk = xk.view(bsz, seqlen, self.n_local_kv_heads, self.head_dim)
        xv = xv.view(bsz, seqlen, self.n_local_kv_heads, self.head_dim)

        xq, xk = apply_rotary_emb(xq, xk, freqs_cis=freqs_cis)

        if start_pos is not None:
            self.cache_k = self.cache_k.to(xq)
            self.cache_v = self.cache_v.to(xq)
            self.cache_k[:bsz, start_pos : start_pos + seqlen] = xk
            self.cache_v[:bsz, start_pos : start_pos + seqlen] = xv
            xk = self.cache_k[:bsz, : start_pos + seqlen]
            xv = self.cache_v[:bsz, : start_pos + seqlen]

        keys = repeat_kv(xk, self.n_rep)  # (bs, seqlen, n_local_heads, head_dim)
        values = repeat_kv(xv, self.n_rep)

        xq = xq.transpose(1, 2)  # (bs, n_local_heads, seqlen, head_dim)
        keys = keys.transpose(1, 2)
        values = values.transpose(1, 2)
        scores = torch.matmul(xq, keys.transpose(2, 3)) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores + mask  # (bs, n_local_heads, seqlen, cache_len + seqlen)
        scores = F.softmax(scores.float(), dim=-1).type_as(xq)
        output = torch.matmul(scores, values)  # (bs, n_local_heads, seqlen, head_dim)
        output = output.transpose(1, 2).contiguous().view(bsz, seqlen, -1)
        return self.wo(output)


class FeedForward(nn.Module):
    def __init__(self, dim, hidden_dim):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, dim=32, n_heads=4, n_kv_heads=2, hidden_dim=48, norm_eps=1e-5, max_seq_len=16):
        super().__init__()
        self.attention = Attention(dim, n_heads, n_kv_heads, max_seq_len=max_seq_len * 2)
        self.feed_forward = FeedForward(dim, hidden_dim)
        self.attention_norm = RMSNorm(dim, eps=norm_eps)
        self.ffn_norm = RMSNorm(dim, eps=norm_eps)
        self.register_buffer("freqs_cis", precompute_freqs_cis(dim // n_heads, max_seq_len * 2), persistent=False)

    def forward(self, x, start_pos=None):
        seqlen = x.shape[1]
        if start_pos is None:
            freqs_cis = self.freqs_cis[:seqlen]
            mask = torch.full((seqlen, seqlen), float("-inf"), device=x.device)
            mask = torch.triu(mask, diagonal=1).type_as(x)
            h = x + self.attention(self.attention_norm(x), freqs_cis, mask)
        else:
            freqs_cis = self.freqs_cis[start_pos : start_pos + seqlen]
            mask = None
            if seqlen > 1:
                mask = torch.full((seqlen, seqlen), float("-inf"), device=x.device)
                mask = torch.triu(mask, diagonal=1)
                mask = torch.hstack([torch.zeros((seqlen, start_pos), device=x.device), mask]).type_as(x)
            h = x + self.attention(self.attention_norm(x), freqs_cis, mask, start_pos)
        out = h + self.feed_forward(self.ffn_norm(h))
        return out


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "meta-llama/llama llama/model.py"
BLOCK = TransformerBlock
ARGS = {"dim": 32, "n_heads": 4, "n_kv_heads": 2, "hidden_dim": 48, "max_seq_len": 16}
REFERENCE = {
    "n_head": 4,
    "n_kv_head": 2,
    "norm": "rmsnorm",
    "mlp": "swiglu",
    "norm_eps": 1e-5,
    "position": "rope",
    "rope_pairing": "adjacent",
}
TOLERANCE = 1e-6  # the norm and the rotation compute in float32 (complex64), as Meta's do


def weights(b):
    a, f = b.attention, b.feed_forward
    return {
        "norm1.weight": b.attention_norm.weight,
        "self_attn.in_proj_weight": torch.cat([a.wq.weight, a.wk.weight, a.wv.weight]),
        "self_attn.out_proj.weight": a.wo.weight,
        "norm2.weight": b.ffn_norm.weight,
        "linear1.weight": f.w1.weight,
        "linear3.weight": f.w3.weight,
        "linear2.weight": f.w2.weight,
    }


ROPE = "xq, xk = apply_rotary_emb(xq, xk, freqs_cis=freqs_cis)"
MISTAKES = {
    "rope_cache_offset": [
        ("freqs_cis = self.freqs_cis[start_pos : start_pos + seqlen]", "freqs_cis = self.freqs_cis[:seqlen]")
    ],
    "rmsnorm_eps": [
        (
            "return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)",
            "return x / (x.pow(2).mean(-1, keepdim=True).sqrt() + self.eps)",
        )
    ],
    "rmsnorm_mean": [
        (
            "return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)",
            "return x * torch.rsqrt(x.mean(-1, keepdim=True) + self.eps)",
        )
    ],
    "rope_v": [(ROPE, ROPE + "\n        xv, _ = apply_rotary_emb(xv, xv, freqs_cis=freqs_cis)")],
    "rope_q_only": [(ROPE, "xq, _ = apply_rotary_emb(xq, xk, freqs_cis=freqs_cis)")],
    "gqa_order": [
        (
            "x[:, :, :, None, :]\n        .expand(bs, slen, n_kv_heads, n_rep, head_dim)",
            "x[:, :, None, :, :]\n        .expand(bs, slen, n_rep, n_kv_heads, head_dim)",
        )
    ],
    "swiglu_swapped": [
        ("return self.w2(F.silu(self.w1(x)) * self.w3(x))", "return self.w2(self.w1(x) * F.silu(self.w3(x)))")
    ],
    "swiglu_silu:no_silu": [
        ("return self.w2(F.silu(self.w1(x)) * self.w3(x))", "return self.w2(self.w1(x) * self.w3(x))")
    ],
    "future_leak": [("            scores = scores + mask  #", "            scores = scores  #")],
    "wrong_scale": [
        (
            "scores = torch.matmul(xq, keys.transpose(2, 3)) / math.sqrt(self.head_dim)",
            "scores = torch.matmul(xq, keys.transpose(2, 3)) / math.sqrt(x.shape[-1] * self.n_rep)",
        )
    ],
}
PAIRS = [("rope_v", "swiglu_swapped")]
