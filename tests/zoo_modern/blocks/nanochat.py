# Source: karpathy/nanochat, nanochat/gpt.py (norm, apply_rotary_emb, CausalSelfAttention, MLP,
#   Block, GPT._precompute_rotary_embeddings), written for the zoo in its shape.
# Kept: the names (c_q c_k c_v c_proj, c_fc c_proj), a functional RMSNorm without weights
# (F.rms_norm), rotary in halves on the (B, T, H, D) layout with nanochat's own direction
# (y1 = x1 cos + x2 sin, y2 = -x1 sin + x2 cos: a rotation by minus the angle), multi-query /
# grouped heads repeated with repeat_interleave before SDPA (is_causal=True), relu^2 MLP.
# Reduced: no QK norm; cos/sin a buffer sliced in forward (the checker calls forward(x)); no kv
# cache; a plain-argument constructor.
import torch
import torch.nn as nn
import torch.nn.functional as F


def norm(x):
    # Purely functional rmsnorm with no learnable params
    return F.rms_norm(x, (x.size(-1),))


def apply_rotary_emb(x, cos, sin):
    assert x.ndim == 4  # multihead attention
    d = x.shape[3] // 2
    x1, x2 = x[..., :d], x[..., d:]  # split up last dim into two halves
    y1 = x1 * cos + x2 * sin  # rotate pairs of dims
    y2 = x1 * (-sin) + x2 * cos
    out = torch.cat([y1, y2], 3)  # re-assemble
    out = out.to(x.dtype)  # ensure input/output dtypes match
    return out


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, n_kv_head):
        super().__init__()
        self.n_head = n_head
        self.n_kv_head = n_kv_head
        self.n_embd = n_embd
        self.head_dim = self.n_embd // self.n_head
        self.c_q = nn.Linear(self.n_embd, self.n_head * self.head_dim, bias=False)
        self.c_k = nn.Linear(self.n_embd, self.n_kv_head * self.head_dim, bias=False)
        self.c_v = nn.Linear(self.n_embd, self.n_kv_head * self.head_dim, bias=False)
        self.c_proj = nn.Linear(self.n_embd, self.n_embd, bias=False)

    def forward(self, x, cos_sin):
        B, T, C = x.size()
        q = self.c_q(x).view(B, T, self.n_head, self.head_dim)
        k = self.c_k(x).view(B, T, self.n_kv_head, self.head_dim)
        v = self.c_v(x).view(B, T, self.n_kv_head, self.head_dim)
        cos, sin = cos_sin
        q, k = apply_rotary_emb(q, cos, sin), apply_rotary_emb(k, cos, sin)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T, D)
        nrep = self.n_head // self.n_kv_head
        k, v = k.repeat_interleave(nrep, dim=1), v.repeat_interleave(nrep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, -1)
        y = self.c_proj(y)
        return y


class MLP(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=False)
        self.c_proj = nn.Linear(4 * n_embd, n_embd, bias=False)

    def forward(self, x):
        x = self.c_fc(x)
        x = F.relu(x).square()
        x = self.c_proj(x)
        return x


class Block(nn.Module):
    def __init__(self, n_embd=32, n_head=4, n_kv_head=1, sequence_len=16):
        super().__init__()
        self.attn = CausalSelfAttention(n_embd, n_head, n_kv_head)
        self.mlp = MLP(n_embd)
        head_dim = n_embd // n_head
        channel_range = torch.arange(0, head_dim, 2, dtype=torch.float32)
        inv_freq = 1.0 / (10000 ** (channel_range / head_dim))
        t = torch.arange(sequence_len, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)
        cos, sin = freqs.cos(), freqs.sin()
        self.register_buffer("cos", cos[None, :, None, :], persistent=False)  # (1, T, 1, D/2)
        self.register_buffer("sin", sin[None, :, None, :], persistent=False)

    def forward(self, x):
        T = x.size(1)
        cos_sin = self.cos[:, :T], self.sin[:, :T]
        x = x + self.attn(norm(x), cos_sin)
        x = x + self.mlp(norm(x))
        return x


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "karpathy/nanochat nanochat/gpt.py"
BLOCK = Block
ARGS = {"n_embd": 32, "n_head": 4, "n_kv_head": 2, "sequence_len": 16}
REFERENCE = {
    "n_head": 4,
    "n_kv_head": 2,
    "norm": "rmsnorm",
    "mlp": "dense",
    "activation": "relu2",
    "norm_eps": 2.220446049250313e-16,
    "position": "rope",
    "rope_pairing": "halves",
}
TOLERANCE = 1e-6  # the rotary table is float32, as nanochat's is


def _flip(w, heads):
    """nanochat rotates by minus the angle: the oracle's rotation after negating the second half
    of each head's rows of q and k (the scores are unchanged: each pair's sign flips twice)."""
    w = w.detach().clone().reshape(heads, 2, -1, w.shape[-1])  # (nh, 2, hs/2, C)
    w[:, 1] *= -1
    return w.reshape(-1, w.shape[-1])


def weights(b):
    a, m = b.attn, b.mlp
    C = a.n_embd
    return {
        "norm1.weight": torch.ones(C, dtype=torch.float64),
        "self_attn.in_proj_weight": torch.cat(
            [_flip(a.c_q.weight, a.n_head), _flip(a.c_k.weight, a.n_kv_head), a.c_v.weight]
        ),
        "self_attn.out_proj.weight": a.c_proj.weight,
        "norm2.weight": torch.ones(C, dtype=torch.float64),
        "linear1.weight": m.c_fc.weight,
        "linear2.weight": m.c_proj.weight,
    }


ROPE = "q, k = apply_rotary_emb(q, cos, sin), apply_rotary_emb(k, cos, sin)"
MISTAKES = {
    "rope_v": [(ROPE, ROPE + "\n        v = apply_rotary_emb(v, cos, sin)")],
    "rope_q_only": [(ROPE, "q = apply_rotary_emb(q, cos, sin)")],
    "gqa_order": [
        (
            "k, v = k.repeat_interleave(nrep, dim=1), v.repeat_interleave(nrep, dim=1)",
            "k, v = k.repeat(1, nrep, 1, 1), v.repeat(1, nrep, 1, 1)",
        )
    ],
    "rmsnorm_eps": [
        (
            "return F.rms_norm(x, (x.size(-1),))",
            "return x / (x.pow(2).mean(-1, keepdim=True).sqrt() + 1e-5)",
        )
    ],
    "future_leak": [
        ("y = F.scaled_dot_product_attention(q, k, v, is_causal=True)", "y = F.scaled_dot_product_attention(q, k, v)")
    ],
    "no_residual:attn": [("x = x + self.attn(norm(x), cos_sin)", "x = self.attn(norm(x), cos_sin)")],
}
PAIRS = [("rope_q_only", "gqa_order")]
