# Source: facebookresearch/detr, models/transformer.py
#   commit 1d6a32809e9f37134dfc8fb9f792a9f131961788: TransformerEncoderLayer (forward_pre, with
#   normalize_before=True), _get_activation_fn.
# Kept: TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout, activation,
# normalize_before) with nn.MultiheadAttention(d_model, nhead, dropout) run sequence-first
# (batch_first=False), `q = k = self.with_pos_embed(src2, pos)`, self_attn(q, k, value=src2,
# attn_mask=src_mask, key_padding_mask=...)[0]; linear1 / dropout / linear2, norm1 / norm2,
# dropout1 / dropout2; the activation looked up by name (F.relu); forward dispatching to
# forward_pre / forward_post on normalize_before.
# Reduced: the layer takes (B, T, C) here and transposes to DETR's (T, B, C) and back (the zoo's
# blocks take (B, T, C)); DETR attends both ways: here the layer builds a causal bool mask
# (True = may not attend, torch.triu(..., diagonal=1)) when given no src_mask; no positional
# embedding passed (pos=None).
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class TransformerEncoderLayer(nn.Module):

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1,
                 activation="relu", normalize_before=False):
        super().__init__()
        self.self_attn = nn.MultiheadAttention(d_model, nhead, dropout=dropout)
        # Implementation of Feedforward model
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(dim_feedforward, d_model)

        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)

        self.activation = _get_activation_fn(activation)
        self.normalize_before = normalize_before

    def with_pos_embed(self, tensor, pos: Optional[Tensor]):
        return tensor if pos is None else tensor + pos

    def forward_post(self,
                     src,
                     src_mask: Optional[Tensor] = None,
                     src_key_padding_mask: Optional[Tensor] = None,
                     pos: Optional[Tensor] = None):
        q = k = self.with_pos_embed(src, pos)
        src2 = self.self_attn(q, k, value=src, attn_mask=src_mask,
                              key_padding_mask=src_key_padding_mask)[0]
        src = src + self.dropout1(src2)
        src = self.norm1(src)
        src2 = self.linear2(self.dropout(self.activation(self.linear1(src))))
        src = src + self.dropout2(src2)
        src = self.norm2(src)
        return src

    def forward_pre(self, src,
                    src_mask: Optional[Tensor] = None,
                    src_key_padding_mask: Optional[Tensor] = None,
                    pos: Optional[Tensor] = None):
        src2 = self.norm1(src)
        q = k = self.with_pos_embed(src2, pos)
        src2 = self.self_attn(q, k, value=src2, attn_mask=src_mask,
                              key_padding_mask=src_key_padding_mask)[0]
        src = src + self.dropout1(src2)
        src2 = self.norm2(src)
        src2 = self.linear2(self.dropout(self.activation(self.linear1(src2))))
        src = src + self.dropout2(src2)
        return src

    def forward(self, src,
                src_mask: Optional[Tensor] = None,
                src_key_padding_mask: Optional[Tensor] = None,
                pos: Optional[Tensor] = None):
        src = src.transpose(0, 1)  # (T, B, C), as DETR feeds its encoder
        if src_mask is None:
            T = src.shape[0]
            src_mask = torch.triu(torch.ones(T, T, dtype=torch.bool, device=src.device), diagonal=1)
        if self.normalize_before:
            out = self.forward_pre(src, src_mask, src_key_padding_mask, pos)
        else:
            out = self.forward_post(src, src_mask, src_key_padding_mask, pos)
        return out.transpose(0, 1)


def _get_activation_fn(activation):
    """Return an activation function given a string"""
    if activation == "relu":
        return F.relu
    if activation == "gelu":
        return F.gelu
    if activation == "glu":
        return F.glu
    raise RuntimeError(F"activation should be relu/gelu, not {activation}.")


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "facebookresearch/detr models/transformer.py @ 1d6a32809e9f37134dfc8fb9f792a9f131961788"
REFERENCE = {"n_head": 4, "activation": "relu"}
BLOCK = TransformerEncoderLayer
ARGS = {"d_model": 32, "nhead": 4, "dim_feedforward": 128, "dropout": 0.1, "activation": "relu", "normalize_before": True}


def weights(b):
    a = b.self_attn
    q, k, v = a.in_proj_weight.chunk(3)
    bq, bk, bv = a.in_proj_bias.chunk(3)
    return {
        "ln1": (b.norm1.weight, b.norm1.bias),
        "q": (q, bq),
        "k": (k, bk),
        "v": (v, bv),
        "proj": (a.out_proj.weight, a.out_proj.bias),
        "ln2": (b.norm2.weight, b.norm2.bias),
        "fc1": (b.linear1.weight, b.linear1.bias),
        "fc2": (b.linear2.weight, b.linear2.bias),
    }


PRE = '''        src2 = self.norm1(src)
        q = k = self.with_pos_embed(src2, pos)
        src2 = self.self_attn(q, k, value=src2, attn_mask=src_mask,
                              key_padding_mask=src_key_padding_mask)[0]
        src = src + self.dropout1(src2)
        src2 = self.norm2(src)
        src2 = self.linear2(self.dropout(self.activation(self.linear1(src2))))
        src = src + self.dropout2(src2)
        return src
'''
MASK = "src_mask = torch.triu(torch.ones(T, T, dtype=torch.bool, device=src.device), diagonal=1)"
MISTAKES = {
    "future_leak": [("        if src_mask is None:\n            T = src.shape[0]\n            " + MASK + "\n", "")],
    "mask_reversed": [(MASK, "src_mask = torch.tril(torch.ones(T, T, dtype=torch.bool, device=src.device))")],
    "batch_mixing": [("src = src.transpose(0, 1)  # (T, B, C), as DETR feeds its encoder", "pass  # (T, B, C), as DETR feeds its encoder"),
                     ("return out.transpose(0, 1)", "return out")],
    "no_residual:attn": [(PRE, PRE.replace("src = src + self.dropout1(src2)", "src = self.dropout1(src2)"))],
    "no_residual:mlp": [(PRE, PRE.replace("src = src + self.dropout2(src2)", "src = self.dropout2(src2)"))],
    "shared_norm": [(PRE, PRE.replace("src2 = self.norm2(src)", "src2 = self.norm1(src)"))],
    "post_norm": [("out = self.forward_pre(src, src_mask, src_key_padding_mask, pos)",
                   "out = self.forward_post(src, src_mask, src_key_padding_mask, pos)")],
    "inplace": [(PRE, PRE.replace("src = src + self.dropout1(src2)", "src += self.dropout1(src2)")
                      .replace("src = src + self.dropout2(src2)", "src += self.dropout2(src2)"))],
}
PAIRS = [("mask_reversed", "shared_norm")]
