# Source: karpathy/nanochat, nanochat/gpt.py
#   commit 025c43273999f1efdc2ba96fec5c19b500428e10: norm, CausalSelfAttention, MLP, Block.
# Kept: Block(config, layer_idx), the purely functional norm with no learnable parameters
# (called on x in the block's forward, no norm module anywhere), separate bias-free c_q / c_k /
# c_v / c_proj, view(B, T, n_head, head_dim) then transpose(1, 2), repeat_kv, SDPA with
# is_causal=True, the head merge view(B, T, -1), the MLP c_fc / c_proj.
# Reduced: the norm is F.layer_norm (nanochat's is F.rms_norm: the same call without the mean);
# relu(x).square() made relu(x); no rotary embedding, QK norm or kv cache.
from dataclasses import dataclass

import torch.nn as nn
import torch.nn.functional as F


@dataclass
class GPTConfig:
    sequence_len: int = 1024
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 6  # number of query heads
    n_kv_head: int = 6  # number of key/value heads (MQA)
    n_embd: int = 768


def norm(x):
    # Purely functional norm with no learnable params
    return F.layer_norm(x, (x.size(-1),))


def repeat_kv(x, n_rep):
    """torch.repeat_interleave(x, dim=1, repeats=n_rep)"""
    if n_rep == 1:
        return x
    bs, n_kv_heads, slen, head_dim = x.shape
    return (
        x[:, :, None, :, :]
        .expand(bs, n_kv_heads, n_rep, slen, head_dim)
        .reshape(bs, n_kv_heads * n_rep, slen, head_dim)
    )


class CausalSelfAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_head = config.n_head
        self.n_kv_head = config.n_kv_head
        self.n_embd = config.n_embd
        self.head_dim = self.n_embd // self.n_head
        assert self.n_embd % self.n_head == 0
        assert self.n_kv_head <= self.n_head and self.n_head % self.n_kv_head == 0
        self.c_q = nn.Linear(self.n_embd, self.n_head * self.head_dim, bias=False)
        self.c_k = nn.Linear(self.n_embd, self.n_kv_head * self.head_dim, bias=False)
        self.c_v = nn.Linear(self.n_embd, self.n_kv_head * self.head_dim, bias=False)
        self.c_proj = nn.Linear(self.n_embd, self.n_embd, bias=False)

    def forward(self, x):
        B, T, C = x.size()

        # Project the input to get queries, keys, and values
        q = self.c_q(x).view(B, T, self.n_head, self.head_dim)
        k = self.c_k(x).view(B, T, self.n_kv_head, self.head_dim)
        v = self.c_v(x).view(B, T, self.n_kv_head, self.head_dim)

        # make head be batch dim, i.e. (B, T, H, D) -> (B, H, T, D)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

        # Apply MQA: replicate the key/value heads for each query head
        nrep = self.n_head // self.n_kv_head
        k, v = repeat_kv(k, nrep), repeat_kv(v, nrep)

        # During training (no KV cache), attend as usual with causal attention
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)

        # Re-assemble the heads side by side and project back to residual stream
        y = y.transpose(1, 2).contiguous().view(B, T, -1)
        y = self.c_proj(y)
        return y


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=False)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=False)

    def forward(self, x):
        x = self.c_fc(x)
        x = F.relu(x)
        x = self.c_proj(x)
        return x


class Block(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.attn = CausalSelfAttention(config, layer_idx)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(norm(x))
        x = x + self.mlp(norm(x))
        return x


# ----- the zoo's data (the checker never sees it) -----
from zoo_public.edits import residual  # noqa: E402

SOURCE = "karpathy/nanochat nanochat/gpt.py @ 025c43273999f1efdc2ba96fec5c19b500428e10"
REFERENCE = {"n_head": 4, "activation": "relu"}
BLOCK = Block
ARGS = {"config": GPTConfig(sequence_len=16, n_layer=1, n_head=4, n_kv_head=4, n_embd=32), "layer_idx": 0}


def weights(b):
    a, m = b.attn, b.mlp
    return {
        "ln1": (None, None),  # no learnable parameters
        "q": (a.c_q.weight, None),
        "k": (a.c_k.weight, None),
        "v": (a.c_v.weight, None),
        "proj": (a.c_proj.weight, None),
        "ln2": (None, None),
        "fc1": (m.c_fc.weight, None),
        "fc2": (m.c_proj.weight, None),
    }


SDPA = "y = F.scaled_dot_product_attention(q, k, v, is_causal=True)"
wiring = residual("self.attn", "norm", "self.mlp", "norm")
MISTAKES = {
    "no_scaling": [(SDPA, "y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0)")],
    "wrong_scale": [(SDPA, "y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=C**-0.5)")],
    "wrong_scale:sqrt": [
        (SDPA, "y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.head_dim**0.5)")
    ],
    "future_leak": [(SDPA, "y = F.scaled_dot_product_attention(q, k, v)")],
    "heads_mixed:merge": [("y = y.transpose(1, 2).contiguous().view(B, T, -1)", "y = y.contiguous().view(B, T, -1)")],
    "heads_mixed:order": [
        ("y = y.transpose(1, 2).contiguous().view(B, T, -1)", "y = y.permute(0, 2, 3, 1).contiguous().view(B, T, -1)")
    ],
    **{k: wiring[k] for k in ("post_norm", "no_residual:attn", "no_residual:mlp", "no_residual:both", "inplace")},
    "no_residual:normed": [
        (
            "x = x + self.attn(norm(x))\n        x = x + self.mlp(norm(x))",
            "x = norm(x)\n        x = x + self.attn(x)\n        x = norm(x)\n        x = x + self.mlp(x)",
        )
    ],
}
PAIRS = [("wrong_scale", "post_norm"), ("future_leak", "no_residual:mlp")]
