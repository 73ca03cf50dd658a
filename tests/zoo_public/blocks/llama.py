# Source: meta-llama/llama, llama/model.py
#   commit 8580eb9a896bdb82d376b7040d18a2e7b402b10f: ModelArgs, RMSNorm, Attention, FeedForward,
#   TransformerBlock (and the mask Transformer.forward builds).
# Kept: TransformerBlock(layer_id, args) with a ModelArgs dataclass, wq / wk / wv / wo without
# biases, xq.view(bsz, seqlen, n_local_heads, head_dim) then transpose(1, 2), repeat_kv,
# scores / math.sqrt(head_dim) plus an additive mask triu(full(-inf), diagonal=1), the softmax
# in float32 cast back with type_as, the norm class with a gain `weight` only (computing in
# float32 via x.float()), attention_norm / ffn_norm, h = x + attention(...); out = h + ...
# Reduced: RMSNorm's maths made the lessons' LayerNorm (mean subtracted, no bias); the SwiGLU
# FeedForward (w1, w2, w3) made w2(gelu(w1(x))) of width 4 * dim; no rotary embedding, no kv
# cache, no model parallelism (Column/RowParallelLinear -> nn.Linear).
import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class ModelArgs:
    dim: int = 4096
    n_layers: int = 32
    n_heads: int = 32
    n_kv_heads: Optional[int] = None
    vocab_size: int = -1  # defined later by tokenizer
    multiple_of: int = 256  # make SwiGLU hidden layer size multiple of large power of 2
    ffn_dim_multiplier: Optional[float] = None
    norm_eps: float = 1e-5

    max_batch_size: int = 32
    max_seq_len: int = 2048


class RMSNorm(torch.nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def _norm(self, x):
        x = x - x.mean(-1, keepdim=True)  # the zoo's reduction: LayerNorm's maths
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        output = self._norm(x.float()).type_as(x)
        return output * self.weight


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """torch.repeat_interleave(x, dim=2, repeats=n_rep)"""
    bs, slen, n_kv_heads, head_dim = x.shape
    if n_rep == 1:
        return x
    return (
        x[:, :, :, None, :]
        .expand(bs, slen, n_kv_heads, n_rep, head_dim)
        .reshape(bs, slen, n_kv_heads * n_rep, head_dim)
    )


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_kv_heads = args.n_heads if args.n_kv_heads is None else args.n_kv_heads
        model_parallel_size = 1
        self.n_local_heads = args.n_heads // model_parallel_size
        self.n_local_kv_heads = self.n_kv_heads // model_parallel_size
        self.n_rep = self.n_local_heads // self.n_local_kv_heads
        self.head_dim = args.dim // args.n_heads

        self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)

    def forward(self, x: torch.Tensor, start_pos: int, mask: Optional[torch.Tensor]):
        bsz, seqlen, _ = x.shape
        xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)

        xq = xq.view(bsz, seqlen, self.n_local_heads, self.head_dim)
        xk = xk.view(bsz, seqlen, self.n_local_kv_heads, self.head_dim)
        xv = xv.view(bsz, seqlen, self.n_local_kv_heads, self.head_dim)

        keys = xk
        values = xv

        # repeat k/v heads if n_kv_heads < n_heads
        keys = repeat_kv(keys, self.n_rep)  # (bs, cache_len + seqlen, n_local_heads, head_dim)
        values = repeat_kv(values, self.n_rep)  # (bs, cache_len + seqlen, n_local_heads, head_dim)

        xq = xq.transpose(1, 2)  # (bs, n_local_heads, seqlen, head_dim)
        keys = keys.transpose(1, 2)  # (bs, n_local_heads, cache_len + seqlen, head_dim)
        values = values.transpose(1, 2)  # (bs, n_local_heads, cache_len + seqlen, head_dim)
        scores = torch.matmul(xq, keys.transpose(2, 3)) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores + mask  # (bs, n_local_heads, seqlen, cache_len + seqlen)
        scores = F.softmax(scores.float(), dim=-1).type_as(xq)
        output = torch.matmul(scores, values)  # (bs, n_local_heads, seqlen, head_dim)
        output = output.transpose(1, 2).contiguous().view(bsz, seqlen, -1)
        return self.wo(output)


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)

    def forward(self, x):
        return self.w2(F.gelu(self.w1(x)))


class TransformerBlock(nn.Module):
    def __init__(self, layer_id: int, args: ModelArgs):
        super().__init__()
        self.n_heads = args.n_heads
        self.dim = args.dim
        self.head_dim = args.dim // args.n_heads
        self.attention = Attention(args)
        self.feed_forward = FeedForward(dim=args.dim, hidden_dim=4 * args.dim)
        self.layer_id = layer_id
        self.attention_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.ffn_norm = RMSNorm(args.dim, eps=args.norm_eps)

    def forward(self, x: torch.Tensor, start_pos: int = 0, mask: Optional[torch.Tensor] = None):
        if mask is None:  # as Transformer.forward builds it
            seqlen = x.shape[1]
            mask = torch.full((seqlen, seqlen), float("-inf"), device=x.device)
            mask = torch.triu(mask, diagonal=1)
            mask = torch.hstack([torch.zeros((seqlen, start_pos), device=x.device), mask]).type_as(x)
        h = x + self.attention(self.attention_norm(x), start_pos, mask)
        out = h + self.feed_forward(self.ffn_norm(h))
        return out


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "meta-llama/llama llama/model.py @ 8580eb9a896bdb82d376b7040d18a2e7b402b10f"
REFERENCE = {"n_head": 4, "activation": "gelu"}
BLOCK = TransformerBlock
ARGS = {"layer_id": 0, "args": ModelArgs(dim=32, n_layers=1, n_heads=4, max_seq_len=16)}
TOLERANCE = 1e-6  # the norm and the softmax compute in float32, as Llama's do


def weights(b):
    a, f = b.attention, b.feed_forward
    return {
        "ln1": (b.attention_norm.weight, None),
        "q": (a.wq.weight, None),
        "k": (a.wk.weight, None),
        "v": (a.wv.weight, None),
        "proj": (a.wo.weight, None),
        "ln2": (b.ffn_norm.weight, None),
        "fc1": (f.w1.weight, None),
        "fc2": (f.w2.weight, None),
    }


SCORES = "scores = torch.matmul(xq, keys.transpose(2, 3)) / math.sqrt(self.head_dim)"
MISTAKES = {
    "no_scaling": [(SCORES, "scores = torch.matmul(xq, keys.transpose(2, 3))")],
    "wrong_scale": [
        (SCORES, "scores = torch.matmul(xq, keys.transpose(2, 3)) / math.sqrt(self.head_dim * self.n_local_heads)")
    ],
    "wrong_scale:1/hs": [(SCORES, "scores = torch.matmul(xq, keys.transpose(2, 3)) / self.head_dim")],
    "future_leak": [("mask = torch.triu(mask, diagonal=1)", "mask = torch.zeros_like(mask)")],
    "mask_reversed": [("mask = torch.triu(mask, diagonal=1)", "mask = torch.tril(mask)")],
    "softmax_dim": [
        (
            "scores = F.softmax(scores.float(), dim=-1).type_as(xq)",
            "scores = F.softmax(scores.float(), dim=2).type_as(xq)",
        )
    ],
    "heads_mixed:merge": [
        (
            "output = output.transpose(1, 2).contiguous().view(bsz, seqlen, -1)",
            "output = output.contiguous().view(bsz, seqlen, -1)",
        )
    ],
    "post_norm": [
        (
            "h = x + self.attention(self.attention_norm(x), start_pos, mask)",
            "h = self.attention_norm(x + self.attention(x, start_pos, mask))",
        ),
        ("out = h + self.feed_forward(self.ffn_norm(h))", "out = self.ffn_norm(h + self.feed_forward(h))"),
    ],
    "no_residual:attn": [("h = x + self.attention(", "h = self.attention(")],
    "no_residual:mlp": [
        ("out = h + self.feed_forward(self.ffn_norm(h))", "out = self.feed_forward(self.ffn_norm(h))")
    ],
    "shared_norm": [
        ("out = h + self.feed_forward(self.ffn_norm(h))", "out = h + self.feed_forward(self.attention_norm(h))")
    ],
}
PAIRS = [("no_scaling", "shared_norm"), ("future_leak", "post_norm")]
