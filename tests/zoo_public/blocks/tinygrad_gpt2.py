# Source: tinygrad/tinygrad, examples/gpt2.py
#   commit 01523dd29ec302613cb594160b5c96b9e4cad530: LayerNorm, Attention, FeedForward,
#   TransformerBlock, and the mask Transformer.__call__ builds; with tinygrad.nn.Linear and the
#   Tensor methods they call (layernorm, gelu, scaled_dot_product_attention).
# Kept: tinygrad's style: plain Python classes (not modules) holding tensors and called with
# __call__, Linear as x.linear(weight.transpose(), bias) with weight stored (out, in), c_attn
# sliced into q | k | v by channel ranges, reshape to (bsz, seqlen, n_heads, head_dim) then
# transpose(1, 2), scaled_dot_product_attention adding the -inf mask above the diagonal (triu),
# the block returning (h, cache_k, cache_v), TransformerBlock(dim, n_heads, norm_eps).
# Ported: tinygrad Tensor ops -> torch, one call for one call (Tensor.layernorm, Tensor.gelu and
# Tensor.scaled_dot_product_attention written out as tinygrad defines them); a Block module that
# registers the plain objects' tensors as its parameters, named as tinygrad's get_state_dict
# names them, since the checker (like torch) needs an nn.Module. Reduced: no kv cache, no JIT.
import math
from typing import Optional

import torch
from torch import nn


def layernorm(x, axis=-1, eps=1e-5):  # tinygrad's Tensor.layernorm
    y = x - x.mean(axis, keepdim=True)
    return y.mul((y * y).mean(axis, keepdim=True).add(eps).rsqrt())


def gelu(x):  # tinygrad's Tensor.gelu
    return 0.5 * x * (1 + (x * 0.7978845608 * (1 + 0.044715 * x * x)).tanh())


def scaled_dot_product_attention(q, key, value, attn_mask=None):  # tinygrad's Tensor method
    return (q @ key.transpose(-2, -1) / math.sqrt(q.shape[-1]) + attn_mask).softmax(-1) @ value


class Linear:  # tinygrad.nn.Linear
    def __init__(self, in_features, out_features, bias=True):
        bound = 1 / math.sqrt(in_features)
        self.weight = nn.Parameter(torch.empty(out_features, in_features).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(out_features).uniform_(-bound, bound)) if bias else None

    def __call__(self, x):
        return x @ self.weight.transpose(0, 1) + self.bias  # x.linear(self.weight.transpose(), self.bias)


class LayerNorm:
    def __init__(self, dim, eps=1e-5):
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def __call__(self, x):
        return (layernorm(x, eps=self.eps)) * self.weight + self.bias


class Attention:
    def __init__(self, dim, n_heads, linear=Linear):
        self.c_attn = linear(dim, 3 * dim, bias=True)
        self.c_proj = linear(dim, dim, bias=True)
        self.n_heads = n_heads
        self.dim = dim
        self.head_dim = dim // n_heads

    def __call__(
        self,
        x,
        cache_k: Optional[torch.Tensor],
        cache_v: Optional[torch.Tensor],
        start_pos: int,
        mask: Optional[torch.Tensor],
    ):
        xqkv = self.c_attn(x)
        xq, xk, xv = [xqkv[:, :, i * self.dim : (i + 1) * self.dim] for i in range(3)]
        xq, xk, xv = [x.reshape(x.shape[0], x.shape[1], self.n_heads, self.head_dim) for x in (xq, xk, xv)]

        bsz, seqlen, _, _ = xq.shape
        # kv caching!
        keys, values = xk, xv

        # save the cache
        cache_k, cache_v = keys, values
        xq, keys, values = xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2)
        output = scaled_dot_product_attention(xq, keys, values, mask).transpose(1, 2).reshape(bsz, seqlen, -1)
        return self.c_proj(output), cache_k, cache_v


class FeedForward:
    def __init__(self, dim, hidden_dim, linear=Linear):
        self.c_fc = linear(dim, hidden_dim, bias=True)
        self.c_proj = linear(hidden_dim, dim, bias=True)

    def __call__(self, x):
        return self.c_proj(gelu(self.c_fc(x)))


class TransformerBlock:
    def __init__(self, dim, n_heads, norm_eps, linear=Linear):
        self.attn = Attention(dim, n_heads, linear)
        self.mlp = FeedForward(dim, 4 * dim, linear)
        self.ln_1 = LayerNorm(dim, norm_eps)
        self.ln_2 = LayerNorm(dim, norm_eps)

    def __call__(
        self,
        x,
        cache_k: Optional[torch.Tensor],
        cache_v: Optional[torch.Tensor],
        start_pos: int,
        mask: Optional[torch.Tensor],
    ):
        output, cache_k, cache_v = self.attn(self.ln_1(x), cache_k, cache_v, start_pos, mask)
        h = x + output
        h = h + self.mlp(self.ln_2(h))
        return h, cache_k, cache_v


def get_state_dict(obj, prefix=""):  # tinygrad.nn.state.get_state_dict, for these classes
    if isinstance(obj, torch.Tensor):
        return {prefix.strip("."): obj}
    state_dict = {}
    for k, v in vars(obj).items():
        if isinstance(v, (torch.Tensor, Linear, LayerNorm, Attention, FeedForward)):
            state_dict.update(get_state_dict(v, f"{prefix}{k}."))
    return state_dict


class Block(nn.Module):
    """tinygrad's TransformerBlock as an nn.Module: its tensors registered as parameters."""

    def __init__(self, dim, n_heads, norm_eps=1e-5):
        super().__init__()
        self.block = TransformerBlock(dim, n_heads, norm_eps)
        for name, tensor in get_state_dict(self.block).items():
            self.register_parameter(name.replace(".", "_"), tensor)

    def forward(self, x, start_pos: int = 0):
        seqlen = x.shape[1]
        mask = torch.full((1, 1, seqlen, start_pos + seqlen), float("-inf"), dtype=x.dtype, device=x.device)
        mask = mask.triu(start_pos + 1)
        h, _, _ = self.block(x, None, None, start_pos=start_pos, mask=mask)
        return h


# ----- the zoo's data (the checker never sees it) -----
from zoo_public.edits import residual  # noqa: E402

SOURCE = "tinygrad/tinygrad examples/gpt2.py @ 01523dd29ec302613cb594160b5c96b9e4cad530 (tinygrad, ported to torch)"
REFERENCE = {"n_head": 4, "activation": "gelu_tanh"}
BLOCK = Block
ARGS = {"dim": 32, "n_heads": 4}


def weights(b):
    t = b.block
    q, k, v = t.attn.c_attn.weight.chunk(3)
    bq, bk, bv = t.attn.c_attn.bias.chunk(3)
    return {
        "ln1": (t.ln_1.weight, t.ln_1.bias),
        "q": (q, bq),
        "k": (k, bk),
        "v": (v, bv),
        "proj": (t.attn.c_proj.weight, t.attn.c_proj.bias),
        "ln2": (t.ln_2.weight, t.ln_2.bias),
        "fc1": (t.mlp.c_fc.weight, t.mlp.c_fc.bias),
        "fc2": (t.mlp.c_proj.weight, t.mlp.c_proj.bias),
    }


SDPA = "return (q @ key.transpose(-2, -1) / math.sqrt(q.shape[-1]) + attn_mask).softmax(-1) @ value"
wiring = residual("self.attn", "self.ln_1", "self.mlp", "self.ln_2", x="h")  # the MLP line's edits
MISTAKES = {
    "no_scaling": [(SDPA, "return (q @ key.transpose(-2, -1) + attn_mask).softmax(-1) @ value")],
    "wrong_scale:1/hs": [(SDPA, "return (q @ key.transpose(-2, -1) / q.shape[-1] + attn_mask).softmax(-1) @ value")],
    "future_leak": [('start_pos + seqlen), float("-inf"), dtype', "start_pos + seqlen), 0.0, dtype")],
    "mask_reversed": [("mask = mask.triu(start_pos + 1)", "mask = mask.tril(start_pos)")],
    "softmax_dim": [(SDPA, SDPA.replace(".softmax(-1)", ".softmax(-2)"))],
    "heads_mixed:merge": [
        (
            "output = scaled_dot_product_attention(xq, keys, values, mask).transpose(1, 2).reshape(bsz, seqlen, -1)",
            "output = scaled_dot_product_attention(xq, keys, values, mask).reshape(bsz, seqlen, -1)",
        )
    ],
    "no_residual:attn": [("h = x + output", "h = output")],
    "no_residual:mlp": wiring["no_residual:mlp"],
    "shared_norm": wiring["shared_norm"],  # h = h + self.mlp(self.ln_1(h))
    "post_norm": [
        (
            "output, cache_k, cache_v = self.attn(self.ln_1(x), cache_k, cache_v, start_pos, mask)",
            "output, cache_k, cache_v = self.attn(x, cache_k, cache_v, start_pos, mask)",
        ),
        ("h = x + output", "h = self.ln_1(x + output)"),
        *wiring["post_norm"][1:],
    ],
}
PAIRS = [("no_scaling", "no_residual:mlp"), ("mask_reversed", "shared_norm")]
