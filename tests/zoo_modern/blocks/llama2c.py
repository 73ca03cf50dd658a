# Source: karpathy/llama2.c, model.py at commit c05b45a5917130e090263fc222573d5251cbe0af (ModelArgs,
#   RMSNorm, precompute_freqs_cis, reshape_for_broadcast, apply_rotary_emb, repeat_kv, Attention,
#   FeedForward, TransformerBlock; the rotary buffers of Transformer), written for the zoo.
# Kept: the ModelArgs dataclass and TransformerBlock(layer_id, args); RMSNorm on x.float() cast back with
# type_as; the rotation with real numbers on adjacent pairs (reshape(..., -1, 2).unbind(-1), the cos/sin
# tables (T, hs / 2), the halves stacked back with stack(..., dim=-1).flatten(3)), computed in float();
# repeat_kv on the (bs, seqlen, n_kv_heads, head_dim) layout before the transpose; the flash branch,
# F.scaled_dot_product_attention(..., is_causal=True), taken as on any torch >= 2 (the manual branch kept
# as the source writes it); FeedForward w1 / w2 / w3 with SiLU; dropout 0.
# Reduced: TransformerBlock's args default to a small ModelArgs (so the command line can build it with
# --arg layer_id=0) and its forward(x) slices the freqs_cos / freqs_sin buffers that Transformer
# precomputes and passes (registered on the block here), then runs the source's two lines.
import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class ModelArgs:
    # default hyperparameters for the Llama 7B model
    dim: int = 4096
    n_layers: int = 32
    n_heads: int = 32
    n_kv_heads: Optional[int] = None
    vocab_size: int = 32000
    hidden_dim: Optional[int] = None
    multiple_of: int = 256  # MLP hidden layer size will be multiple of
    norm_eps: float = 1e-5
    max_seq_len: int = 2048
    dropout: float = 0.0


class RMSNorm(torch.nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        output = self._norm(x.float()).type_as(x)
        return output * self.weight


def precompute_freqs_cis(dim: int, end: int, theta: float = 10000.0):
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device)  # type: ignore
    freqs = torch.outer(t, freqs).float()  # type: ignore
    freqs_cos = torch.cos(freqs)  # real part
    freqs_sin = torch.sin(freqs)  # imaginary part
    return freqs_cos, freqs_sin

def reshape_for_broadcast(freqs_cis: torch.Tensor, x: torch.Tensor):
    ndim = x.ndim
    assert 0 <= 1 < ndim
    assert freqs_cis.shape == (x.shape[1], x.shape[-1])
    shape = [d if i == 1 or i == ndim - 1 else 1 for i, d in enumerate(x.shape)]
    return freqs_cis.view(shape)

def apply_rotary_emb(
    xq: torch.Tensor,
    xk: torch.Tensor,
    freqs_cos: torch.Tensor,
    freqs_sin: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor]:

    # reshape xq and xk to match the complex representation
    xq_r, xq_i = xq.float().reshape(xq.shape[:-1] + (-1, 2)).unbind(-1)
    xk_r, xk_i = xk.float().reshape(xk.shape[:-1] + (-1, 2)).unbind(-1)

    # reshape freqs_cos and freqs_sin for broadcasting
    freqs_cos = reshape_for_broadcast(freqs_cos, xq_r)
    freqs_sin = reshape_for_broadcast(freqs_sin, xq_r)

    # apply rotation using real numbers
    xq_out_r = xq_r * freqs_cos - xq_i * freqs_sin
    xq_out_i = xq_r * freqs_sin + xq_i * freqs_cos
    xk_out_r = xk_r * freqs_cos - xk_i * freqs_sin
    xk_out_i = xk_r * freqs_sin + xk_i * freqs_cos

    # flatten last two dimensions
    xq_out = torch.stack([xq_out_r, xq_out_i], dim=-1).flatten(3)
    xk_out = torch.stack([xk_out_r, xk_out_i], dim=-1).flatten(3)

    return xq_out.type_as(xq), xk_out.type_as(xk)

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
        assert args.n_heads % self.n_kv_heads == 0
        model_parallel_size = 1
        self.n_local_heads = args.n_heads // model_parallel_size
        self.n_local_kv_heads = self.n_kv_heads // model_parallel_size
        self.n_rep = self.n_local_heads // self.n_local_kv_heads
        self.head_dim = args.dim // args.n_heads
        self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)
        self.attn_dropout = nn.Dropout(args.dropout)
        self.resid_dropout = nn.Dropout(args.dropout)
        self.dropout = args.dropout

        # use flash attention or a manual implementation?
        self.flash = hasattr(torch.nn.functional, 'scaled_dot_product_attention')
        if not self.flash:
            print("WARNING: using slow attention. Flash Attention requires PyTorch >= 2.0")
            mask = torch.full((1, 1, args.max_seq_len, args.max_seq_len), float("-inf"))
            mask = torch.triu(mask, diagonal=1)
            self.register_buffer("mask", mask)

    def forward(
        self,
        x: torch.Tensor,
        freqs_cos: torch.Tensor,
        freqs_sin: torch.Tensor,
    ):
        bsz, seqlen, _ = x.shape

        # QKV
        xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)
        xq = xq.view(bsz, seqlen, self.n_local_heads, self.head_dim)
        xk = xk.view(bsz, seqlen, self.n_local_kv_heads, self.head_dim)
        xv = xv.view(bsz, seqlen, self.n_local_kv_heads, self.head_dim)

        # RoPE relative positional embeddings
        xq, xk = apply_rotary_emb(xq, xk, freqs_cos, freqs_sin)

        # grouped multiquery attention: expand out keys and values
        xk = repeat_kv(xk, self.n_rep)  # (bs, seqlen, n_local_heads, head_dim)
        xv = repeat_kv(xv, self.n_rep)  # (bs, seqlen, n_local_heads, head_dim)

        # make heads into a batch dimension
        xq = xq.transpose(1, 2)  # (bs, n_local_heads, seqlen, head_dim)
        xk = xk.transpose(1, 2)
        xv = xv.transpose(1, 2)

        # flash implementation
        if self.flash:
            output = torch.nn.functional.scaled_dot_product_attention(xq, xk, xv, attn_mask=None, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        else:
            # manual implementation
            scores = torch.matmul(xq, xk.transpose(2, 3)) / math.sqrt(self.head_dim)
            assert hasattr(self, 'mask')
            scores = scores + self.mask[:, :, :seqlen, :seqlen]   # (bs, n_local_heads, seqlen, cache_len + seqlen)
            scores = F.softmax(scores.float(), dim=-1).type_as(xq)
            scores = self.attn_dropout(scores)
            output = torch.matmul(scores, xv)  # (bs, n_local_heads, seqlen, head_dim)

        # restore time as batch dimension and concat heads
        output = output.transpose(1, 2).contiguous().view(bsz, seqlen, -1)

        # final projection into the residual stream
        output = self.wo(output)
        output = self.resid_dropout(output)
        return output


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden_dim: int, multiple_of: int, dropout: float):
        super().__init__()
        if hidden_dim is None:
            hidden_dim = 4 * dim
            hidden_dim = int(2 * hidden_dim / 3)
            hidden_dim = multiple_of * ((hidden_dim + multiple_of - 1) // multiple_of)
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.w2(F.silu(self.w1(x)) * self.w3(x)))


SMALL = ModelArgs(dim=32, n_layers=1, n_heads=4, n_kv_heads=2, vocab_size=64, multiple_of=16, max_seq_len=256)


class TransformerBlock(nn.Module):
    def __init__(self, layer_id: int = 0, args: ModelArgs = SMALL):
        super().__init__()
        self.n_heads = args.n_heads
        self.dim = args.dim
        self.head_dim = args.dim // args.n_heads
        self.attention = Attention(args)
        self.feed_forward = FeedForward(
            dim=args.dim,
            hidden_dim=args.hidden_dim,
            multiple_of=args.multiple_of,
            dropout=args.dropout,
        )
        self.layer_id = layer_id
        self.attention_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.ffn_norm = RMSNorm(args.dim, eps=args.norm_eps)
        freqs_cos, freqs_sin = precompute_freqs_cis(args.dim // args.n_heads, args.max_seq_len)
        self.register_buffer("freqs_cos", freqs_cos, persistent=False)
        self.register_buffer("freqs_sin", freqs_sin, persistent=False)

    def forward(self, x):
        seqlen = x.shape[1]
        freqs_cos = self.freqs_cos[:seqlen]
        freqs_sin = self.freqs_sin[:seqlen]
        h = x + self.attention.forward(self.attention_norm(x), freqs_cos, freqs_sin)
        out = h + self.feed_forward.forward(self.ffn_norm(h))
        return out


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "karpathy/llama2.c model.py"
BLOCK = TransformerBlock
ARGS = {"layer_id": 0}
REFERENCE = {
    "n_head": 4,
    "n_kv_head": 2,
    "norm": "rmsnorm",
    "mlp": "swiglu",
    "norm_eps": 1e-5,
    "position": "rope",
    "rope_pairing": "adjacent",
}
TOLERANCE = 1e-6  # the norms, the tables and the rotation compute in float32 (x.float()), as the source's do


def weights(b):
    a, m = b.attention, b.feed_forward
    return {
        "norm1.weight": b.attention_norm.weight,
        "self_attn.in_proj_weight": torch.cat([a.wq.weight, a.wk.weight, a.wv.weight]),
        "self_attn.out_proj.weight": a.wo.weight,
        "norm2.weight": b.ffn_norm.weight,
        "linear1.weight": m.w1.weight,
        "linear3.weight": m.w3.weight,
        "linear2.weight": m.w2.weight,
    }


SWIGLU = "return self.dropout(self.w2(F.silu(self.w1(x)) * self.w3(x)))"
MISTAKES = {
    "rope_q_only": [
        (
            "xq, xk = apply_rotary_emb(xq, xk, freqs_cos, freqs_sin)",
            "xq, _ = apply_rotary_emb(xq, xk, freqs_cos, freqs_sin)",
        )
    ],
    "gqa_order": [
        (
            "x[:, :, :, None, :]\n        .expand(bs, slen, n_kv_heads, n_rep, head_dim)",
            "x[:, :, None, :, :]\n        .expand(bs, slen, n_rep, n_kv_heads, head_dim)",
        )
    ],
    "future_leak": [("dropout_p=self.dropout if self.training else 0.0, is_causal=True)",
                     "dropout_p=self.dropout if self.training else 0.0, is_causal=False)")],
    "rmsnorm_eps": [
        (
            "return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)",
            "return x / (torch.sqrt(x.pow(2).mean(-1, keepdim=True)) + self.eps)",
        )
    ],
    "rmsnorm_mean:square_of_mean": [
        (
            "return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)",
            "return x * torch.rsqrt(x.mean(-1, keepdim=True).pow(2) + self.eps)",
        )
    ],
    "swiglu_silu": [(SWIGLU, "return self.dropout(self.w2(F.silu(self.w1(x)) * F.silu(self.w3(x))))")],
    "swiglu_swapped": [(SWIGLU, "return self.dropout(self.w2(F.silu(self.w3(x)) * self.w1(x)))")],
    "no_residual:mlp": [
        (
            "out = h + self.feed_forward.forward(self.ffn_norm(h))",
            "out = self.feed_forward.forward(self.ffn_norm(h))",
        )
    ],
    "shared_norm": [
        (
            "out = h + self.feed_forward.forward(self.ffn_norm(h))",
            "out = h + self.feed_forward.forward(self.attention_norm(h))",
        )
    ],
}
PAIRS = [("rope_q_only", "rmsnorm_eps"), ("gqa_order", "future_leak")]
