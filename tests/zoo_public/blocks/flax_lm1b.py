# Source: google/flax, examples/lm1b/models.py
#   commit 0e5fc04018f1a20bdf32e9868c6a9eda38407424: TransformerConfig, MlpBlock,
#   EncoderDecoder1DBlock (with linen's nn.SelfAttention / MultiHeadDotProductAttention,
#   DenseGeneral, dot_product_attention and make_causal_mask, which the block calls).
# Ported from Flax (JAX) to torch, keeping Flax's shapes: a TransformerConfig dataclass; the
# q / k / v DenseGeneral kernels of shape (emb, heads, head_dim) and the output kernel
# (heads, head_dim, emb), applied by einsum / tensordot, no biases (use_bias=False as lm1b sets
# it); dot_product_attention in Flax's (batch, length, heads, head_dim) layout: query divided by
# sqrt(depth), einsum '...qhd,...khd->...hqk', the mask applied with where(mask, w, finfo.min),
# softmax over the last axis, einsum '...hqk,...khd->...qhd'; make_causal_mask as a float
# (batch, 1, len, len) array of 1 / 0 (greater_equal of positions); nn.LayerNorm with Flax's
# epsilon 1e-6; MlpBlock Dense(mlp_dim) -> relu -> Dense; the block returning x + z.
# Reduced: the padding mask (inputs > 0) needs token ids, so only the causal mask is used, built
# by the block when given none; dropout and decode-cache branches left out (deterministic).
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class TransformerConfig:
    """Global hyperparameters used to minimize obnoxious kwarg plumbing."""

    vocab_size: int
    output_vocab_size: int
    share_embeddings: bool = False
    logits_via_embedding: bool = False
    emb_dim: int = 512
    num_heads: int = 8
    num_layers: int = 6
    qkv_dim: int = 512
    mlp_dim: int = 2048
    max_len: int = 2048
    dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.1
    deterministic: bool = False
    decode: bool = False


def make_causal_mask(x):
    """Make a causal mask for self-attention: (batch, 1, len, len), 1.0 where attending is allowed."""
    idxs = torch.arange(x.shape[1], device=x.device)
    mask = torch.greater_equal(idxs[:, None], idxs[None, :])
    return mask[None, None].expand(x.shape[0], 1, -1, -1).to(x.dtype)


class DenseGeneral(nn.Module):
    """A linear transformation with flexible axes (kernel (in, *features) or (*in, out))."""

    def __init__(self, in_shape, features):
        super().__init__()
        self.in_shape, self.features = tuple(in_shape), tuple(features)
        self.kernel = nn.Parameter(torch.empty(*self.in_shape, *self.features))
        nn.init.xavier_uniform_(self.kernel.view(math.prod(self.in_shape), -1))

    def forward(self, inputs):
        n = len(self.in_shape)
        return torch.tensordot(inputs, self.kernel, dims=(list(range(inputs.ndim - n, inputs.ndim)), list(range(n))))


def dot_product_attention(query, key, value, mask=None):
    """Computes dot-product attention given query, key, and value ([batch, length, heads, head_dim])."""
    depth = query.shape[-1]
    query = query / math.sqrt(depth)
    # attn weight shape is (batch..., num_heads, q_length, kv_length)
    attn_weights = torch.einsum('...qhd,...khd->...hqk', query, key)
    # apply attention mask
    if mask is not None:
        big_neg = torch.finfo(attn_weights.dtype).min
        attn_weights = torch.where(mask.bool(), attn_weights, big_neg)
    # normalize the attention weights
    attn_weights = F.softmax(attn_weights, dim=-1)
    # return weighted sum over values for each query position
    return torch.einsum('...hqk,...khd->...qhd', attn_weights, value)


class SelfAttention(nn.Module):
    """Multi-head dot-product self-attention (linen's MultiHeadDotProductAttention)."""

    def __init__(self, num_heads, in_features, qkv_features):
        super().__init__()
        assert qkv_features % num_heads == 0, 'Memory dimension must be divisible by number of heads.'
        self.num_heads = num_heads
        head_dim = qkv_features // num_heads
        self.query = DenseGeneral((in_features,), (num_heads, head_dim))
        self.key = DenseGeneral((in_features,), (num_heads, head_dim))
        self.value = DenseGeneral((in_features,), (num_heads, head_dim))
        self.out = DenseGeneral((num_heads, head_dim), (in_features,))

    def forward(self, inputs_q, mask=None):
        # project inputs_q to multi-headed q/k/v
        # dimensions are then [batch..., length, n_heads, n_features_per_head]
        query, key, value = (self.query(inputs_q), self.key(inputs_q), self.value(inputs_q))
        x = dot_product_attention(query, key, value, mask=mask)
        # back to the original inputs dimensions
        out = self.out(x)
        return out


class MlpBlock(nn.Module):
    """Transformer MLP / feed-forward block."""

    def __init__(self, config, out_dim=None):
        super().__init__()
        self.config = config
        actual_out_dim = config.emb_dim if out_dim is None else out_dim
        self.Dense_0 = nn.Linear(config.emb_dim, config.mlp_dim)
        self.Dense_1 = nn.Linear(config.mlp_dim, actual_out_dim)

    def forward(self, inputs):
        x = self.Dense_0(inputs)
        x = F.relu(x)
        output = self.Dense_1(x)
        return output


class EncoderDecoder1DBlock(nn.Module):
    """Transformer encoder-decoder layer."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.LayerNorm_0 = nn.LayerNorm(config.emb_dim, eps=1e-6)
        self.SelfAttention_0 = SelfAttention(config.num_heads, config.emb_dim, config.qkv_dim)
        self.LayerNorm_1 = nn.LayerNorm(config.emb_dim, eps=1e-6)
        self.MlpBlock_0 = MlpBlock(config=config)

    def forward(self, inputs, decoder_mask=None, encoder_decoder_mask=None):
        if decoder_mask is None:
            decoder_mask = make_causal_mask(inputs[..., 0])

        # Decoder block.
        assert inputs.ndim == 3
        x = self.LayerNorm_0(inputs)
        x = self.SelfAttention_0(x, decoder_mask)
        x = x + inputs

        # MLP block.
        z = self.LayerNorm_1(x)
        z = self.MlpBlock_0(z)

        return x + z


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "google/flax examples/lm1b/models.py @ 0e5fc04018f1a20bdf32e9868c6a9eda38407424"
REFERENCE = {"n_head": 4, "activation": "relu", "norm_eps": 1e-6}
BLOCK = EncoderDecoder1DBlock
ARGS = {
    "config": TransformerConfig(
        vocab_size=64, output_vocab_size=64, emb_dim=32, num_heads=4, num_layers=1, qkv_dim=32, mlp_dim=128,
        max_len=16, deterministic=True,
    )
}  # fmt: skip


def weights(b):
    a, m = b.SelfAttention_0, b.MlpBlock_0
    C = a.query.kernel.shape[0]
    return {
        "ln1": (b.LayerNorm_0.weight, b.LayerNorm_0.bias),
        "q": (a.query.kernel.reshape(C, -1).T, None),
        "k": (a.key.kernel.reshape(C, -1).T, None),
        "v": (a.value.kernel.reshape(C, -1).T, None),
        "proj": (a.out.kernel.reshape(-1, C).T, None),
        "ln2": (b.LayerNorm_1.weight, b.LayerNorm_1.bias),
        "fc1": (m.Dense_0.weight, m.Dense_0.bias),
        "fc2": (m.Dense_1.weight, m.Dense_1.bias),
    }


SCALE = "query = query / math.sqrt(depth)"
WHERE = "attn_weights = torch.where(mask.bool(), attn_weights, big_neg)"
SOFTMAX = "attn_weights = F.softmax(attn_weights, dim=-1)"
MISTAKES = {
    "no_scaling": [(SCALE, "query = query")],
    "wrong_scale": [(SCALE, "query = query / math.sqrt(depth * query.shape[-2])")],
    "wrong_scale:1/hs": [(SCALE, "query = query / depth")],
    "future_leak": [("x = self.SelfAttention_0(x, decoder_mask)", "x = self.SelfAttention_0(x)")],
    "mask_reversed": [(WHERE, "attn_weights = torch.where(~mask.bool(), attn_weights, big_neg)")],
    "mask_zero": [("big_neg = torch.finfo(attn_weights.dtype).min", "big_neg = 0.0")],
    "softmax_dim": [(SOFTMAX, "attn_weights = F.softmax(attn_weights, dim=-2)")],
    "heads_mixed:merge": [("out = self.out(x)", "out = self.out(x.transpose(-2, -3).reshape(x.shape))")],
    "no_residual:attn": [("x = x + inputs", "x = x")],
    "no_residual:mlp": [("return x + z", "return z")],
    "shared_norm": [("z = self.LayerNorm_1(x)", "z = self.LayerNorm_0(x)")],
    "post_norm": [
        ("x = self.LayerNorm_0(inputs)\n        x = self.SelfAttention_0(x, decoder_mask)\n        x = x + inputs",
         "x = self.SelfAttention_0(inputs, decoder_mask)\n        x = self.LayerNorm_0(x + inputs)"),
        ("z = self.LayerNorm_1(x)\n        z = self.MlpBlock_0(z)\n\n        return x + z",
         "z = self.MlpBlock_0(x)\n\n        return self.LayerNorm_1(x + z)"),
    ],
}
PAIRS = [("no_scaling", "no_residual:attn")]
