# Source: facebookresearch/fairseq, fairseq/modules/multihead_attention.py
#   commit 806855bf660ea748ed7ffb42fe8dcc881ca3aca0 (MultiheadAttention) and
#   fairseq/modules/transformer_layer.py commit 374790c7394a0a598ff8e86fb480570ca45ec4af
#   (TransformerDecoderLayer, with buffered_future_mask from TransformerDecoder and
#   utils.fill_with_neg_inf / utils.softmax, fairseq/modules/fairseq_dropout.py FairseqDropout).
# Kept: the time-first layout (tgt_len, bsz, embed_dim), q_proj / k_proj / v_proj / out_proj, the
# queries scaled in place (q *= self.scaling) before heads are folded into the batch
# (view(tgt_len, bsz * num_heads, head_dim).transpose(0, 1)), bmm scores plus an additive future
# mask triu(fill_with_neg_inf(zeros), 1), utils.softmax in float32 cast back with type_as,
# FairseqDropout modules (with apply_during_inference), normalize_before choosing pre- or
# post-norm, residual_connection(x, residual), self_attn_layer_norm / final_layer_norm, fc1 /
# activation_fn / fc2, a layer built from an argparse-style `args`.
# Reduced: self-attention only (no encoder attention, incremental state, key padding,
# quant_noise or the F.multi_head_attention_forward fast path); a Block that hands the layer its
# time-first input and future mask, as TransformerDecoder does.
from argparse import Namespace

import torch
import torch.nn as nn
import torch.nn.functional as F


def fill_with_neg_inf(t):
    """FP16-compatible function that fills a tensor with -inf."""
    return t.float().fill_(float("-inf")).type_as(t)


def softmax(x, dim: int, onnx_trace: bool = False):
    if onnx_trace:
        return F.softmax(x.float(), dim=dim)
    else:
        return F.softmax(x, dim=dim, dtype=torch.float32)


class FairseqDropout(nn.Module):
    def __init__(self, p, module_name=None):
        super().__init__()
        self.p = p
        self.module_name = module_name
        self.apply_during_inference = False

    def forward(self, x, inplace: bool = False):
        if self.p > 0 and (self.training or self.apply_during_inference):
            return F.dropout(x, p=self.p, training=True, inplace=inplace)
        else:
            return x


class MultiheadAttention(nn.Module):
    """Multi-headed attention.

    See "Attention Is All You Need" for more details.
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, self_attention=False):
        super().__init__()
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.dropout_module = FairseqDropout(dropout, module_name=self.__class__.__name__)

        self.head_dim = embed_dim // num_heads
        assert self.head_dim * num_heads == self.embed_dim, "embed_dim must be divisible by num_heads"
        self.scaling = self.head_dim**-0.5

        self.self_attention = self_attention

        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)

        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.onnx_trace = False

    def forward(self, query, key, value, need_weights: bool = True, attn_mask=None):
        tgt_len, bsz, embed_dim = query.size()
        assert embed_dim == self.embed_dim

        if self.self_attention:
            q = self.q_proj(query)
            k = self.k_proj(query)
            v = self.v_proj(query)
        else:
            q = self.q_proj(query)
            k = self.k_proj(key)
            v = self.v_proj(value)
        q *= self.scaling

        q = q.contiguous().view(tgt_len, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        k = k.contiguous().view(-1, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        v = v.contiguous().view(-1, bsz * self.num_heads, self.head_dim).transpose(0, 1)

        src_len = k.size(1)

        attn_weights = torch.bmm(q, k.transpose(1, 2))

        assert list(attn_weights.size()) == [bsz * self.num_heads, tgt_len, src_len]

        if attn_mask is not None:
            attn_mask = attn_mask.unsqueeze(0)
            attn_weights += attn_mask

        attn_weights_float = softmax(attn_weights, dim=-1, onnx_trace=self.onnx_trace)
        attn_weights = attn_weights_float.type_as(attn_weights)
        attn_probs = self.dropout_module(attn_weights)

        attn = torch.bmm(attn_probs, v)
        assert list(attn.size()) == [bsz * self.num_heads, tgt_len, self.head_dim]
        attn = attn.transpose(0, 1).contiguous().view(tgt_len, bsz, embed_dim)
        attn = self.out_proj(attn)
        return attn, None


class TransformerDecoderLayer(nn.Module):
    """Decoder layer block (self-attention part).

    In the original paper each operation (multi-head attention, encoder
    attention or FFN) is postprocessed with: `dropout -> add residual ->
    layernorm`. In the tensor2tensor code they suggest that learning is more
    robust when preprocessing each layer with layernorm and postprocessing with:
    `dropout -> add residual`. We default to the approach in the paper, but the
    tensor2tensor approach can be enabled by setting
    *args.decoder_normalize_before* to ``True``.
    """

    def __init__(self, args):
        super().__init__()
        self.embed_dim = args.decoder_embed_dim
        self.dropout_module = FairseqDropout(args.dropout, module_name=self.__class__.__name__)

        self.self_attn = MultiheadAttention(
            self.embed_dim, args.decoder_attention_heads, dropout=args.attention_dropout, self_attention=True
        )

        self.activation_fn = F.relu
        self.activation_dropout_module = FairseqDropout(
            float(args.activation_dropout), module_name=self.__class__.__name__
        )
        self.normalize_before = args.decoder_normalize_before

        self.self_attn_layer_norm = nn.LayerNorm(self.embed_dim)

        self.fc1 = nn.Linear(self.embed_dim, args.decoder_ffn_embed_dim)
        self.fc2 = nn.Linear(args.decoder_ffn_embed_dim, self.embed_dim)

        self.final_layer_norm = nn.LayerNorm(self.embed_dim)

    def residual_connection(self, x, residual):
        return residual + x

    def forward(self, x, self_attn_mask=None):
        residual = x
        if self.normalize_before:
            x = self.self_attn_layer_norm(x)
        x, attn = self.self_attn(query=x, key=x, value=x, need_weights=False, attn_mask=self_attn_mask)
        x = self.dropout_module(x)
        x = self.residual_connection(x, residual)
        if not self.normalize_before:
            x = self.self_attn_layer_norm(x)

        residual = x
        if self.normalize_before:
            x = self.final_layer_norm(x)

        x = self.activation_fn(self.fc1(x))
        x = self.activation_dropout_module(x)
        x = self.fc2(x)
        x = self.dropout_module(x)
        x = self.residual_connection(x, residual)
        if not self.normalize_before:
            x = self.final_layer_norm(x)
        return x, attn, None


class Block(nn.Module):
    """One decoder layer run as TransformerDecoder.extract_features runs it."""

    def __init__(self, args):
        super().__init__()
        self.layer = TransformerDecoderLayer(args)

    def buffered_future_mask(self, tensor):
        dim = tensor.size(0)
        return torch.triu(fill_with_neg_inf(torch.zeros([dim, dim])), 1).to(tensor)

    def forward(self, x):
        # B x T x C -> T x B x C
        x = x.transpose(0, 1)
        self_attn_mask = self.buffered_future_mask(x)
        x, layer_attn, _ = self.layer(x, self_attn_mask=self_attn_mask)
        # T x B x C -> B x T x C
        x = x.transpose(0, 1)
        return x


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "facebookresearch/fairseq fairseq/modules/multihead_attention.py @ 806855bf660ea748ed7ffb42fe8dcc881ca3aca0 (+ transformer_layer.py @ 374790c7394a0a598ff8e86fb480570ca45ec4af)"
REFERENCE = {"n_head": 4, "activation": "relu"}
BLOCK = Block
ARGS = {
    "args": Namespace(
        decoder_embed_dim=32, decoder_attention_heads=4, decoder_ffn_embed_dim=128, decoder_normalize_before=True,
        dropout=0.1, attention_dropout=0.1, activation_dropout=0.1,
    )
}  # fmt: skip
TOLERANCE = 1e-6  # utils.softmax runs in float32, as fairseq's does


def weights(b):
    layer = b.layer
    a = layer.self_attn
    return {
        "ln1": (layer.self_attn_layer_norm.weight, layer.self_attn_layer_norm.bias),
        "q": (a.q_proj.weight, a.q_proj.bias),
        "k": (a.k_proj.weight, a.k_proj.bias),
        "v": (a.v_proj.weight, a.v_proj.bias),
        "proj": (a.out_proj.weight, a.out_proj.bias),
        "ln2": (layer.final_layer_norm.weight, layer.final_layer_norm.bias),
        "fc1": (layer.fc1.weight, layer.fc1.bias),
        "fc2": (layer.fc2.weight, layer.fc2.bias),
    }


MISTAKES = {
    "no_scaling": [("        q *= self.scaling\n", "")],
    "wrong_scale": [("self.scaling = self.head_dim**-0.5", "self.scaling = embed_dim**-0.5")],
    "wrong_scale:sqrt": [("self.scaling = self.head_dim**-0.5", "self.scaling = self.head_dim**0.5")],
    "future_leak": [
        ("x, layer_attn, _ = self.layer(x, self_attn_mask=self_attn_mask)", "x, layer_attn, _ = self.layer(x)")
    ],
    "mask_reversed": [
        (
            "return torch.triu(fill_with_neg_inf(torch.zeros([dim, dim])), 1).to(tensor)",
            "return torch.tril(fill_with_neg_inf(torch.zeros([dim, dim]))).to(tensor)",
        )
    ],
    "softmax_dim": [
        (
            "attn_weights_float = softmax(attn_weights, dim=-1, onnx_trace=self.onnx_trace)",
            "attn_weights_float = softmax(attn_weights, dim=1, onnx_trace=self.onnx_trace)",
        )
    ],
    "batch_mixing": [
        ("        x = x.transpose(0, 1)\n        self_attn_mask", "        self_attn_mask"),
        ("        # T x B x C -> B x T x C\n        x = x.transpose(0, 1)\n", ""),
    ],
    "post_norm": [
        ("self.normalize_before = args.decoder_normalize_before", "self.normalize_before = False")
    ],  # fairseq's default
    "no_residual:attn": [
        (
            "x = self.dropout_module(x)\n        x = self.residual_connection(x, residual)\n        if not self.normalize_before:\n            x = self.self_attn_layer_norm(x)",
            "x = self.dropout_module(x)\n        if not self.normalize_before:\n            x = self.self_attn_layer_norm(x)",
        )
    ],
    "no_residual:mlp": [
        (
            "x = self.dropout_module(x)\n        x = self.residual_connection(x, residual)\n        if not self.normalize_before:\n            x = self.final_layer_norm(x)",
            "x = self.dropout_module(x)\n        if not self.normalize_before:\n            x = self.final_layer_norm(x)",
        )
    ],
    "shared_norm": [
        (
            "        if self.normalize_before:\n            x = self.final_layer_norm(x)\n",
            "        if self.normalize_before:\n            x = self.self_attn_layer_norm(x)\n",
        )
    ],
    "dropout_in_eval": [("self.apply_during_inference = False", "self.apply_during_inference = True")],
}
PAIRS = [("no_scaling", "post_norm"), ("batch_mixing", "shared_norm")]
