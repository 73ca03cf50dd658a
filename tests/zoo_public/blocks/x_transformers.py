# Source: lucidrains/x-transformers, x_transformers/x_transformers.py
#   commit b8a9add6bb5eb6099e0755869d0caeeda4b1eb31 (LayerNorm, Residual, FeedForward, Attention,
#   AttentionLayers / Decoder) and x_transformers/attend.py (Attend).
# Kept: Decoder(dim, depth, heads, attn_dim_head) building its layers as ModuleList([norms,
# block, residual_fn]) for the layer types ('a', 'f') and running them in one loop, the
# bias-free to_q / to_k / to_v / to_out, einops rearrange 'b n (h d) -> b h n d', the Attend
# module's einsum 'b h i d, b h j d -> b h i j' * scale, its causal mask triu(j - i + 1) filled
# with -finfo.max and float32 softmax, LayerNorm as an affine-free nn.LayerNorm times `gamma`,
# FeedForward as Sequential(Sequential(Linear, GELU), Dropout, Linear).
# Reduced: every option off (no rotary, memory tokens, residual scaling, sandwich or post-branch
# norms, glu, flash); depth 1; einops' rearrange as tests/zoo_public/einops_lite.
from functools import partial

import torch
import torch.nn.functional as F
from torch import einsum, nn
from torch.nn import Module, ModuleList

from zoo_public.einops_lite import rearrange

DEFAULT_DIM_HEAD = 64


def exists(val):
    return val is not None


def default(val, d):
    if exists(val):
        return val
    return d() if callable(d) else d


def Sequential(*modules):
    return nn.Sequential(*filter(exists, modules))


class LayerNorm(Module):
    def __init__(self, dim, unit_offset=False):
        """
        bias-less layernorm has been shown to be more stable. most newer models have moved towards rmsnorm, also bias-less
        """
        super().__init__()
        self.unit_offset = unit_offset

        self.ln = nn.LayerNorm(dim, elementwise_affine=False)
        self.gamma = nn.Parameter(torch.ones(dim))
        nn.init.constant_(self.gamma, 1.0 - float(unit_offset))

    def forward(self, x):
        normed = self.ln(x)
        gamma = self.gamma + float(self.unit_offset)
        return normed * gamma


class Residual(Module):
    def __init__(self, dim, scale_residual=False, scale_residual_constant=1.0):
        super().__init__()
        self.residual_scale = nn.Parameter(torch.ones(dim)) if scale_residual else None
        self.scale_residual_constant = scale_residual_constant

    def prepare(self, residual):
        return residual, residual, dict()

    def forward(self, x, residual):
        if exists(self.residual_scale):
            residual = residual * self.residual_scale

        if self.scale_residual_constant != 1:
            residual = residual * self.scale_residual_constant

        return x + residual


class FeedForward(Module):
    def __init__(self, dim, dim_out=None, mult=4, dropout=0.0, no_bias=False):
        super().__init__()
        inner_dim = int(dim * mult)
        dim_out = default(dim_out, dim)
        activation = nn.GELU()
        project_in = Sequential(nn.Linear(dim, inner_dim, bias=not no_bias), activation)
        self.ff = Sequential(project_in, nn.Dropout(dropout), nn.Linear(inner_dim, dim_out, bias=not no_bias))

    def forward(self, x):
        return self.ff(x)


class Attend(Module):
    def __init__(self, *, dropout=0.0, causal=False, heads=None, scale=None):
        super().__init__()
        self.scale = scale
        self.causal = causal
        self.attn_fn = partial(F.softmax, dtype=torch.float32)
        self.dropout = dropout
        self.attn_dropout = nn.Dropout(dropout)

    def create_causal_mask(self, i, j, device):
        return torch.ones((i, j), device=device, dtype=torch.bool).triu(j - i + 1)

    def forward(self, q, k, v):
        n, heads, kv_heads, device = q.shape[-2], q.shape[1], k.shape[1], q.device

        scale = default(self.scale, q.shape[-1] ** -0.5)

        kv_einsum_eq = "b j d" if k.ndim == 3 else "b h j d"

        dots = einsum(f"b h i d, {kv_einsum_eq} -> b h i j", q, k) * scale

        i, j, dtype = *dots.shape[-2:], dots.dtype

        mask_value = -torch.finfo(dots.dtype).max

        if self.causal:
            causal_mask = self.create_causal_mask(i, j, device=device)
            dots = dots.masked_fill(causal_mask, mask_value)

        attn = self.attn_fn(dots, dim=-1)
        attn = attn.type(dtype)

        attn = self.attn_dropout(attn)

        out = einsum(f"b h i j, {kv_einsum_eq} -> b h i d", attn, v)

        return out, attn


class Attention(Module):
    def __init__(self, dim, dim_head=DEFAULT_DIM_HEAD, heads=8, causal=False, dropout=0.0):
        super().__init__()
        dim_kv = dim
        self.scale = dim_head**-0.5

        self.heads = heads
        self.causal = causal

        q_dim = dim_head * heads
        k_dim = dim_head * heads
        v_dim = out_dim = dim_head * heads

        self.to_q = nn.Linear(dim, q_dim, bias=False)
        self.to_k = nn.Linear(dim_kv, k_dim, bias=False)
        self.to_v = nn.Linear(dim_kv, v_dim, bias=False)

        # attend class - includes core attention algorithm + talking heads
        self.attend = Attend(heads=heads, causal=causal, dropout=dropout, scale=self.scale)

        # output
        self.to_out = nn.Linear(out_dim, dim, bias=False)

    def forward(self, x):
        h, kv_h = self.heads, self.heads

        q_input = x
        k_input = x
        v_input = x

        q = self.to_q(q_input)
        k = self.to_k(k_input)
        v = self.to_v(v_input)

        q = rearrange(q, "b n (h d) -> b h n d", h=h)

        k, v = map(lambda t: rearrange(t, "b n (h d) -> b h n d", h=kv_h), (k, v))

        out, intermediates = self.attend(q, k, v)

        out = rearrange(out, "b h n d -> b n (h d)")

        out = self.to_out(out)

        return out


class AttentionLayers(Module):
    def __init__(self, dim, depth, heads=8, causal=False, attn_dim_head=DEFAULT_DIM_HEAD, ff_mult=4, dropout=0.0):
        super().__init__()
        self.dim = dim
        self.depth = depth
        self.causal = causal
        self.layers = ModuleList([])

        norm_fn = partial(LayerNorm, dim)
        self.layer_types = ("a", "f") * depth

        for layer_type in self.layer_types:
            if layer_type == "a":
                layer = Attention(dim, dim_head=attn_dim_head, heads=heads, causal=causal, dropout=dropout)
            elif layer_type == "f":
                layer = FeedForward(dim, mult=ff_mult, dropout=dropout)

            residual_fn = Residual(dim)

            pre_branch_norm = norm_fn()
            post_branch_norm = None
            post_main_norm = None

            norms = ModuleList([pre_branch_norm, post_branch_norm, post_main_norm])

            self.layers.append(ModuleList([norms, layer, residual_fn]))

    def forward(self, x):
        for layer_type, (norm, block, residual_fn) in zip(self.layer_types, self.layers):
            residual, inner_residual, residual_kwargs = residual_fn.prepare(x)

            pre_norm, post_branch_norm, post_main_norm = norm

            if exists(pre_norm):
                x = pre_norm(x)

            if layer_type == "a":
                out = block(x)
            elif layer_type == "f":
                out = block(x)

            if exists(post_branch_norm):
                out = post_branch_norm(out)

            x = residual_fn(out, inner_residual)

            if exists(post_main_norm):
                x = post_main_norm(x)

        return x


class Decoder(AttentionLayers):
    def __init__(self, **kwargs):
        assert "causal" not in kwargs, "cannot set causality on decoder"
        super().__init__(causal=True, **kwargs)


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "lucidrains/x-transformers x_transformers/x_transformers.py @ b8a9add6bb5eb6099e0755869d0caeeda4b1eb31 (+ attend.py)"
REFERENCE = {"n_head": 4, "activation": "gelu"}
BLOCK = Decoder
ARGS = {"dim": 32, "depth": 1, "heads": 4, "attn_dim_head": 8}
TOLERANCE = 1e-6  # the softmax runs in float32, as Attend's attn_fn does


def weights(b):
    (n1, _, _), attn, _ = b.layers[0]
    (n2, _, _), ff, _ = b.layers[1]
    return {
        "ln1": (n1.gamma, None),
        "q": (attn.to_q.weight, None),
        "k": (attn.to_k.weight, None),
        "v": (attn.to_v.weight, None),
        "proj": (attn.to_out.weight, None),
        "ln2": (n2.gamma, None),
        "fc1": (ff.ff[0][0].weight, ff.ff[0][0].bias),
        "fc2": (ff.ff[2].weight, ff.ff[2].bias),
    }


DOTS = 'dots = einsum(f"b h i d, {kv_einsum_eq} -> b h i j", q, k) * scale'
MISTAKES = {
    "no_scaling": [(DOTS, 'dots = einsum(f"b h i d, {kv_einsum_eq} -> b h i j", q, k)')],
    "wrong_scale": [("self.scale = dim_head**-0.5", "self.scale = dim**-0.5")],
    "wrong_scale:1/hs": [("self.scale = dim_head**-0.5", "self.scale = dim_head**-1")],
    "future_leak": [("super().__init__(causal=True, **kwargs)", "super().__init__(**kwargs)")],
    "mask_reversed": [(".triu(j - i + 1)", ".tril(j - i)")],
    "mask_zero": [("mask_value = -torch.finfo(dots.dtype).max", "mask_value = 0.0")],
    "softmax_dim": [("attn = self.attn_fn(dots, dim=-1)", "attn = self.attn_fn(dots, dim=-2)")],
    "heads_mixed:merge": [
        ('out = rearrange(out, "b h n d -> b n (h d)")', 'out = rearrange(out, "b h n d -> b n (d h)")')
    ],
    "post_norm": [
        ("            if exists(pre_norm):\n                x = pre_norm(x)\n", ""),
        (
            "            x = residual_fn(out, inner_residual)\n",
            "            x = pre_norm(residual_fn(out, inner_residual))\n",
        ),
    ],
    "no_residual:both": [("x = residual_fn(out, inner_residual)", "x = out")],
    "no_residual:normed": [
        (
            "residual, inner_residual, residual_kwargs = residual_fn.prepare(x)\n\n            pre_norm, post_branch_norm, post_main_norm = norm\n\n            if exists(pre_norm):\n                x = pre_norm(x)\n",
            "pre_norm, post_branch_norm, post_main_norm = norm\n\n            if exists(pre_norm):\n                x = pre_norm(x)\n\n            residual, inner_residual, residual_kwargs = residual_fn.prepare(x)\n",
        )
    ],
    "shared_norm": [
        (
            "            norms = ModuleList([pre_branch_norm, post_branch_norm, post_main_norm])\n",
            "            pre_branch_norm = self.layers[0][0][0] if self.layers else pre_branch_norm\n            norms = ModuleList([pre_branch_norm, post_branch_norm, post_main_norm])\n",
        )
    ],
}
PAIRS = [("no_scaling", "post_norm"), ("mask_zero", "no_residual:normed")]
