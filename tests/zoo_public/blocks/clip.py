# Source: openai/CLIP, clip/model.py
#   commit ea41722f9fe6bb81189f41ab6c306e77e930c2af: LayerNorm, ResidualAttentionBlock,
#   Transformer, CLIP.build_attention_mask and encode_text's permutes.
# Kept: Transformer(width, layers, heads, attn_mask) as an nn.Sequential of
# ResidualAttentionBlock(d_model, n_head, attn_mask), each with nn.MultiheadAttention run
# sequence-first (NLD -> LND permutes around the stack, batch_first=False), the additive float
# mask built by fill_(-inf).triu_(1) and moved to x's dtype in attention(), ln_1 / ln_2, the MLP
# as nn.Sequential(OrderedDict(c_fc, gelu, c_proj)).
# Reduced: QuickGELU (x * sigmoid(1.702 x)) made nn.GELU(); the LayerNorm subclass's float32
# round trip dropped (it assumes float32 weights); the mask sliced to the sequence's length
# (CLIP always pads to its context length); layers=1.
from collections import OrderedDict

import torch
from torch import nn


class LayerNorm(nn.LayerNorm):
    """Subclass torch's LayerNorm to handle fp16."""

    def forward(self, x: torch.Tensor):
        orig_type = x.dtype
        ret = super().forward(x)
        return ret.type(orig_type)


class ResidualAttentionBlock(nn.Module):
    def __init__(self, d_model: int, n_head: int, attn_mask: torch.Tensor = None):
        super().__init__()

        self.attn = nn.MultiheadAttention(d_model, n_head)
        self.ln_1 = LayerNorm(d_model)
        self.mlp = nn.Sequential(
            OrderedDict(
                [
                    ("c_fc", nn.Linear(d_model, d_model * 4)),
                    ("gelu", nn.GELU()),
                    ("c_proj", nn.Linear(d_model * 4, d_model)),
                ]
            )
        )
        self.ln_2 = LayerNorm(d_model)
        self.attn_mask = attn_mask

    def attention(self, x: torch.Tensor):
        n = x.shape[0]
        self.attn_mask = self.attn_mask.to(dtype=x.dtype, device=x.device) if self.attn_mask is not None else None
        mask = self.attn_mask[:n, :n] if self.attn_mask is not None else None
        return self.attn(x, x, x, need_weights=False, attn_mask=mask)[0]

    def forward(self, x: torch.Tensor):
        x = x + self.attention(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


def build_attention_mask(context_length):
    # lazily create causal attention mask, with full attention between the vision tokens
    # pytorch uses additive attention mask; fill with -inf
    mask = torch.empty(context_length, context_length)
    mask.fill_(float("-inf"))
    mask.triu_(1)  # zero out the lower diagonal
    return mask


class Transformer(nn.Module):
    def __init__(self, width: int, layers: int, heads: int, attn_mask: torch.Tensor = None):
        super().__init__()
        self.width = width
        self.layers = layers
        self.resblocks = nn.Sequential(*[ResidualAttentionBlock(width, heads, attn_mask) for _ in range(layers)])

    def forward(self, x: torch.Tensor):
        x = x.permute(1, 0, 2)  # NLD -> LND
        x = self.resblocks(x)
        x = x.permute(1, 0, 2)  # LND -> NLD
        return x


# ----- the zoo's data (the checker never sees it) -----
from zoo_public.edits import residual  # noqa: E402

SOURCE = "openai/CLIP clip/model.py @ ea41722f9fe6bb81189f41ab6c306e77e930c2af"
REFERENCE = {"n_head": 4, "activation": "gelu"}
BLOCK = Transformer
ARGS = {"width": 32, "layers": 1, "heads": 4, "attn_mask": build_attention_mask(16)}


def weights(b):
    r = b.resblocks[0]
    q, k, v = r.attn.in_proj_weight.chunk(3)
    bq, bk, bv = r.attn.in_proj_bias.chunk(3)
    return {
        "ln1": (r.ln_1.weight, r.ln_1.bias),
        "q": (q, bq),
        "k": (k, bk),
        "v": (v, bv),
        "proj": (r.attn.out_proj.weight, r.attn.out_proj.bias),
        "ln2": (r.ln_2.weight, r.ln_2.bias),
        "fc1": (r.mlp.c_fc.weight, r.mlp.c_fc.bias),
        "fc2": (r.mlp.c_proj.weight, r.mlp.c_proj.bias),
    }


wiring = residual("self.attention", "self.ln_1", "self.mlp", "self.ln_2")
MISTAKES = {
    "future_leak": [("need_weights=False, attn_mask=mask)", "need_weights=False)")],
    "mask_reversed": [("mask.triu_(1)", "mask.tril_()")],
    "batch_mixing": [
        ("x = x.permute(1, 0, 2)  # NLD -> LND\n", "\n"),
        ("x = x.permute(1, 0, 2)  # LND -> NLD\n", "\n"),
    ],
    **{k: wiring[k] for k in ("post_norm", "no_residual:attn", "no_residual:mlp", "shared_norm", "inplace")},
}
PAIRS = [("mask_reversed", "post_norm"), ("batch_mixing", "no_residual:mlp")]
