# Source: The-AI-Summer/self-attention-cv, self_attention_cv/transformer_vanilla/mhsa.py
#   commit 1c9bf6c091da998fbe84b4cfe4b8f17adf8c5c58 (MultiHeadSelfAttention) and
#   transformer_block.py commit 0b9d3e4e136c534a8022067c31c30d7133835f7a (TransformerBlock).
# Kept: to_qvk packed channel-interleaved, rearrange(qkv, 'b t (d k h ) -> k b h t d ', k=3,
# h=heads): channel d * 3 * heads + k * heads + h holds dimension d of head h of q (k=0), k or v,
# so neither thirds nor per-head blocks; bias-free to_qvk and W_0; einsum scores times
# scale_factor; a bool mask (True = masked) filled with -np.inf; the heads merged back with
# rearrange 'b h t d -> b t (h d)'; TransformerBlock(dim, heads, dim_head, dim_linear_block,
# dropout, activation, mhsa, prenorm) with its prenorm switch and the MLP as nn.Sequential.
# Reduced: prenorm=True (the source defaults to post-norm: this zoo's post_norm); the block
# builds the causal mask when given none (the source attends both ways); `x.dim_head()` in the
# assert made `x.dim()`; einops' rearrange as tests/zoo_public/einops_lite.
import numpy as np
import torch
from torch import nn

from zoo_public.einops_lite import rearrange


class MultiHeadSelfAttention(nn.Module):
    def __init__(self, dim, heads=8, dim_head=None):
        """
        Implementation of multi-head attention layer of the original transformer model.
        einsum and einops.rearrange is used whenever possible
        Args:
            dim: token's dimension, i.e. word embedding vector size
            heads: the number of distinct representations to learn
            dim_head: the dim of the head. In general dim_head<dim.
            However, it may not necessary be (dim/heads)
        """
        super().__init__()
        self.dim_head = (int(dim / heads)) if dim_head is None else dim_head
        _dim = self.dim_head * heads
        self.heads = heads
        self.to_qvk = nn.Linear(dim, _dim * 3, bias=False)
        self.W_0 = nn.Linear(_dim, dim, bias=False)
        self.scale_factor = self.dim_head**-0.5

    def forward(self, x, mask=None):
        assert x.dim() == 3
        qkv = self.to_qvk(x)  # [batch, tokens, dim*3*heads ]

        # decomposition to q,v,k and cast to tuple
        # the resulted shape before casting to tuple will be: [3, batch, heads, tokens, dim_head]
        q, k, v = tuple(rearrange(qkv, "b t (d k h ) -> k b h t d ", k=3, h=self.heads))

        # resulted shape will be: [batch, heads, tokens, tokens]
        scaled_dot_prod = torch.einsum("b h i d , b h j d -> b h i j", q, k) * self.scale_factor

        if mask is not None:
            assert mask.shape == scaled_dot_prod.shape[2:]
            scaled_dot_prod = scaled_dot_prod.masked_fill(mask, -np.inf)

        attention = torch.softmax(scaled_dot_prod, dim=-1)
        # calc result per head
        out = torch.einsum("b h i j , b h j d -> b h i d", attention, v)
        # re-compose: merge heads with dim_head
        out = rearrange(out, "b h t d -> b t (h d)")
        # Apply final linear transformation layer
        return self.W_0(out)


class TransformerBlock(nn.Module):
    """
    Vanilla transformer block from the original paper "Attention is all you need"
    Detailed analysis: https://theaisummer.com/transformer/
    """

    def __init__(
        self,
        dim,
        heads=8,
        dim_head=None,
        dim_linear_block=1024,
        dropout=0.1,
        activation=nn.GELU,
        mhsa=None,
        prenorm=True,
    ):
        """
        Args:
            dim: token's vector length
            heads: number of heads
            dim_head: if none dim/heads is used
            dim_linear_block: the inner projection dim
            dropout: probability of droppping values
            mhsa: if provided you can change the vanilla self-attention block
            prenorm: if the layer norm will be applied before the mhsa or after
        """
        super().__init__()
        self.mhsa = mhsa if mhsa is not None else MultiHeadSelfAttention(dim=dim, heads=heads, dim_head=dim_head)
        self.prenorm = prenorm
        self.drop = nn.Dropout(dropout)
        self.norm_1 = nn.LayerNorm(dim)
        self.norm_2 = nn.LayerNorm(dim)

        self.linear = nn.Sequential(
            nn.Linear(dim, dim_linear_block),
            activation(),  # nn.ReLU or nn.GELU
            nn.Dropout(dropout),
            nn.Linear(dim_linear_block, dim),
            nn.Dropout(dropout),
        )

    def forward(self, x, mask=None):
        if mask is None:  # causal: True above the diagonal (masked)
            mask = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool, device=x.device).triu(1)
        if self.prenorm:
            y = self.drop(self.mhsa(self.norm_1(x), mask)) + x
            out = self.linear(self.norm_2(y)) + y
        else:
            y = self.norm_1(self.drop(self.mhsa(x, mask)) + x)
            out = self.norm_2(self.linear(y) + y)
        return out


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "The-AI-Summer/self-attention-cv self_attention_cv/transformer_vanilla/mhsa.py @ 1c9bf6c091da998fbe84b4cfe4b8f17adf8c5c58 (+ transformer_block.py @ 0b9d3e4e136c534a8022067c31c30d7133835f7a)"
REFERENCE = {"n_head": 4, "activation": "gelu"}
BLOCK = TransformerBlock
ARGS = {"dim": 32, "heads": 4, "dim_linear_block": 128, "dropout": 0.1}


def weights(b):
    a, f = b.mhsa, b.linear
    nh, hs = a.heads, a.dim_head
    W = a.to_qvk.weight.view(hs, 3, nh, -1)  # channel (d, k, h): d outermost, h innermost

    def role(k):  # rows in head-major order: head h, dimension d
        return W[:, k].permute(1, 0, 2).reshape(nh * hs, -1), None

    return {
        "ln1": (b.norm_1.weight, b.norm_1.bias),
        "q": role(0),
        "k": role(1),
        "v": role(2),
        "proj": (a.W_0.weight, None),
        "ln2": (b.norm_2.weight, b.norm_2.bias),
        "fc1": (f[0].weight, f[0].bias),
        "fc2": (f[3].weight, f[3].bias),
    }


MISTAKES = {
    "no_scaling": [(" q, k) * self.scale_factor", " q, k)")],
    "wrong_scale": [("self.scale_factor = self.dim_head**-0.5", "self.scale_factor = dim**-0.5")],
    "wrong_scale:1/hs": [("self.scale_factor = self.dim_head**-0.5", "self.scale_factor = self.dim_head**-1")],
    "future_leak": [
        (
            "mask = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool, device=x.device).triu(1)",
            "mask = torch.zeros(x.shape[1], x.shape[1], dtype=torch.bool, device=x.device)",
        )
    ],
    "mask_reversed": [(".triu(1)\n", ".tril()\n")],
    "softmax_dim": [
        ("attention = torch.softmax(scaled_dot_prod, dim=-1)", "attention = torch.softmax(scaled_dot_prod, dim=-2)")
    ],
    "heads_mixed:order": [
        ('out = rearrange(out, "b h t d -> b t (h d)")', 'out = rearrange(out, "b h t d -> b t (d h)")')
    ],
    "post_norm": [("self.prenorm = prenorm", "self.prenorm = False")],  # the source's default
    "no_residual:attn": [
        ("y = self.drop(self.mhsa(self.norm_1(x), mask)) + x", "y = self.drop(self.mhsa(self.norm_1(x), mask))")
    ],
    "no_residual:mlp": [("out = self.linear(self.norm_2(y)) + y", "out = self.linear(self.norm_2(y))")],
    "shared_norm": [("out = self.linear(self.norm_2(y)) + y", "out = self.linear(self.norm_1(y)) + y")],
}
PAIRS = [("no_scaling", "post_norm"), ("mask_reversed", "no_residual:mlp")]
