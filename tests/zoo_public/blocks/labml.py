# Source: labmlai/annotated_deep_learning_paper_implementations,
#   labml_nn/transformers/mha.py commit 18298f68cfc79f8da910913463b3270ed3c7cf65
#   (PrepareForMultiHeadAttention, MultiHeadAttention), labml_nn/transformers/models.py
#   (TransformerLayer), feed_forward.py (FeedForward), utils.py (subsequent_mask), and
#   labml_helpers.module.Module.
# Kept: labml's Module, which lets a class define __call__ and moves it to forward; the
# sequence-first layout [seq_len, batch_size, d_model] throughout; query / key / value as
# PrepareForMultiHeadAttention modules (a Linear, then view(seq_len, batch_size, heads, d_k)),
# scores by einsum('ibhd,jbhd->ijbh') scaled in place (scores *= self.scale), the mask
# [seq_len, seq_len, batch] broadcast over heads and filled with -1e9 where it is 0, the softmax
# over dim=1 (the keys), einsum("ijbh,jbhd->ibhd"), TransformerLayer with norm_self_attn /
# norm_ff (nn.LayerNorm([d_model])) and x = x + dropout(...), FeedForward layer1 / ReLU / layer2.
# Reduced: no tracker.debug; a Block that hands TransformerLayer its [seq_len, batch] input and
# subsequent_mask, as labml's autoregressive model does; no source attention.
import math
from typing import Optional

import torch
from torch import nn as nn
from torch.nn import functional as F


class Module(torch.nn.Module):
    r"""
    Wraps ``torch.nn.Module`` to overload ``__call__`` instead of
    ``forward`` for better type checking.
    """

    def __init_subclass__(cls, **kwargs):
        if cls.__dict__.get("__call__", None) is None:
            return

        setattr(cls, "forward", cls.__dict__["__call__"])
        delattr(cls, "__call__")


def subsequent_mask(seq_len):
    """
    ## Subsequent mask to mask out data from future (subsequent) time steps
    """
    mask = torch.tril(torch.ones(seq_len, seq_len)).to(torch.bool).unsqueeze(-1)
    return mask


class PrepareForMultiHeadAttention(Module):
    def __init__(self, d_model: int, heads: int, d_k: int, bias: bool):
        super().__init__()
        self.linear = nn.Linear(d_model, heads * d_k, bias=bias)
        self.heads = heads
        self.d_k = d_k

    def __call__(self, x: torch.Tensor):
        seq_len, batch_size, _ = x.shape

        x = self.linear(x)
        x = x.view(seq_len, batch_size, self.heads, self.d_k)

        return x


class MultiHeadAttention(Module):
    def __init__(self, heads: int, d_model: int, dropout_prob: float = 0.1, bias: bool = True):
        super().__init__()
        self.d_k = d_model // heads
        self.heads = heads

        # These transformer the `query`, `key` and `value` vectors for multi-headed attention/
        self.query = PrepareForMultiHeadAttention(d_model, heads, self.d_k, bias)
        self.key = PrepareForMultiHeadAttention(d_model, heads, self.d_k, bias)
        self.value = PrepareForMultiHeadAttention(d_model, heads, self.d_k, bias)

        # Output layer
        self.output = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout_prob)
        self.scale = 1 / math.sqrt(self.d_k)

        # We store attentions so that it can used for logging, or other computations if needed
        self.attn = None

    def get_scores(self, query: torch.Tensor, key: torch.Tensor):
        """
        ### Calculate scores between queries and keys
        """
        return torch.einsum("ibhd,jbhd->ijbh", query, key)

    def __call__(
        self, *, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Optional[torch.Tensor] = None
    ):
        # `query`, `key` and `value`  have shape `[seq_len, batch_size, d_model]`
        seq_len, batch_size, _ = query.shape

        if mask is not None:
            # `mask` has shape `[seq_len, seq_len, batch_size]`,
            # where first dimension is the query dimension.
            assert mask.shape[0] == 1 or mask.shape[0] == mask.shape[1]

            # Same mask applied to all `h` heads.
            mask = mask.unsqueeze(-1)

        # Prepare `query`, `key` and `value` for attention computation
        # These will then have shape `[seq_len, batch_size, heads, d_k]`
        query = self.query(query)
        key = self.key(key)
        value = self.value(value)

        # Compute attention scores
        scores = self.get_scores(query, key)

        # Scale scores
        scores *= self.scale

        # Apply mask
        if mask is not None:
            scores = scores.masked_fill(mask == 0, -1e9)

        # $softmax$ attention
        attn = F.softmax(scores, dim=1)

        # Apply dropout
        attn = self.dropout(attn)

        # Calculate the attention results
        x = torch.einsum("ijbh,jbhd->ibhd", attn, value)

        # Save attentions for any other calculations
        self.attn = attn.detach()

        # Concatenate multiple heads
        x = x.reshape(seq_len, batch_size, -1)

        # Output layer
        return self.output(x)


class FeedForward(Module):
    def __init__(
        self,
        d_model: int,
        d_ff: int,
        dropout: float = 0.1,
        activation=nn.ReLU(),
        bias1: bool = True,
        bias2: bool = True,
    ):
        super().__init__()
        self.layer1 = nn.Linear(d_model, d_ff, bias=bias1)
        self.layer2 = nn.Linear(d_ff, d_model, bias=bias2)
        self.dropout = nn.Dropout(dropout)
        self.activation = activation

    def __call__(self, x: torch.Tensor):
        g = self.activation(self.layer1(x))
        x = g
        x = self.dropout(x)
        return self.layer2(x)


class TransformerLayer(Module):
    def __init__(self, *, d_model: int, self_attn: MultiHeadAttention, feed_forward: FeedForward, dropout_prob: float):
        super().__init__()
        self.size = d_model
        self.self_attn = self_attn
        self.feed_forward = feed_forward
        self.dropout = nn.Dropout(dropout_prob)
        self.norm_self_attn = nn.LayerNorm([d_model])
        self.norm_ff = nn.LayerNorm([d_model])

    def __call__(self, *, x: torch.Tensor, mask: torch.Tensor):
        # Normalize the vectors before doing self attention
        z = self.norm_self_attn(x)
        # Run through self attention, i.e. keys and values are from self
        self_attn = self.self_attn(query=z, key=z, value=z, mask=mask)
        # Add the self attention results
        x = x + self.dropout(self_attn)

        # Normalize for feed-forward
        z = self.norm_ff(x)
        # Pass through the feed-forward network
        ff = self.feed_forward(z)
        # Add the feed-forward results back
        x = x + self.dropout(ff)

        return x


class Block(Module):
    """One layer of an autoregressive labml transformer, given (B, T, C)."""

    def __init__(self, d_model: int, heads: int, d_ff: int, dropout: float = 0.1):
        super().__init__()
        self.layer = TransformerLayer(
            d_model=d_model,
            self_attn=MultiHeadAttention(heads, d_model, dropout),
            feed_forward=FeedForward(d_model, d_ff, dropout),
            dropout_prob=dropout,
        )

    def __call__(self, x: torch.Tensor):
        x = x.transpose(0, 1)  # [seq_len, batch_size, d_model]
        mask = subsequent_mask(len(x)).to(x.device)
        return self.layer(x=x, mask=mask).transpose(0, 1)


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "labmlai/annotated_deep_learning_paper_implementations labml_nn/transformers/mha.py @ 18298f68cfc79f8da910913463b3270ed3c7cf65 (+ models.py, feed_forward.py, utils.py)"
REFERENCE = {"n_head": 4, "activation": "relu"}
BLOCK = Block
ARGS = {"d_model": 32, "heads": 4, "d_ff": 128}


def weights(b):
    layer = b.layer
    a, f = layer.self_attn, layer.feed_forward
    return {
        "ln1": (layer.norm_self_attn.weight, layer.norm_self_attn.bias),
        "q": (a.query.linear.weight, a.query.linear.bias),
        "k": (a.key.linear.weight, a.key.linear.bias),
        "v": (a.value.linear.weight, a.value.linear.bias),
        "proj": (a.output.weight, a.output.bias),
        "ln2": (layer.norm_ff.weight, layer.norm_ff.bias),
        "fc1": (f.layer1.weight, f.layer1.bias),
        "fc2": (f.layer2.weight, f.layer2.bias),
    }


FILL = "scores = scores.masked_fill(mask == 0, -1e9)"
MISTAKES = {
    "no_scaling": [("scores *= self.scale\n", "\n")],
    "wrong_scale": [("self.scale = 1 / math.sqrt(self.d_k)", "self.scale = 1 / math.sqrt(d_model)")],
    "wrong_scale:1/hs": [("self.scale = 1 / math.sqrt(self.d_k)", "self.scale = 1 / self.d_k")],
    "future_leak": [
        ("return self.layer(x=x, mask=mask).transpose(0, 1)", "return self.layer(x=x, mask=None).transpose(0, 1)")
    ],
    "mask_zero": [(FILL, "scores = scores.masked_fill(mask == 0, 0.0)")],
    "mask_reversed": [(FILL, "scores = scores.masked_fill(mask, -1e9)")],
    "softmax_dim": [
        ("attn = F.softmax(scores, dim=1)", "attn = F.softmax(scores, dim=0)")
    ],  # dim=0 is the queries here
    "heads_mixed:order": [
        ('x = torch.einsum("ijbh,jbhd->ibhd", attn, value)', 'x = torch.einsum("ijbh,jbhd->ibdh", attn, value)')
    ],
    "batch_mixing": [
        ("x = x.transpose(0, 1)  # [seq_len, batch_size, d_model]\n", "\n"),
        ("return self.layer(x=x, mask=mask).transpose(0, 1)", "return self.layer(x=x, mask=mask)"),
    ],
    "no_residual:attn": [("x = x + self.dropout(self_attn)", "x = self.dropout(self_attn)")],
    "no_residual:mlp": [("x = x + self.dropout(ff)", "x = self.dropout(ff)")],
    "shared_norm": [("z = self.norm_ff(x)", "z = self.norm_self_attn(x)")],
    "post_norm": [
        ("z = self.norm_self_attn(x)\n", "z = x\n"),
        ("x = x + self.dropout(self_attn)", "x = self.norm_self_attn(x + self.dropout(self_attn))"),
        ("z = self.norm_ff(x)\n", "z = x\n"),
        ("x = x + self.dropout(ff)", "x = self.norm_ff(x + self.dropout(ff))"),
    ],
}
PAIRS = [("no_scaling", "post_norm"), ("softmax_dim", "no_residual:mlp")]
