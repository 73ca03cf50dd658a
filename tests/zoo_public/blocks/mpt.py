# Source: mosaicml/llm-foundry, llmfoundry/models/layers/attention.py
#   commit 11d3d7066fa22766b8f9ce5f72372a90a9b25a82: scaled_multihead_dot_product_attention,
#   MultiheadAttention; and llmfoundry/models/layers/blocks.py (MPTBlock), ffn.py (MPTMLP).
# Kept: Wqkv packed in thirds and chunked, einops rearrange to heads (keys straight to
# 'b h d s'), softmax_scale defaulting to 1/sqrt(d), the causal mask built from new_ones().tril()
# inverted and filled with finfo.min, no biases anywhere (no_bias=True), norm_1/attn/norm_2/ffn
# with up_proj/down_proj and exact GELU, MPTBlock(d_model, n_heads, ...).
# Reduced: the 'torch' attention implementation only, no ALiBi / key padding / kv cache / clip_qkv.
import math

import torch
import torch.nn as nn

from zoo_public.einops_lite import rearrange


def scaled_multihead_dot_product_attention(
    query, key, value, n_heads, softmax_scale=None, is_causal=False, dropout_p=0.0, training=False
):
    q = rearrange(query, "b s (h d) -> b h s d", h=n_heads)
    k = rearrange(key, "b s (h d) -> b h d s", h=n_heads)
    v = rearrange(value, "b s (h d) -> b h s d", h=n_heads)

    b, _, s_q, d = q.shape
    s_k = k.size(-1)

    if softmax_scale is None:
        softmax_scale = 1 / math.sqrt(d)

    attn_weight = q.matmul(k) * softmax_scale

    min_val = torch.finfo(q.dtype).min

    if is_causal and (not q.size(2) == 1):
        s = max(s_q, s_k)
        causal_mask = attn_weight.new_ones(s, s, dtype=torch.float32)
        causal_mask = causal_mask.tril()
        causal_mask = causal_mask.to(torch.bool)
        causal_mask = ~causal_mask
        causal_mask = causal_mask[-s_q:, -s_k:]
        attn_weight = attn_weight.masked_fill(causal_mask.view(1, 1, s_q, s_k), min_val)

    attn_weight = torch.softmax(attn_weight, dim=-1)

    if dropout_p:
        attn_weight = torch.nn.functional.dropout(attn_weight, p=dropout_p, training=training, inplace=True)

    out = attn_weight.to(v.dtype).matmul(v)
    out = rearrange(out, "b h s d -> b s (h d)")
    return out, attn_weight


class MultiheadAttention(nn.Module):
    """Multi-head self attention, using the torch attention implementation (attn_impl='torch')."""

    def __init__(self, d_model, n_heads, softmax_scale=None, attn_pdrop=0.0, bias=True):
        super().__init__()
        self.d_model = d_model
        self.n_heads = n_heads
        self.softmax_scale = softmax_scale
        self.attn_dropout_p = attn_pdrop
        self.Wqkv = nn.Linear(self.d_model, 3 * self.d_model, bias=bias)
        # for param init fn; enables shape based init of fused layers
        fuse_splits = (d_model, 2 * d_model)
        self.Wqkv._fused = (0, fuse_splits)
        self.attn_fn = scaled_multihead_dot_product_attention
        self.out_proj = nn.Linear(self.d_model, self.d_model, bias=bias)
        self.out_proj._is_residual = True

    def forward(self, x, is_causal=True):
        qkv = self.Wqkv(x)
        query, key, value = qkv.chunk(3, dim=2)
        context, attn_weights = self.attn_fn(
            query, key, value, self.n_heads, softmax_scale=self.softmax_scale,
            is_causal=is_causal, dropout_p=self.attn_dropout_p, training=self.training,
        )  # fmt: skip
        return self.out_proj(context), attn_weights


class MPTMLP(nn.Module):
    def __init__(self, d_model, expansion_ratio, bias=True):
        super().__init__()
        self.up_proj = nn.Linear(d_model, expansion_ratio * d_model, bias=bias)
        self.act = nn.GELU(approximate="none")
        self.down_proj = nn.Linear(expansion_ratio * d_model, d_model, bias=bias)
        self.down_proj._is_residual = True

    def forward(self, x):
        return self.down_proj(self.act(self.up_proj(x)))


class MPTBlock(nn.Module):
    def __init__(self, d_model, n_heads, expansion_ratio, attn_config=None, resid_pdrop=0.0, no_bias=False):
        super().__init__()
        attn_config = attn_config or {"attn_pdrop": 0.0, "softmax_scale": None}
        self.norm_1 = nn.LayerNorm(d_model, bias=not no_bias)
        self.attn = MultiheadAttention(d_model=d_model, n_heads=n_heads, bias=not no_bias, **attn_config)
        self.norm_2 = nn.LayerNorm(d_model, bias=not no_bias)
        self.ffn = MPTMLP(d_model=d_model, expansion_ratio=expansion_ratio, bias=not no_bias)
        self.resid_attn_dropout = nn.Dropout(resid_pdrop)
        self.resid_ffn_dropout = nn.Dropout(resid_pdrop)

    def forward(self, x, is_causal=True):
        a = self.norm_1(x)
        b, attn_weights = self.attn(a, is_causal=is_causal)
        x = x + self.resid_attn_dropout(b)
        m = self.norm_2(x)
        n = self.ffn(m)
        x = x + self.resid_ffn_dropout(n)
        return x


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "mosaicml/llm-foundry llmfoundry/models/layers/attention.py @ 11d3d7066fa22766b8f9ce5f72372a90a9b25a82 (+ blocks.py, ffn.py)"
REFERENCE = {"n_head": 4, "activation": "gelu"}
BLOCK = MPTBlock
ARGS = {
    "d_model": 32,
    "n_heads": 4,
    "expansion_ratio": 4,
    "attn_config": {"attn_pdrop": 0.1, "softmax_scale": None},
    "resid_pdrop": 0.1,
    "no_bias": True,
}


def weights(b):
    a, f = b.attn, b.ffn
    q, k, v = a.Wqkv.weight.chunk(3)
    return {
        "ln1": (b.norm_1.weight, None),
        "q": (q, None),
        "k": (k, None),
        "v": (v, None),
        "proj": (a.out_proj.weight, None),
        "ln2": (b.norm_2.weight, None),
        "fc1": (f.up_proj.weight, None),
        "fc2": (f.down_proj.weight, None),
    }


SCALE = "softmax_scale = 1 / math.sqrt(d)"
FILL = "attn_weight = attn_weight.masked_fill(causal_mask.view(1, 1, s_q, s_k), min_val)"
MISTAKES = {
    "no_scaling": [(SCALE, "softmax_scale = 1")],
    "wrong_scale": [(SCALE, "softmax_scale = 1 / math.sqrt(query.size(-1))")],
    "wrong_scale:sqrt": [(SCALE, "softmax_scale = math.sqrt(d)")],
    "future_leak": [
        (
            "def forward(self, x, is_causal=True):\n        a = self.norm_1(x)",
            "def forward(self, x, is_causal=False):\n        a = self.norm_1(x)",
        )
    ],
    "mask_reversed": [("causal_mask = ~causal_mask\n", "causal_mask = causal_mask\n")],
    "mask_zero": [(FILL, FILL.replace("min_val)", "0.0)"))],
    "softmax_dim": [
        ("attn_weight = torch.softmax(attn_weight, dim=-1)", "attn_weight = torch.softmax(attn_weight, dim=-2)")
    ],
    "heads_mixed:merge": [
        ('out = rearrange(out, "b h s d -> b s (h d)")', 'out = rearrange(out, "b h s d -> b s (d h)")')
    ],
    "no_residual:attn": [("x = x + self.resid_attn_dropout(b)", "x = self.resid_attn_dropout(b)")],
    "no_residual:mlp": [("x = x + self.resid_ffn_dropout(n)", "x = self.resid_ffn_dropout(n)")],
    "shared_norm": [("m = self.norm_2(x)", "m = self.norm_1(x)")],
}
PAIRS = [("wrong_scale", "shared_norm"), ("mask_zero", "no_residual:attn")]
