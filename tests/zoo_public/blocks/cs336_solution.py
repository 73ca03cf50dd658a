# Source: roeehendel/cs336-assignment1-basics, cs336_basics/transformer/layers.py
#   commit 98b834af0793504dc8bb1ebd10a1a1b45df745ad: a student's solution to Stanford CS336's
#   assignment 1 (TransformerBlock, MultiHeadSelfAttention, Linear, RMSNorm, SwiGLU,
#   scaled_dot_product_attention, softmax, get_truncated_normal_tensor).
# Kept: the course's own Linear (weight (out_features, in_features), truncated-normal init, no
# bias) applied by einsum "out_features in_features, ... in_features -> ... out_features"; the
# hand-written softmax; scaled_dot_product_attention masking the logits with
# torch.where(mask, logits, -inf) *before* dividing them by sqrt(d_k) inside the softmax call;
# parse_shape and rearrange with long axis names ("... sequence_length (num_heads d_head) ->
# ..."), the bool mask torch.tril (True = may attend) built in forward, output_proj;
# TransformerBlock(d_model, num_heads, d_ff, rope, device, dtype) with ln1 / ln2 and in_features
# = in_features + ... residuals; the norm's float32 round trip.
# Reduced: RMSNorm's maths made the lessons' LayerNorm (mean subtracted, gain only, no bias); the
# SwiGLU (w1, w2, w3) made w2(gelu(w1(x))) with d_ff = 4 * d_model; no RoPE (rope=None); einops
# as tests/zoo_public/einops_lite.
import math
from collections.abc import Sequence
from typing import Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo_public.einops_lite import einsum, parse_shape, rearrange


class TransformerBlock(nn.Module):
    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        rope: Union["RoPE", None] = None,  # noqa: F821 -- the source's RoPE class, left out
        device: str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        self.attn = MultiHeadSelfAttention(d_model=d_model, num_heads=num_heads, device=device, dtype=dtype, rope=rope)
        self.ffn = SwiGLU(d_model=d_model, d_ff=d_ff, device=device, dtype=dtype)
        self.ln1, self.ln2 = (RMSNorm(d_model=d_model, device=device, dtype=dtype) for _ in range(2))

    def forward(self, in_features: Tensor) -> Tensor:
        in_features = in_features + self.attn(self.ln1(in_features))
        in_features = in_features + self.ffn(self.ln2(in_features))
        return in_features


class MultiHeadSelfAttention(nn.Module):
    def __init__(
        self, d_model: int, num_heads: int, rope=None, device: str | None = None, dtype: torch.dtype | None = None
    ):
        super().__init__()
        if not d_model % num_heads == 0:
            raise ValueError("d_model must be divisible by num_heads")

        self.num_heads = num_heads
        self.d = d_model // num_heads

        self.q_proj = Linear(in_features=d_model, out_features=d_model, device=device, dtype=dtype)
        self.k_proj = Linear(in_features=d_model, out_features=d_model, device=device, dtype=dtype)
        self.v_proj = Linear(in_features=d_model, out_features=d_model, device=device, dtype=dtype)
        self.output_proj = Linear(in_features=d_model, out_features=d_model, device=device, dtype=dtype)

        self.device = device

        self.rope = rope

    def forward(self, in_features: Tensor) -> Tensor:
        input_shape = parse_shape(in_features, "batch_size ... sequence_length d_model")
        sequence_length = input_shape["sequence_length"]

        queries = self.q_proj(in_features)
        keys = self.k_proj(in_features)
        values = self.v_proj(in_features)

        queries_per_head = self.rearrange_to_heads(queries)
        keys_per_head = self.rearrange_to_heads(keys)
        values_per_head = self.rearrange_to_heads(values)

        mask = torch.tril(torch.ones((sequence_length, sequence_length), dtype=torch.bool, device=self.device))

        attention_output_per_head = scaled_dot_product_attention(
            queries_per_head, keys_per_head, values_per_head, mask
        )

        attention_output = self.rearrange_from_heads(attention_output_per_head)

        return self.output_proj(attention_output)

    def rearrange_to_heads(self, X: Tensor) -> Tensor:
        return rearrange(
            X,
            "... sequence_length (num_heads d_head) -> ... num_heads sequence_length d_head",
            num_heads=self.num_heads,
        )

    def rearrange_from_heads(self, X: Tensor) -> Tensor:
        return rearrange(
            X,
            "... num_heads sequence_length d_head -> ... sequence_length (num_heads d_head)",
            num_heads=self.num_heads,
        )


class Linear(nn.Module):
    def __init__(
        self, in_features: int, out_features: int, device: str | None = None, dtype: torch.dtype | None = None
    ):
        super().__init__()
        self.weight = nn.Parameter(
            data=get_truncated_normal_tensor(
                size=(out_features, in_features),
                std=math.sqrt(2 / (in_features + out_features)),
                device=device,
                dtype=dtype,
            ),
        )

    def forward(self, x: Tensor) -> Tensor:
        return einsum(self.weight, x, "out_features in_features, ... in_features -> ... out_features")


class RMSNorm(nn.Module):
    def __init__(self, d_model: int, eps: float = 1e-5, device: str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        self.weight = nn.Parameter(
            data=get_truncated_normal_tensor(size=(d_model,), std=1, device=device, dtype=dtype)
        )
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        in_dtype = x.dtype
        x = x.to(torch.float32)

        x = x - x.mean(axis=-1, keepdims=True)  # the zoo's reduction: LayerNorm's maths
        rms = torch.sqrt((x**2).mean(axis=-1, keepdims=True) + self.eps)
        result = x / rms * self.weight

        return result.to(in_dtype)


class SwiGLU(nn.Module):
    def __init__(
        self, d_model: int, d_ff: int | None = None, device: str | None = None, dtype: torch.dtype | None = None
    ):
        super().__init__()
        self.w1 = Linear(in_features=d_model, out_features=d_ff, device=device, dtype=dtype)
        self.w2 = Linear(in_features=d_ff, out_features=d_model, device=device, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.gelu(self.w1(x)))  # the zoo's reduction: swish(w1 x) * w3 x made gelu(w1 x)


def scaled_dot_product_attention(Q: Tensor, K: Tensor, V: Tensor, mask: Tensor | None = None) -> Tensor:
    logits = einsum(Q, K, "... queries d_k, ... keys d_k -> ... queries keys")
    logits = torch.where(mask, logits, -torch.inf)

    d_k = parse_shape(Q, "... queries d_k")["d_k"]
    attention = softmax(logits / math.sqrt(d_k), dim=-1)

    return einsum(attention, V, "... queries keys, ... keys d_v ->... queries d_v")


def softmax(x: Tensor, dim: int) -> Tensor:
    x = x - x.max(dim=dim, keepdim=True)[0]  # for numerical stability, subtract the max value along dim
    exp_x = torch.exp(x)
    return exp_x / exp_x.sum(dim=dim, keepdim=True)


def get_truncated_normal_tensor(
    size: Sequence[int],
    mean: float = 0.0,
    std: float = 1.0,
    min_value: float | None = None,
    max_value: float | None = None,
    device: str = None,
    dtype: torch.dtype = None,
) -> torch.Tensor:
    return nn.init.trunc_normal_(
        torch.empty(size, device=device, dtype=dtype),
        mean=mean,
        std=std,
        a=min_value or -3 * std,
        b=max_value or 3 * std,
    )


# ----- the zoo's data (the checker never sees it) -----
from zoo_public.edits import residual  # noqa: E402

SOURCE = "roeehendel/cs336-assignment1-basics cs336_basics/transformer/layers.py @ 98b834af0793504dc8bb1ebd10a1a1b45df745ad (Stanford CS336 assignment 1)"
REFERENCE = {"n_head": 4, "activation": "gelu"}
BLOCK = TransformerBlock
ARGS = {"d_model": 32, "num_heads": 4, "d_ff": 128}
TOLERANCE = 1e-6  # the norm computes in float32, as the solution's does


def weights(b):
    a, f = b.attn, b.ffn
    return {
        "ln1": (b.ln1.weight, None),
        "q": (a.q_proj.weight, None),
        "k": (a.k_proj.weight, None),
        "v": (a.v_proj.weight, None),
        "proj": (a.output_proj.weight, None),
        "ln2": (b.ln2.weight, None),
        "fc1": (f.w1.weight, None),
        "fc2": (f.w2.weight, None),
    }


SOFTMAX = "attention = softmax(logits / math.sqrt(d_k), dim=-1)"
WHERE = "logits = torch.where(mask, logits, -torch.inf)"
wiring = residual("self.attn", "self.ln1", "self.ffn", "self.ln2", x="in_features")
MISTAKES = {
    "no_scaling": [(SOFTMAX, "attention = softmax(logits, dim=-1)")],
    "wrong_scale": [(SOFTMAX, "attention = softmax(logits / math.sqrt(d_k * 4), dim=-1)")],
    "wrong_scale:1/hs": [(SOFTMAX, "attention = softmax(logits / d_k, dim=-1)")],
    "future_leak": [(WHERE, "# " + WHERE)],
    "mask_reversed": [(WHERE, "logits = torch.where(mask, -torch.inf, logits)")],
    "mask_zero": [(WHERE, "logits = torch.where(mask, logits, 0.0)")],
    "softmax_dim": [(SOFTMAX, SOFTMAX.replace("dim=-1", "dim=-2"))],
    "heads_mixed:merge": [
        (
            '"... num_heads sequence_length d_head -> ... sequence_length (num_heads d_head)"',
            '"... num_heads sequence_length d_head -> ... sequence_length (d_head num_heads)"',
        )
    ],
    **{k: wiring[k] for k in ("post_norm", "no_residual:attn", "no_residual:mlp", "shared_norm")},
}
PAIRS = [("no_scaling", "post_norm"), ("mask_reversed", "shared_norm")]
