# Source: lucidrains/vit-pytorch, vit_pytorch/vit.py
#   commit 0ebd4edab94c211eff78406248896588d155a10c: FeedForward, Attention, Transformer.
# Kept: Transformer(dim, depth, heads, dim_head, mlp_dim) running ModuleList([Attention,
# FeedForward]) pairs (attention, then MLP, each added to x), each sub-layer holding its own nn.LayerNorm (the
# attention's as self.norm, the MLP's first in its nn.Sequential), to_qkv chunked in thirds and
# rearranged 'b n (h d) -> b h n d', dots * self.scale, the softmax as an nn.Softmax module
# (self.attend), to_out as nn.Sequential(Linear, Dropout).
# Reduced: ViT attends both ways; here a causal mask fills dots above the diagonal with
# -finfo.max before self.attend (as lucidrains' causal models do); depth 1, and no final norm
# (Transformer.norm, which belongs to the model, not to a block); einops' rearrange as
# tests/zoo_public/einops_lite.
import torch
from torch import nn

from zoo_public.einops_lite import rearrange


class FeedForward(nn.Module):
    def __init__(self, dim, hidden_dim, dropout=0.0):
        super().__init__()
        self.net = nn.Sequential(
            nn.LayerNorm(dim),
            nn.Linear(dim, hidden_dim),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(hidden_dim, dim),
            nn.Dropout(dropout),
        )

    def forward(self, x):
        return self.net(x)


class Attention(nn.Module):
    def __init__(self, dim, heads=8, dim_head=64, dropout=0.0):
        super().__init__()
        inner_dim = dim_head * heads
        project_out = not (heads == 1 and dim_head == dim)

        self.heads = heads
        self.scale = dim_head**-0.5

        self.norm = nn.LayerNorm(dim)

        self.attend = nn.Softmax(dim=-1)
        self.dropout = nn.Dropout(dropout)

        self.to_qkv = nn.Linear(dim, inner_dim * 3, bias=False)

        self.to_out = nn.Sequential(nn.Linear(inner_dim, dim), nn.Dropout(dropout)) if project_out else nn.Identity()

    def forward(self, x):
        x = self.norm(x)

        qkv = self.to_qkv(x).chunk(3, dim=-1)
        q, k, v = map(lambda t: rearrange(t, "b n (h d) -> b h n d", h=self.heads), qkv)

        dots = torch.matmul(q, k.transpose(-1, -2)) * self.scale

        i, j = dots.shape[-2:]
        causal_mask = torch.ones((i, j), device=dots.device, dtype=torch.bool).triu(j - i + 1)
        dots = dots.masked_fill(causal_mask, -torch.finfo(dots.dtype).max)

        attn = self.attend(dots)
        attn = self.dropout(attn)

        out = torch.matmul(attn, v)
        out = rearrange(out, "b h n d -> b n (h d)")
        return self.to_out(out)


class Transformer(nn.Module):
    def __init__(self, dim, depth, heads, dim_head, mlp_dim, dropout=0.0):
        super().__init__()
        self.layers = nn.ModuleList([])
        for _ in range(depth):
            self.layers.append(
                nn.ModuleList(
                    [
                        Attention(dim, heads=heads, dim_head=dim_head, dropout=dropout),
                        FeedForward(dim, mlp_dim, dropout=dropout),
                    ]
                )
            )

    def forward(self, x):
        for attn, ff in self.layers:
            x = attn(x) + x
            x = ff(x) + x

        return x


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "lucidrains/vit-pytorch vit_pytorch/vit.py @ 0ebd4edab94c211eff78406248896588d155a10c"
REFERENCE = {"n_head": 4, "activation": "gelu"}
BLOCK = Transformer
ARGS = {"dim": 32, "depth": 1, "heads": 4, "dim_head": 8, "mlp_dim": 128, "dropout": 0.1}


def weights(b):
    attn, ff = b.layers[0]
    q, k, v = attn.to_qkv.weight.chunk(3)
    return {
        "ln1": (attn.norm.weight, attn.norm.bias),
        "q": (q, None),
        "k": (k, None),
        "v": (v, None),
        "proj": (attn.to_out[0].weight, attn.to_out[0].bias),
        "ln2": (ff.net[0].weight, ff.net[0].bias),
        "fc1": (ff.net[1].weight, ff.net[1].bias),
        "fc2": (ff.net[4].weight, ff.net[4].bias),
    }


FILL = "dots = dots.masked_fill(causal_mask, -torch.finfo(dots.dtype).max)"
MISTAKES = {
    "no_scaling": [
        ("dots = torch.matmul(q, k.transpose(-1, -2)) * self.scale", "dots = torch.matmul(q, k.transpose(-1, -2))")
    ],
    "wrong_scale": [("self.scale = dim_head**-0.5", "self.scale = dim**-0.5")],
    "wrong_scale:sqrt": [("self.scale = dim_head**-0.5", "self.scale = dim_head**0.5")],
    "future_leak": [(FILL, "# " + FILL)],  # ViT's own attention
    "mask_zero": [(FILL, "dots = dots.masked_fill(causal_mask, 0.0)")],
    "mask_reversed": [(".triu(j - i + 1)", ".tril()")],
    "mask_after_softmax": [
        (
            "attn = self.attend(dots)",
            "attn = self.attend(torch.matmul(q, k.transpose(-1, -2)) * self.scale).masked_fill(causal_mask, 0.0)",
        )
    ],
    "softmax_dim": [("self.attend = nn.Softmax(dim=-1)", "self.attend = nn.Softmax(dim=-2)")],
    "heads_mixed:merge": [
        ('out = rearrange(out, "b h n d -> b n (h d)")', 'out = rearrange(out, "b h n d -> b n (d h)")')
    ],
    "no_residual:attn": [("x = attn(x) + x", "x = attn(x)")],
    "no_residual:mlp": [("x = ff(x) + x", "x = ff(x)")],
    "shared_norm": [("x = ff(x) + x", "x = ff.net[1:](attn.norm(x)) + x")],
}
PAIRS = [("wrong_scale", "no_residual:mlp"), ("mask_zero", "shared_norm")]
