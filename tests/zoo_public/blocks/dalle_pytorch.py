# Source: lucidrains/DALLE-pytorch, dalle_pytorch/attention.py
#   commit 01a781efa0454c13e89f2b85210ee4d5a307e7b6 (Attention, max_neg_value), with
#   dalle_pytorch/transformer.py @ 01433fb9afb12ff9c58e0849c6eeeb5045329ef5 (PreNorm, FeedForward,
#   Transformer) and reversible.py's SequentialSequence / route_args.
# Kept: Transformer(dim, depth, seq_len, causal, heads, dim_head, ff_mult, ...) whose layers are
# a ModuleList of two PreNorm wrappers (attention, feed-forward) run by SequentialSequence (the residuals
# `x = x + f(x)` / `x = x + g(x)` live there, outside the block's modules, with the mask routed
# to the attention only); Attention with a bias-free to_qkv chunked in three and rearranged
# 'b n (h d) -> b h n d', `dots = einsum(...) * self.scale`, mask_value = -finfo.max, the causal
# mask made by torch.ones(i, j).triu_(j - i + 1).bool() and written in place by
# dots.masked_fill_, dots.softmax(dim=-1), to_out = Sequential(Linear, Dropout); einops'
# rearrange as tests/zoo_public/einops_lite.
# Reduced: depth=1; the FeedForward is GEGLU in the source (Linear(dim, dim * mult * 2), GEGLU):
# here Linear(dim, dim * mult) -> GELU; no LayerScale, no rotary embedding, no sandwich norm, no
# token shift, no sparse / axial attention, no reversible layers.

import torch
from torch import nn

from zoo_public.einops_lite import rearrange

# helpers

def exists(val):
    return val is not None

def max_neg_value(t):
    return -torch.finfo(t.dtype).max

def route_args(router, args, depth):
    routed_args = [(dict(), dict()) for _ in range(depth)]
    matched_keys = [key for key in args.keys() if key in router]  # noqa: SIM118

    for key in matched_keys:
        val = args[key]
        for depth, ((f_args, g_args), routes) in enumerate(zip(routed_args, router[key])):
            new_f_args, new_g_args = map(lambda route: ({key: val} if route else {}), routes)
            routed_args[depth] = ({**f_args, **new_f_args}, {**g_args, **new_g_args})
    return routed_args

# classes

class SequentialSequence(nn.Module):
    def __init__(self, layers, args_route = {}):  # noqa: B006
        super().__init__()
        assert all(len(route) == len(layers) for route in args_route.values()), 'each argument route map must have the same depth as the number of sequential layers'
        self.layers = layers
        self.args_route = args_route

    def forward(self, x, **kwargs):
        args = route_args(self.args_route, kwargs, len(self.layers))
        layers_and_args = list(zip(self.layers, args))

        for (f, g), (f_args, g_args) in layers_and_args:
            x = x + f(x, **f_args)
            x = x + g(x, **g_args)
        return x

class Attention(nn.Module):
    def __init__(self, dim, seq_len, causal = True, heads = 8, dim_head = 64, dropout = 0.):
        super().__init__()
        inner_dim = dim_head *  heads
        self.heads = heads
        self.seq_len = seq_len
        self.scale = dim_head ** -0.5

        self.causal = causal

        self.to_qkv = nn.Linear(dim, inner_dim * 3, bias = False)
        self.to_out = nn.Sequential(
            nn.Linear(inner_dim, dim),
            nn.Dropout(dropout)
        )

    def forward(self, x, mask = None):
        b, n, _, h, device = *x.shape, self.heads, x.device
        qkv = self.to_qkv(x).chunk(3, dim = -1)
        q, k, v = map(lambda t: rearrange(t, 'b n (h d) -> b h n d', h = h), qkv)

        dots = torch.einsum('b h i d, b h j d -> b h i j', q, k) * self.scale
        mask_value = max_neg_value(dots)

        if exists(mask):
            mask = rearrange(mask, 'b j -> b () () j')
            dots.masked_fill_(~mask, mask_value)
            del mask

        if self.causal:
            i, j = dots.shape[-2:]
            mask = torch.ones(i, j, device = device).triu_(j - i + 1).bool()
            dots.masked_fill_(mask, mask_value)

        attn = dots.softmax(dim=-1)

        out = torch.einsum('b h i j, b h j d -> b h i d', attn, v)
        out = rearrange(out, 'b h n d -> b n (h d)')
        out =  self.to_out(out)
        return out

class PreNorm(nn.Module):
    def __init__(self, dim, fn):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fn = fn

    def forward(self, x, **kwargs):
        x = self.norm(x)
        return self.fn(x, **kwargs)

class FeedForward(nn.Module):
    def __init__(self, dim, dropout = 0., mult = 4.):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(dim, int(dim * mult)),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(int(dim * mult), dim)
        )

    def forward(self, x):
        return self.net(x)

class Transformer(nn.Module):
    def __init__(
        self,
        *,
        dim,
        depth,
        seq_len,
        causal = True,
        heads = 8,
        dim_head = 64,
        ff_mult = 4,
        attn_dropout = 0.,
        ff_dropout = 0.,
    ):
        super().__init__()
        layers = nn.ModuleList([])

        for ind in range(depth):  # noqa: B007
            attn = Attention(dim, causal = causal, seq_len = seq_len, heads = heads, dim_head = dim_head, dropout = attn_dropout)

            ff = FeedForward(dim, mult = ff_mult, dropout = ff_dropout)

            layers.append(nn.ModuleList([
                PreNorm(dim, attn),
                PreNorm(dim, ff)
            ]))

        execute_type = SequentialSequence
        route_attn = ((True, False),) * depth
        attn_route_map = {'mask': route_attn}

        self.layers = execute_type(layers, args_route = attn_route_map)

    def forward(self, x, **kwargs):
        return self.layers(x, **kwargs)


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "lucidrains/DALLE-pytorch dalle_pytorch/attention.py @ 01a781efa0454c13e89f2b85210ee4d5a307e7b6"
REFERENCE = {"n_head": 4, "activation": "gelu"}
BLOCK = Transformer
ARGS = {"dim": 32, "depth": 1, "seq_len": 16, "causal": True, "heads": 4, "dim_head": 8, "ff_mult": 4}


def weights(b):
    (pa, pf), = b.layers.layers
    a, f = pa.fn, pf.fn.net
    q, k, v = a.to_qkv.weight.chunk(3)
    return {
        "ln1": (pa.norm.weight, pa.norm.bias),
        "q": (q, None),
        "k": (k, None),
        "v": (v, None),
        "proj": (a.to_out[0].weight, a.to_out[0].bias),
        "ln2": (pf.norm.weight, pf.norm.bias),
        "fc1": (f[0].weight, f[0].bias),
        "fc2": (f[3].weight, f[3].bias),
    }


DOTS = "dots = torch.einsum('b h i d, b h j d -> b h i j', q, k) * self.scale"
CAUSAL = "mask = torch.ones(i, j, device = device).triu_(j - i + 1).bool()"
FILL = "dots.masked_fill_(mask, mask_value)"
SOFTMAX = "attn = dots.softmax(dim=-1)"
MISTAKES = {
    "no_scaling": [(DOTS, "dots = torch.einsum('b h i d, b h j d -> b h i j', q, k)")],
    "wrong_scale": [("self.scale = dim_head ** -0.5", "self.scale = dim ** -0.5")],
    "wrong_scale:1/hs": [("self.scale = dim_head ** -0.5", "self.scale = dim_head ** -1")],
    "future_leak": [("attn = Attention(dim, causal = causal,", "attn = Attention(dim, causal = False,")],
    "mask_reversed": [(CAUSAL, "mask = torch.ones(i, j, device = device).tril_().bool()")],
    "mask_zero": [(FILL, "dots.masked_fill_(mask, 0.)")],
    "mask_after_softmax": [(FILL + "\n\n        " + SOFTMAX, SOFTMAX + "\n        attn = attn.masked_fill(mask, 0.)")],
    "softmax_dim": [(SOFTMAX, "attn = dots.softmax(dim=-2)")],
    "heads_mixed:merge": [("out = rearrange(out, 'b h n d -> b n (h d)')", "out = out.reshape(b, n, -1)")],
    "no_residual:attn": [("x = x + f(x, **f_args)", "x = f(x, **f_args)")],
    "no_residual:mlp": [("x = x + g(x, **g_args)", "x = g(x, **g_args)")],
    "shared_norm": [("                PreNorm(dim, ff)\n            ]))\n",
                     "                PreNorm(dim, ff)\n            ]))\n            layers[-1][1].norm = layers[-1][0].norm\n")],
    "post_norm": [
        ("x = x + f(x, **f_args)\n            x = x + g(x, **g_args)",
         "x = f.norm(x + f.fn(x, **f_args))\n            x = g.norm(x + g.fn(x, **g_args))"),
    ],
}
PAIRS = [("no_scaling", "no_residual:mlp")]
