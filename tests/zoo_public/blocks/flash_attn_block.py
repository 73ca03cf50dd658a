# Source: Dao-AILab/flash-attention, flash_attn/modules/block.py
#   commit 3889ba168b2fc0149fb77de1ffdadb478da15e1a (Block); flash_attn/modules/mha.py (MHA,
#   SelfAttention), flash_attn/modules/mlp.py (Mlp), flash_attn/models/gpt.py (create_block and
#   how GPTModel.forward runs the blocks).
# Kept: the Block that returns (hidden_states, residual) and adds the residual at the start of
# the *next* block ("Dropout -> Add -> LN -> MHA -> Dropout -> Add -> LN -> MLP"), its prenorm
# switch and post-norm path, mixer_cls / mlp_cls partials, MHA's Wqkv rearranged
# '(three h d) -> three h d' and unbound, SelfAttention's einsum 'bthd,bshd->bhts' with k scaled
# by softmax_scale, the causal mask triu(full(-10000.0), 1) *added* to the scores, the softmax in
# v's dtype, einsum 'bhts,bshd->bthd', Mlp fc1 / gelu(approximate="tanh") / fc2.
# Reduced: the non-fused, non-flash paths (use_flash_attn=False, fused_dropout_add_ln=False, no
# rotary, no kv cache, no tensor parallelism); StochasticDepth(p=0) as nn.Identity; einops'
# '...' written out; a GPTLayer that runs one block and the add that the next block (or the
# model's end) performs, as GPTModel.forward does.
import math
from functools import partial

import torch
import torch.nn as nn
import torch.nn.functional as F

from zoo_public.einops_lite import rearrange


class SelfAttention(nn.Module):
    """Implement the scaled dot product attention with softmax.
    Arguments
    ---------
        softmax_scale: The temperature to use for the softmax attention.
                      (default: 1/sqrt(d_keys) where d_keys is computed at
                      runtime)
        attention_dropout: The dropout rate to apply to the attention
                           (default: 0.0)
    """

    def __init__(self, causal=False, softmax_scale=None, attention_dropout=0.0):
        super().__init__()
        self.causal = causal
        self.softmax_scale = softmax_scale
        self.drop = nn.Dropout(attention_dropout)

    def forward(self, qkv, causal=None):
        batch_size, seqlen = qkv.shape[0], qkv.shape[1]
        causal = self.causal if causal is None else causal
        q, k, v = qkv.unbind(dim=2)
        softmax_scale = self.softmax_scale or 1.0 / math.sqrt(q.shape[-1])
        scores = torch.einsum("bthd,bshd->bhts", q, k * softmax_scale)
        if causal:
            # "triu_tril_cuda_template" not implemented for 'BFloat16'
            # So we have to construct the mask in float
            causal_mask = torch.triu(torch.full((seqlen, seqlen), -10000.0, device=scores.device), 1)
            # TD [2022-09-30]: Adding is faster than masked_fill_ (idk why, just better kernel I guess)
            scores = scores + causal_mask.to(dtype=scores.dtype)
        attention = torch.softmax(scores, dim=-1, dtype=v.dtype)
        attention_drop = self.drop(attention)
        output = torch.einsum("bhts,bshd->bthd", attention_drop, v)
        return output


class MHA(nn.Module):
    """Multi-head self-attention and cross-attention"""

    def __init__(
        self,
        embed_dim,
        num_heads,
        qkv_proj_bias=True,
        out_proj_bias=True,
        dropout=0.0,
        softmax_scale=None,
        causal=False,
        layer_idx=None,
    ):
        super().__init__()
        self.embed_dim = embed_dim
        self.causal = causal
        self.layer_idx = layer_idx
        self.num_heads = num_heads
        assert self.embed_dim % num_heads == 0, "embed_dim must be divisible by num_heads"
        self.head_dim = self.embed_dim // num_heads
        qkv_dim = self.head_dim * (self.num_heads + 2 * self.num_heads)

        self.Wqkv = nn.Linear(embed_dim, qkv_dim, bias=qkv_proj_bias)
        self.inner_attn = SelfAttention(causal=causal, softmax_scale=softmax_scale, attention_dropout=dropout)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=out_proj_bias)

    def forward(self, x):
        qkv = self.Wqkv(x)
        qkv = rearrange(qkv, "b s (three h d) -> b s three h d", three=3, d=self.head_dim)
        context = self.inner_attn(qkv)
        out = self.out_proj(rearrange(context, "b s h d -> b s (h d)"))
        return out


class Mlp(nn.Module):
    def __init__(
        self, in_features, hidden_features=None, out_features=None, activation=F.gelu, bias1=True, bias2=True
    ):
        super().__init__()
        out_features = out_features if out_features is not None else in_features
        hidden_features = hidden_features if hidden_features is not None else in_features * 4
        self.fc1 = nn.Linear(in_features, hidden_features, bias=bias1)
        self.activation = activation
        self.fc2 = nn.Linear(hidden_features, out_features, bias=bias2)

    def forward(self, x):
        y = self.fc1(x)
        y = self.activation(y)
        y = self.fc2(y)
        return y


class Block(nn.Module):
    def __init__(
        self,
        dim,
        mixer_cls=None,
        mlp_cls=None,
        norm_cls=nn.LayerNorm,
        dropout_cls=nn.Dropout,
        prenorm=True,
        resid_dropout1=0.0,
        resid_dropout2=0.0,
    ):
        """
        For prenorm=True, this Block has a slightly different structure compared to a regular
        prenorm Transformer block.
        The standard block is: LN -> MHA -> Dropout -> Add -> LN -> MLP -> Dropout -> Add.
        [Ref: https://arxiv.org/abs/2002.04745]
        Here we have: Dropout -> Add -> LN -> MHA -> Dropout -> Add -> LN -> MLP, returning both
        the hidden_states (output of the MLP) and the residual.
        This is for performance reasons, as we can fuse the dropout, add and LayerNorm.
        The residual needs to be provided (except for the very first block).

        For prenorm=False, this Block has the same structure as a regular postnorm Transformer
        block: MHA -> Dropout -> Add -> LN -> MLP -> Dropout -> Add -> LN.
        """
        super().__init__()
        self.prenorm = prenorm
        if mixer_cls is None:
            mixer_cls = partial(MHA, num_heads=dim // 64)
        if mlp_cls is None:
            mlp_cls = partial(Mlp, hidden_features=4 * dim)
        self.mixer = mixer_cls(dim)
        self.dropout1 = dropout_cls(resid_dropout1)
        self.drop_path1 = nn.Identity()  # StochasticDepth(drop_path1=0.0, mode="row")
        self.norm1 = norm_cls(dim)
        self.mlp = mlp_cls(dim)
        self.dropout2 = dropout_cls(resid_dropout2)
        self.drop_path2 = nn.Identity()  # StochasticDepth(drop_path2=0.0, mode="row")
        self.norm2 = norm_cls(dim)

    def forward(self, hidden_states, residual=None):
        if self.prenorm:
            dropped = self.drop_path1(self.dropout1(hidden_states))
            residual = (dropped + residual) if residual is not None else dropped
            hidden_states = self.norm1(residual.to(dtype=self.norm1.weight.dtype))
            hidden_states = self.mixer(hidden_states)
            dropped = self.drop_path2(self.dropout2(hidden_states))
            residual = (dropped + residual) if residual is not None else dropped
            hidden_states = self.norm2(residual.to(dtype=self.norm2.weight.dtype))
            hidden_states = self.mlp(hidden_states)
            return hidden_states, residual
        else:
            assert residual is None
            mixer_out = self.mixer(hidden_states)
            hidden_states = self.norm1(
                (self.drop_path1(self.dropout1(mixer_out)) + hidden_states).to(dtype=self.norm1.weight.dtype)
            )
            mlp_out = self.mlp(hidden_states)
            hidden_states = self.norm2(
                (self.drop_path2(self.dropout2(mlp_out)) + hidden_states).to(dtype=self.norm2.weight.dtype)
            )
            return hidden_states


def create_block(d_model, num_heads, resid_dropout1=0.0, resid_dropout2=0.0, layer_idx=None):
    mixer_cls = partial(MHA, num_heads=num_heads, causal=True, layer_idx=layer_idx)
    mlp_cls = partial(Mlp, hidden_features=4 * d_model, activation=partial(F.gelu, approximate="tanh"))
    block = Block(
        d_model, mixer_cls, mlp_cls, prenorm=True, resid_dropout1=resid_dropout1, resid_dropout2=resid_dropout2
    )
    block.layer_idx = layer_idx
    return block


class GPTLayer(nn.Module):
    """One block of GPTModel, with the add the next block (or the model's end) performs."""

    def __init__(self, d_model, num_heads, resid_pdrop=0.1):
        super().__init__()
        self.block = create_block(
            d_model, num_heads, resid_dropout1=resid_pdrop, resid_dropout2=resid_pdrop, layer_idx=0
        )

    def forward(self, hidden_states):
        if not self.block.prenorm:
            return self.block(hidden_states)
        hidden_states, residual = self.block(hidden_states, None)
        return hidden_states + residual


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "Dao-AILab/flash-attention flash_attn/modules/block.py @ 3889ba168b2fc0149fb77de1ffdadb478da15e1a (+ mha.py, mlp.py, models/gpt.py)"
REFERENCE = {"n_head": 4, "activation": "gelu_tanh"}
BLOCK = GPTLayer
ARGS = {"d_model": 32, "num_heads": 4}


def weights(layer):
    b = layer.block
    q, k, v = b.mixer.Wqkv.weight.chunk(3)  # (three h d): thirds, then heads
    bq, bk, bv = b.mixer.Wqkv.bias.chunk(3)
    return {
        "ln1": (b.norm1.weight, b.norm1.bias),
        "q": (q, bq),
        "k": (k, bk),
        "v": (v, bv),
        "proj": (b.mixer.out_proj.weight, b.mixer.out_proj.bias),
        "ln2": (b.norm2.weight, b.norm2.bias),
        "fc1": (b.mlp.fc1.weight, b.mlp.fc1.bias),
        "fc2": (b.mlp.fc2.weight, b.mlp.fc2.bias),
    }


SCALE = "softmax_scale = self.softmax_scale or 1.0 / math.sqrt(q.shape[-1])"
RESIDUAL2 = "dropped = self.drop_path2(self.dropout2(hidden_states))\n            residual = (dropped + residual) if residual is not None else dropped"
MISTAKES = {
    "no_scaling": [(SCALE, "softmax_scale = self.softmax_scale or 1.0")],
    "wrong_scale": [(SCALE, "softmax_scale = self.softmax_scale or 1.0 / math.sqrt(q.shape[-1] * q.shape[-2])")],
    "wrong_scale:sqrt": [(SCALE, "softmax_scale = self.softmax_scale or math.sqrt(q.shape[-1])")],
    "future_leak": [
        (
            "mixer_cls = partial(MHA, num_heads=num_heads, causal=True, layer_idx=layer_idx)",
            "mixer_cls = partial(MHA, num_heads=num_heads, layer_idx=layer_idx)",
        )
    ],  # MHA's default
    "mask_reversed": [
        (
            "causal_mask = torch.triu(torch.full((seqlen, seqlen), -10000.0, device=scores.device), 1)",
            "causal_mask = torch.tril(torch.full((seqlen, seqlen), -10000.0, device=scores.device))",
        )
    ],
    "softmax_dim": [
        (
            "attention = torch.softmax(scores, dim=-1, dtype=v.dtype)",
            "attention = torch.softmax(scores, dim=-2, dtype=v.dtype)",
        )
    ],
    "heads_mixed:order": [
        (
            'out = self.out_proj(rearrange(context, "b s h d -> b s (h d)"))',
            'out = self.out_proj(rearrange(context, "b s h d -> b s (d h)"))',
        )
    ],
    "post_norm": [
        ("mlp_cls, prenorm=True, resid_dropout1", "mlp_cls, prenorm=False, resid_dropout1")
    ],  # the Block's own path
    "no_residual:attn": [
        (RESIDUAL2, "dropped = self.drop_path2(self.dropout2(hidden_states))\n            residual = dropped")
    ],
    "no_residual:mlp": [("return hidden_states + residual", "return hidden_states")],
    "shared_norm": [
        (
            "hidden_states = self.norm2(residual.to(dtype=self.norm2.weight.dtype))",
            "hidden_states = self.norm1(residual.to(dtype=self.norm1.weight.dtype))",
        )
    ],
}
PAIRS = [("no_scaling", "post_norm"), ("future_leak", "no_residual:mlp")]
