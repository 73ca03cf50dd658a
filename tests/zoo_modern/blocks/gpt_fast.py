# Source: pytorch-labs/gpt-fast, model.py (ModelArgs, TransformerBlock, Attention, FeedForward,
#   RMSNorm, precompute_freqs_cis, apply_rotary_emb), written for the zoo in its shape.
# Kept: TransformerBlock(config) with its ModelArgs dataclass, the fused wqkv split
# ([dim, kv_size, kv_size]), rotary on adjacent pairs with a real (T, hs/2, 2) cos/sin cache
# (x.float().reshape(..., -1, 2), stack, flatten(3)), GQA by repeat_interleave, SDPA given a
# bool mask (True = may attend), RMSNorm as x * rsqrt(mean(x * x) + eps), FeedForward w1 w3 w2.
# Kept too: the KVCache (k_cache, v_cache buffers written at input_pos) and forward(x, input_pos)
# reading freqs_cis[input_pos] and causal_mask[None, None, input_pos] over the whole cache.
# Reduced: freqs_cis a buffer sliced in forward and the mask made there; input_pos None (the
# checker calls forward(x)) computes the whole sequence without the cache; the cache made on the
# first cached call (setup_caches' job in gpt-fast); no load_hook.
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch import Tensor
from torch.nn import functional as F


@dataclass
class ModelArgs:
    block_size: int = 2048
    n_head: int = 32
    dim: int = 4096
    intermediate_size: int = None
    n_local_heads: int = -1
    head_dim: int = 64
    rope_base: float = 10000
    norm_eps: float = 1e-5

    def __post_init__(self):
        if self.n_local_heads == -1:
            self.n_local_heads = self.n_head
        if self.intermediate_size is None:
            hidden_dim = 4 * self.dim
            self.intermediate_size = int(2 * hidden_dim / 3)
        self.head_dim = self.dim // self.n_head


def precompute_freqs_cis(seq_len, n_elem, base=10000):
    freqs = 1.0 / (base ** (torch.arange(0, n_elem, 2)[: (n_elem // 2)].float() / n_elem))
    t = torch.arange(seq_len, device=freqs.device)
    freqs = torch.outer(t, freqs)
    freqs_cis = torch.polar(torch.ones_like(freqs), freqs)
    cache = torch.stack([freqs_cis.real, freqs_cis.imag], dim=-1)
    return cache


def apply_rotary_emb(x, freqs_cis):
    xshaped = x.float().reshape(*x.shape[:-1], -1, 2)
    freqs_cis = freqs_cis.view(1, xshaped.size(1), 1, xshaped.size(3), 2)
    x_out2 = torch.stack(
        [
            xshaped[..., 0] * freqs_cis[..., 0] - xshaped[..., 1] * freqs_cis[..., 1],
            xshaped[..., 1] * freqs_cis[..., 0] + xshaped[..., 0] * freqs_cis[..., 1],
        ],
        -1,
    )
    x_out2 = x_out2.flatten(3)
    return x_out2.type_as(x)


class KVCache(nn.Module):
    def __init__(self, max_batch_size, max_seq_length, n_heads, head_dim, dtype=torch.bfloat16):
        super().__init__()
        cache_shape = (max_batch_size, n_heads, max_seq_length, head_dim)
        self.register_buffer("k_cache", torch.zeros(cache_shape, dtype=dtype))
        self.register_buffer("v_cache", torch.zeros(cache_shape, dtype=dtype))

    def update(self, input_pos, k_val, v_val):
        # input_pos: [S], k_val: [B, H, S, D]
        assert input_pos.shape[0] == k_val.shape[2]

        k_out = self.k_cache
        v_out = self.v_cache
        k_out[:, :, input_pos] = k_val
        v_out[:, :, input_pos] = v_val

        return k_out, v_out


class TransformerBlock(nn.Module):
    def __init__(self, config: ModelArgs) -> None:
        super().__init__()
        self.attention = Attention(config)
        self.feed_forward = FeedForward(config)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)
        self.attention_norm = RMSNorm(config.dim, config.norm_eps)
        self.register_buffer(
            "freqs_cis", precompute_freqs_cis(config.block_size, config.head_dim, config.rope_base), persistent=False
        )

    def forward(self, x: Tensor, input_pos: Tensor = None) -> Tensor:
        seqlen = x.shape[1]
        if input_pos is None:
            freqs_cis = self.freqs_cis[:seqlen]
            mask = torch.tril(torch.ones(seqlen, seqlen, dtype=torch.bool, device=x.device))
            h = x + self.attention(self.attention_norm(x), freqs_cis, mask)
        else:
            a, max_seq_length = self.attention, self.freqs_cis.shape[0]
            if a.kv_cache is None or a.kv_cache.k_cache.shape[0] != x.shape[0]:
                a.kv_cache = KVCache(x.shape[0], max_seq_length, a.n_local_heads, a.head_dim, x.dtype)
            causal_mask = torch.tril(torch.ones(max_seq_length, max_seq_length, dtype=torch.bool, device=x.device))
            freqs_cis = self.freqs_cis[input_pos]
            mask = causal_mask[None, None, input_pos]
            h = x + self.attention(self.attention_norm(x), freqs_cis, mask, input_pos)
        out = h + self.feed_forward(self.ffn_norm(h))
        return out


class Attention(nn.Module):
    def __init__(self, config: ModelArgs):
        super().__init__()
        total_head_dim = (config.n_head + 2 * config.n_local_heads) * config.head_dim
        self.wqkv = nn.Linear(config.dim, total_head_dim, bias=False)
        self.wo = nn.Linear(config.dim, config.dim, bias=False)
        self.n_head = config.n_head
        self.head_dim = config.head_dim
        self.n_local_heads = config.n_local_heads
        self.dim = config.dim
        self.kv_cache = None

    def forward(self, x: Tensor, freqs_cis: Tensor, mask: Tensor, input_pos=None) -> Tensor:
        bsz, seqlen, _ = x.shape

        kv_size = self.n_local_heads * self.head_dim
        q, k, v = self.wqkv(x).split([self.dim, kv_size, kv_size], dim=-1)

        q = q.view(bsz, seqlen, self.n_head, self.head_dim)
        k = k.view(bsz, seqlen, self.n_local_heads, self.head_dim)
        v = v.view(bsz, seqlen, self.n_local_heads, self.head_dim)

        q = apply_rotary_emb(q, freqs_cis)
        k = apply_rotary_emb(k, freqs_cis)

        q, k, v = map(lambda x: x.transpose(1, 2), (q, k, v))

        if self.kv_cache is not None and input_pos is not None:
            k, v = self.kv_cache.update(input_pos, k, v)

        k = k.repeat_interleave(self.n_head // self.n_local_heads, dim=1)
        v = v.repeat_interleave(self.n_head // self.n_local_heads, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0)

        y = y.transpose(1, 2).contiguous().view(bsz, seqlen, self.dim)

        y = self.wo(y)
        return y


class FeedForward(nn.Module):
    def __init__(self, config: ModelArgs) -> None:
        super().__init__()
        self.w1 = nn.Linear(config.dim, config.intermediate_size, bias=False)
        self.w3 = nn.Linear(config.dim, config.intermediate_size, bias=False)
        self.w2 = nn.Linear(config.intermediate_size, config.dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def _norm(self, x):
        return x * torch.rsqrt(torch.mean(x * x, dim=-1, keepdim=True) + self.eps)

    def forward(self, x: Tensor) -> Tensor:
        output = self._norm(x.float()).type_as(x)
        return output * self.weight


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "pytorch-labs/gpt-fast model.py"
BLOCK = TransformerBlock
ARGS = {"config": ModelArgs(block_size=16, n_head=4, dim=32, n_local_heads=2)}
REFERENCE = {
    "n_head": 4,
    "n_kv_head": 2,
    "norm": "rmsnorm",
    "mlp": "swiglu",
    "norm_eps": 1e-5,
    "position": "rope",
    "rope_pairing": "adjacent",
}
TOLERANCE = 1e-6  # the norm and the rotation compute in float32, as gpt-fast's do


def weights(b):
    a, f = b.attention, b.feed_forward
    return {
        "norm1.weight": b.attention_norm.weight,
        "self_attn.in_proj_weight": a.wqkv.weight,
        "self_attn.out_proj.weight": a.wo.weight,
        "norm2.weight": b.ffn_norm.weight,
        "linear1.weight": f.w1.weight,
        "linear3.weight": f.w3.weight,
        "linear2.weight": f.w2.weight,
    }


MISTAKES = {
    "rope_cache_offset": [("freqs_cis = self.freqs_cis[input_pos]", "freqs_cis = self.freqs_cis[:seqlen]")],
    "rope_q_only": [("        k = apply_rotary_emb(k, freqs_cis)\n", "")],
    "rope_v": [
        (
            "        k = apply_rotary_emb(k, freqs_cis)\n",
            "        k = apply_rotary_emb(k, freqs_cis)\n        v = apply_rotary_emb(v, freqs_cis)\n",
        )
    ],
    "gqa_order": [
        (
            "k = k.repeat_interleave(self.n_head // self.n_local_heads, dim=1)",
            "k = k.repeat(1, self.n_head // self.n_local_heads, 1, 1)",
        ),
        (
            "v = v.repeat_interleave(self.n_head // self.n_local_heads, dim=1)",
            "v = v.repeat(1, self.n_head // self.n_local_heads, 1, 1)",
        ),
    ],
    "rmsnorm_dim": [("torch.mean(x * x, dim=-1, keepdim=True)", "torch.mean(x * x, dim=1, keepdim=True)")],
    "rmsnorm_eps": [
        (
            "return x * torch.rsqrt(torch.mean(x * x, dim=-1, keepdim=True) + self.eps)",
            "return x / (torch.mean(x * x, dim=-1, keepdim=True).sqrt() + self.eps)",
        )
    ],
    "swiglu_silu:product": [
        ("return self.w2(F.silu(self.w1(x)) * self.w3(x))", "return self.w2(F.silu(self.w1(x) * self.w3(x)))")
    ],
    "mask_reversed": [
        (
            "mask = torch.tril(torch.ones(seqlen, seqlen, dtype=torch.bool, device=x.device))",
            "mask = torch.triu(torch.ones(seqlen, seqlen, dtype=torch.bool, device=x.device), diagonal=1)",
        )
    ],
    "no_scaling": [
        (
            "y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0)",
            "y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, scale=1.0)",
        )
    ],
}
PAIRS = [("gqa_order", "rope_v")]
