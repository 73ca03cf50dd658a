# Source: pytorch-labs/gpt-fast, model.py
#   commit 870415262cf12f7144d93359317acb24629e6dfd: ModelArgs, TransformerBlock, Attention
#   (with its load_hook), FeedForward, RMSNorm; the causal_mask Transformer.setup_caches builds.
# Kept: TransformerBlock(config) with the ModelArgs dataclass and its __post_init__, the fused
# wqkv split([dim, kv_size, kv_size]) with the state-dict pre-hook that fuses wq / wk / wv, SDPA
# given a bool mask (True = may attend) sliced by input_pos from a tril buffer, the head merge
# view(bsz, seqlen, self.dim), attention_norm / ffn_norm, h = x + ...; out = h + ...
# Reduced: RMSNorm's maths made the lessons' LayerNorm (no bias); the SwiGLU FeedForward
# (w1, w3, w2) made w2(gelu(w1(x))) of width 4 * dim; no rotary embedding, no kv cache (so the
# mask is sliced to the keys of this call).
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
from torch import Tensor
from torch.nn import functional as F


@dataclass
class ModelArgs:
    block_size: int = 2048
    vocab_size: int = 32000
    n_layer: int = 32
    n_head: int = 32
    dim: int = 4096
    intermediate_size: int = None
    n_local_heads: int = -1
    head_dim: int = 64
    norm_eps: float = 1e-5

    def __post_init__(self):
        if self.n_local_heads == -1:
            self.n_local_heads = self.n_head
        if self.intermediate_size is None:
            self.intermediate_size = 4 * self.dim
        self.head_dim = self.dim // self.n_head


class TransformerBlock(nn.Module):
    def __init__(self, config: ModelArgs) -> None:
        super().__init__()
        self.attention = Attention(config)
        self.feed_forward = FeedForward(config)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)
        self.attention_norm = RMSNorm(config.dim, config.norm_eps)
        self.register_buffer(
            "causal_mask", torch.tril(torch.ones(config.block_size, config.block_size, dtype=torch.bool))
        )

    def forward(self, x: Tensor, input_pos: Optional[Tensor] = None, mask: Optional[Tensor] = None) -> Tensor:
        if mask is None:
            input_pos = torch.arange(x.shape[1], device=x.device) if input_pos is None else input_pos
            mask = self.causal_mask[None, None, input_pos][..., : x.shape[1]]
        h = x + self.attention(self.attention_norm(x), mask, input_pos)
        out = h + self.feed_forward(self.ffn_norm(h))
        return out


class Attention(nn.Module):
    def __init__(self, config: ModelArgs):
        super().__init__()
        assert config.dim % config.n_head == 0

        total_head_dim = (config.n_head + 2 * config.n_local_heads) * config.head_dim
        # key, query, value projections for all heads, but in a batch
        self.wqkv = nn.Linear(config.dim, total_head_dim, bias=False)
        self.wo = nn.Linear(config.dim, config.dim, bias=False)
        self.kv_cache = None

        self.n_head = config.n_head
        self.head_dim = config.head_dim
        self.n_local_heads = config.n_local_heads
        self.dim = config.dim
        self._register_load_state_dict_pre_hook(self.load_hook)

    def load_hook(self, state_dict, prefix, *args):
        if prefix + "wq.weight" in state_dict:
            wq = state_dict.pop(prefix + "wq.weight")
            wk = state_dict.pop(prefix + "wk.weight")
            wv = state_dict.pop(prefix + "wv.weight")
            state_dict[prefix + "wqkv.weight"] = torch.cat([wq, wk, wv])

    def forward(self, x: Tensor, mask: Tensor, input_pos: Optional[Tensor] = None) -> Tensor:
        bsz, seqlen, _ = x.shape

        kv_size = self.n_local_heads * self.head_dim
        q, k, v = self.wqkv(x).split([self.dim, kv_size, kv_size], dim=-1)

        q = q.view(bsz, seqlen, self.n_head, self.head_dim)
        k = k.view(bsz, seqlen, self.n_local_heads, self.head_dim)
        v = v.view(bsz, seqlen, self.n_local_heads, self.head_dim)

        q, k, v = map(lambda x: x.transpose(1, 2), (q, k, v))

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
        self.w2 = nn.Linear(config.intermediate_size, config.dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.gelu(self.w1(x)))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def _norm(self, x):
        x = x - torch.mean(x, dim=-1, keepdim=True)  # the zoo's reduction: LayerNorm's maths
        return x * torch.rsqrt(torch.mean(x * x, dim=-1, keepdim=True) + self.eps)

    def forward(self, x: Tensor) -> Tensor:
        output = self._norm(x.float()).type_as(x)
        return output * self.weight


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "pytorch-labs/gpt-fast model.py @ 870415262cf12f7144d93359317acb24629e6dfd"
REFERENCE = {"n_head": 4, "activation": "gelu"}
BLOCK = TransformerBlock
ARGS = {"config": ModelArgs(block_size=16, n_layer=1, n_head=4, dim=32)}
TOLERANCE = 1e-6  # the norm computes in float32, as gpt-fast's does


def weights(b):
    a, f = b.attention, b.feed_forward
    q, k, v = a.wqkv.weight.split(a.dim)
    return {
        "ln1": (b.attention_norm.weight, None),
        "q": (q, None),
        "k": (k, None),
        "v": (v, None),
        "proj": (a.wo.weight, None),
        "ln2": (b.ffn_norm.weight, None),
        "fc1": (f.w1.weight, None),
        "fc2": (f.w2.weight, None),
    }


SDPA = "y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0)"
MASK = "mask = self.causal_mask[None, None, input_pos][..., : x.shape[1]]"
MISTAKES = {
    "no_scaling": [(SDPA, "y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, scale=1.0)")],
    "wrong_scale": [
        (SDPA, "y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, scale=self.dim**-0.5)")
    ],
    "wrong_scale:1/hs": [
        (SDPA, "y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, scale=1 / self.head_dim)")
    ],
    "future_leak": [(SDPA, "y = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0)")],
    "mask_reversed": [(MASK, "mask = ~self.causal_mask[None, None, input_pos][..., : x.shape[1]]")],
    "heads_mixed:split": [
        (
            "q, k, v = map(lambda x: x.transpose(1, 2), (q, k, v))",
            "q, k, v = map(lambda t: t.reshape(bsz, -1, seqlen, self.head_dim), (q, k, v))",
        )
    ],
    "heads_mixed:merge": [
        (
            "y = y.transpose(1, 2).contiguous().view(bsz, seqlen, self.dim)",
            "y = y.contiguous().view(bsz, seqlen, self.dim)",
        )
    ],
    "post_norm": [
        (
            "h = x + self.attention(self.attention_norm(x), mask, input_pos)",
            "h = self.attention_norm(x + self.attention(x, mask, input_pos))",
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
PAIRS = [("wrong_scale", "no_residual:mlp"), ("mask_reversed", "shared_norm")]
