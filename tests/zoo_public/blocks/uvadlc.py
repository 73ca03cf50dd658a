# Source: phlippe/uvadlc_notebooks, docs/tutorial_notebooks/tutorial6/Transformers_and_MHAttention.ipynb
#   commit e8bb899039e43a87ca3790545ac1387be6184f92 (UvA Deep Learning course, tutorial 6):
#   scaled_dot_product, expand_mask, MultiheadAttention, EncoderBlock.
# Kept: the module-level scaled_dot_product(q, k, v, mask) filling mask == 0 with -9e15,
# MultiheadAttention(input_dim, embed_dim, num_heads) with one qkv_proj whose output is packed
# per head (reshape(batch, seq, num_heads, 3 * head_dim), permute, then chunk(3, dim=-1): q_h,
# k_h, v_h side by side for each head), xavier init in _reset_parameters, expand_mask,
# EncoderBlock(input_dim, num_heads, dim_feedforward, dropout) with linear_net =
# Sequential(Linear, Dropout, ReLU(inplace=True), Linear), norm1 / norm2, self.dropout.
# Reduced: the tutorial's block is post-norm (x = norm1(x + dropout(attn_out))): here pre-norm;
# it attends both ways unless given a mask: here it builds the causal one (tril) itself.
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def scaled_dot_product(q, k, v, mask=None):
    d_k = q.size()[-1]
    attn_logits = torch.matmul(q, k.transpose(-2, -1))
    attn_logits = attn_logits / math.sqrt(d_k)
    if mask is not None:
        attn_logits = attn_logits.masked_fill(mask == 0, -9e15)
    attention = F.softmax(attn_logits, dim=-1)
    values = torch.matmul(attention, v)
    return values, attention


def expand_mask(mask):
    assert mask.ndim >= 2, "Mask must be at least 2-dimensional with seq_length x seq_length"
    if mask.ndim == 3:
        mask = mask.unsqueeze(1)
    while mask.ndim < 4:
        mask = mask.unsqueeze(0)
    return mask


class MultiheadAttention(nn.Module):
    def __init__(self, input_dim, embed_dim, num_heads):
        super().__init__()
        assert embed_dim % num_heads == 0, "Embedding dimension must be 0 modulo number of heads."

        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads

        # Stack all weight matrices 1...h together for efficiency
        # Note that in many implementations you see "bias=False" which is optional
        self.qkv_proj = nn.Linear(input_dim, 3 * embed_dim)
        self.o_proj = nn.Linear(embed_dim, embed_dim)

        self._reset_parameters()

    def _reset_parameters(self):
        # Original Transformer initialization, see PyTorch documentation
        nn.init.xavier_uniform_(self.qkv_proj.weight)
        self.qkv_proj.bias.data.fill_(0)
        nn.init.xavier_uniform_(self.o_proj.weight)
        self.o_proj.bias.data.fill_(0)

    def forward(self, x, mask=None, return_attention=False):
        batch_size, seq_length, _ = x.size()
        if mask is not None:
            mask = expand_mask(mask)
        qkv = self.qkv_proj(x)

        # Separate Q, K, V from linear output
        qkv = qkv.reshape(batch_size, seq_length, self.num_heads, 3 * self.head_dim)
        qkv = qkv.permute(0, 2, 1, 3)  # [Batch, Head, SeqLen, Dims]
        q, k, v = qkv.chunk(3, dim=-1)

        # Determine value outputs
        values, attention = scaled_dot_product(q, k, v, mask=mask)
        values = values.permute(0, 2, 1, 3)  # [Batch, SeqLen, Head, Dims]
        values = values.reshape(batch_size, seq_length, self.embed_dim)
        o = self.o_proj(values)

        if return_attention:
            return o, attention
        else:
            return o


class EncoderBlock(nn.Module):
    def __init__(self, input_dim, num_heads, dim_feedforward, dropout=0.0):
        """
        Inputs:
            input_dim - Dimensionality of the input
            num_heads - Number of heads to use in the attention block
            dim_feedforward - Dimensionality of the hidden layer in the MLP
            dropout - Dropout probability to use in the dropout layers
        """
        super().__init__()

        # Attention layer
        self.self_attn = MultiheadAttention(input_dim, input_dim, num_heads)

        # Two-layer MLP
        self.linear_net = nn.Sequential(
            nn.Linear(input_dim, dim_feedforward),
            nn.Dropout(dropout),
            nn.ReLU(inplace=True),
            nn.Linear(dim_feedforward, input_dim),
        )

        # Layers to apply in between the main layers
        self.norm1 = nn.LayerNorm(input_dim)
        self.norm2 = nn.LayerNorm(input_dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, mask=None):
        if mask is None:
            mask = torch.tril(torch.ones(x.size(1), x.size(1), device=x.device))

        # Attention part
        attn_out = self.self_attn(self.norm1(x), mask=mask)
        x = x + self.dropout(attn_out)

        # MLP part
        linear_out = self.linear_net(self.norm2(x))
        x = x + self.dropout(linear_out)

        return x


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "phlippe/uvadlc_notebooks docs/tutorial_notebooks/tutorial6/Transformers_and_MHAttention.ipynb @ e8bb899039e43a87ca3790545ac1387be6184f92"
REFERENCE = {"n_head": 4, "activation": "relu"}
BLOCK = EncoderBlock
ARGS = {"input_dim": 32, "num_heads": 4, "dim_feedforward": 128, "dropout": 0.1}


def weights(b):
    a, f = b.self_attn, b.linear_net
    nh, hs = a.num_heads, a.head_dim
    W = a.qkv_proj.weight.view(nh, 3, hs, -1)  # per head: q_h, k_h, v_h
    bias = a.qkv_proj.bias.view(nh, 3, hs)
    return {
        "ln1": (b.norm1.weight, b.norm1.bias),
        "q": (W[:, 0].reshape(nh * hs, -1), bias[:, 0].reshape(-1)),
        "k": (W[:, 1].reshape(nh * hs, -1), bias[:, 1].reshape(-1)),
        "v": (W[:, 2].reshape(nh * hs, -1), bias[:, 2].reshape(-1)),
        "proj": (a.o_proj.weight, a.o_proj.bias),
        "ln2": (b.norm2.weight, b.norm2.bias),
        "fc1": (f[0].weight, f[0].bias),
        "fc2": (f[3].weight, f[3].bias),
    }


FILL = "attn_logits = attn_logits.masked_fill(mask == 0, -9e15)"
MISTAKES = {
    "no_scaling": [("attn_logits = attn_logits / math.sqrt(d_k)\n", "\n")],
    "wrong_scale:1/hs": [("attn_logits = attn_logits / math.sqrt(d_k)", "attn_logits = attn_logits / d_k")],
    "future_leak": [
        ("attn_out = self.self_attn(self.norm1(x), mask=mask)", "attn_out = self.self_attn(self.norm1(x))")
    ],
    "mask_zero": [(FILL, "attn_logits = attn_logits.masked_fill(mask == 0, 0)")],
    "mask_reversed": [(FILL, "attn_logits = attn_logits.masked_fill(mask == 1, -9e15)")],
    "softmax_dim": [("attention = F.softmax(attn_logits, dim=-1)", "attention = F.softmax(attn_logits, dim=-2)")],
    "heads_mixed:merge": [("values = values.permute(0, 2, 1, 3)  # [Batch, SeqLen, Head, Dims]\n", "\n")],
    "post_norm": [  # the tutorial's own EncoderBlock
        (
            "attn_out = self.self_attn(self.norm1(x), mask=mask)\n        x = x + self.dropout(attn_out)\n",
            "attn_out = self.self_attn(x, mask=mask)\n        x = x + self.dropout(attn_out)\n        x = self.norm1(x)\n",
        ),
        (
            "linear_out = self.linear_net(self.norm2(x))\n        x = x + self.dropout(linear_out)\n",
            "linear_out = self.linear_net(x)\n        x = x + self.dropout(linear_out)\n        x = self.norm2(x)\n",
        ),
    ],
    "no_residual:attn": [("x = x + self.dropout(attn_out)", "x = self.dropout(attn_out)")],
    "no_residual:mlp": [("x = x + self.dropout(linear_out)", "x = self.dropout(linear_out)")],
    "shared_norm": [("linear_out = self.linear_net(self.norm2(x))", "linear_out = self.linear_net(self.norm1(x))")],
}
PAIRS = [("no_scaling", "post_norm"), ("mask_zero", "shared_norm")]
