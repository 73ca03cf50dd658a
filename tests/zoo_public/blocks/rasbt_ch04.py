# Source: rasbt/LLMs-from-scratch, ch04/01_main-chapter-code/gpt.py
#   commit bbb2a0c3d59dcfb0df3260408f6848c7251cdad7: MultiHeadAttention, LayerNorm, GELU,
#   FeedForward, TransformerBlock.
# Kept: TransformerBlock(cfg) with the book's config dict, W_query/W_key/W_value (qkv_bias=False)
# and out_proj, the triu `mask` buffer and in-place masked_fill_, scaling inside the softmax call,
# the hand-written LayerNorm (scale/shift) and tanh GELU, the `shortcut` residual style.
# Reduced: nothing.
import torch
import torch.nn as nn


class MultiHeadAttention(nn.Module):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        assert d_out % num_heads == 0, "d_out must be divisible by num_heads"

        self.d_out = d_out
        self.num_heads = num_heads
        self.head_dim = d_out // num_heads  # Reduce the projection dim to match desired output dim

        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)  # Linear layer to combine head outputs
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))

    def forward(self, x):
        b, num_tokens, d_in = x.shape

        keys = self.W_key(x)  # Shape: (b, num_tokens, d_out)
        queries = self.W_query(x)
        values = self.W_value(x)

        # We implicitly split the matrix by adding a `num_heads` dimension
        # Unroll last dim: (b, num_tokens, d_out) -> (b, num_tokens, num_heads, head_dim)
        keys = keys.view(b, num_tokens, self.num_heads, self.head_dim)
        values = values.view(b, num_tokens, self.num_heads, self.head_dim)
        queries = queries.view(b, num_tokens, self.num_heads, self.head_dim)

        # Transpose: (b, num_tokens, num_heads, head_dim) -> (b, num_heads, num_tokens, head_dim)
        keys = keys.transpose(1, 2)
        queries = queries.transpose(1, 2)
        values = values.transpose(1, 2)

        # Compute scaled dot-product attention (aka self-attention) with a causal mask
        attn_scores = queries @ keys.transpose(2, 3)  # Dot product for each head

        # Original mask truncated to the number of tokens and converted to boolean
        mask_bool = self.mask.bool()[:num_tokens, :num_tokens]

        # Use the mask to fill attention scores
        attn_scores.masked_fill_(mask_bool, -torch.inf)

        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
        attn_weights = self.dropout(attn_weights)

        # Shape: (b, num_tokens, num_heads, head_dim)
        context_vec = (attn_weights @ values).transpose(1, 2)

        # Combine heads, where self.d_out = self.num_heads * self.head_dim
        context_vec = context_vec.contiguous().view(b, num_tokens, self.d_out)
        context_vec = self.out_proj(context_vec)  # optional projection

        return context_vec


class LayerNorm(nn.Module):
    def __init__(self, emb_dim):
        super().__init__()
        self.eps = 1e-5
        self.scale = nn.Parameter(torch.ones(emb_dim))
        self.shift = nn.Parameter(torch.zeros(emb_dim))

    def forward(self, x):
        mean = x.mean(dim=-1, keepdim=True)
        var = x.var(dim=-1, keepdim=True, unbiased=False)
        norm_x = (x - mean) / torch.sqrt(var + self.eps)
        return self.scale * norm_x + self.shift


class GELU(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return 0.5 * x * (1 + torch.tanh(torch.sqrt(torch.tensor(2.0 / torch.pi)) * (x + 0.044715 * torch.pow(x, 3))))


class FeedForward(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(cfg["emb_dim"], 4 * cfg["emb_dim"]),
            GELU(),
            nn.Linear(4 * cfg["emb_dim"], cfg["emb_dim"]),
        )

    def forward(self, x):
        return self.layers(x)


class TransformerBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.att = MultiHeadAttention(
            d_in=cfg["emb_dim"],
            d_out=cfg["emb_dim"],
            context_length=cfg["context_length"],
            num_heads=cfg["n_heads"],
            dropout=cfg["drop_rate"],
            qkv_bias=cfg["qkv_bias"],
        )
        self.ff = FeedForward(cfg)
        self.norm1 = LayerNorm(cfg["emb_dim"])
        self.norm2 = LayerNorm(cfg["emb_dim"])
        self.drop_shortcut = nn.Dropout(cfg["drop_rate"])

    def forward(self, x):
        # Shortcut connection for attention block
        shortcut = x
        x = self.norm1(x)
        x = self.att(x)  # Shape [batch_size, num_tokens, emb_size]
        x = self.drop_shortcut(x)
        x = x + shortcut  # Add the original input back

        # Shortcut connection for feed forward block
        shortcut = x
        x = self.norm2(x)
        x = self.ff(x)
        x = self.drop_shortcut(x)
        x = x + shortcut  # Add the original input back

        return x


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "rasbt/LLMs-from-scratch ch04/01_main-chapter-code/gpt.py @ bbb2a0c3d59dcfb0df3260408f6848c7251cdad7"
REFERENCE = {"n_head": 4, "activation": "gelu_tanh"}
BLOCK = TransformerBlock
ARGS = {"cfg": {"emb_dim": 32, "context_length": 16, "n_heads": 4, "drop_rate": 0.1, "qkv_bias": False}}
TOLERANCE = 1e-6  # the GELU's sqrt(2 / pi) is a float32 tensor, as in the book


def weights(b):
    a, f = b.att, b.ff.layers
    return {
        "ln1": (b.norm1.scale, b.norm1.shift),
        "q": (a.W_query.weight, a.W_query.bias),
        "k": (a.W_key.weight, a.W_key.bias),
        "v": (a.W_value.weight, a.W_value.bias),
        "proj": (a.out_proj.weight, a.out_proj.bias),
        "ln2": (b.norm2.scale, b.norm2.shift),
        "fc1": (f[0].weight, f[0].bias),
        "fc2": (f[2].weight, f[2].bias),
    }


SOFTMAX = "attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)"
FILL = "attn_scores.masked_fill_(mask_bool, -torch.inf)"
ATT = "x = self.att(x)  # Shape [batch_size, num_tokens, emb_size]\n        x = self.drop_shortcut(x)\n        x = x + shortcut  # Add the original input back"
FF = "x = self.ff(x)\n        x = self.drop_shortcut(x)\n        x = x + shortcut  # Add the original input back"
MISTAKES = {
    "no_scaling": [(SOFTMAX, "attn_weights = torch.softmax(attn_scores, dim=-1)")],
    "wrong_scale": [(SOFTMAX, "attn_weights = torch.softmax(attn_scores / self.d_out**0.5, dim=-1)")],
    "wrong_scale:1/hs": [(SOFTMAX, "attn_weights = torch.softmax(attn_scores / keys.shape[-1], dim=-1)")],
    "future_leak": [(FILL, "# " + FILL)],
    "mask_zero": [(FILL, "attn_scores.masked_fill_(mask_bool, 0)")],
    "mask_reversed": [(FILL, "attn_scores.masked_fill_(~mask_bool, -torch.inf)")],
    "softmax_dim": [(SOFTMAX, SOFTMAX.replace("dim=-1", "dim=-2"))],
    "heads_mixed:merge": [
        ("context_vec = (attn_weights @ values).transpose(1, 2)", "context_vec = attn_weights @ values")
    ],
    "no_residual:attn": [(ATT, ATT.replace("x = x + shortcut", "x = x"))],
    "no_residual:mlp": [(FF, FF.replace("x = x + shortcut", "x = x"))],
    "shared_norm": [("x = self.norm2(x)", "x = self.norm1(x)")],
    "post_norm": [
        ("        x = self.norm1(x)\n", ""),
        (ATT, ATT.replace("x = x + shortcut", "x = self.norm1(x + shortcut)")),
        ("        x = self.norm2(x)\n", ""),
        (FF, FF.replace("x = x + shortcut", "x = self.norm2(x + shortcut)")),
    ],
}
PAIRS = [("no_scaling", "shared_norm"), ("mask_reversed", "post_norm")]
