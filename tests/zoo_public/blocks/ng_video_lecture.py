# Source: karpathy/ng-video-lecture, gpt.py
#   commit 4c8e9028cc4fe417100e1e27db077fca0e0477f2: Head, MultiHeadAttention, FeedForward, Block.
# Kept: the module-level hyperparameters the classes read, one nn.Linear per head and per
# projection, the ReLU MLP in nn.Sequential, Block(n_embd, n_head). Reduced: the globals made small.
import torch
import torch.nn as nn
from torch.nn import functional as F

n_embd = 32
n_head = 4
block_size = 16
dropout = 0.2


class Head(nn.Module):
    """one head of self-attention"""

    def __init__(self, head_size):
        super().__init__()
        self.key = nn.Linear(n_embd, head_size, bias=False)
        self.query = nn.Linear(n_embd, head_size, bias=False)
        self.value = nn.Linear(n_embd, head_size, bias=False)
        self.register_buffer("tril", torch.tril(torch.ones(block_size, block_size)))

        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        # input of size (batch, time-step, channels)
        # output of size (batch, time-step, head size)
        B, T, C = x.shape
        k = self.key(x)  # (B,T,hs)
        q = self.query(x)  # (B,T,hs)
        # compute attention scores ("affinities")
        wei = q @ k.transpose(-2, -1) * k.shape[-1] ** -0.5  # (B, T, hs) @ (B, hs, T) -> (B, T, T)
        wei = wei.masked_fill(self.tril[:T, :T] == 0, float("-inf"))  # (B, T, T)
        wei = F.softmax(wei, dim=-1)  # (B, T, T)
        wei = self.dropout(wei)
        # perform the weighted aggregation of the values
        v = self.value(x)  # (B,T,hs)
        out = wei @ v  # (B, T, T) @ (B, T, hs) -> (B, T, hs)
        return out


class MultiHeadAttention(nn.Module):
    """multiple heads of self-attention in parallel"""

    def __init__(self, num_heads, head_size):
        super().__init__()
        self.heads = nn.ModuleList([Head(head_size) for _ in range(num_heads)])
        self.proj = nn.Linear(head_size * num_heads, n_embd)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        out = torch.cat([h(x) for h in self.heads], dim=-1)
        out = self.dropout(self.proj(out))
        return out


class FeedFoward(nn.Module):
    """a simple linear layer followed by a non-linearity"""

    def __init__(self, n_embd):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd),
            nn.ReLU(),
            nn.Linear(4 * n_embd, n_embd),
            nn.Dropout(dropout),
        )

    def forward(self, x):
        return self.net(x)


class Block(nn.Module):
    """Transformer block: communication followed by computation"""

    def __init__(self, n_embd, n_head):
        # n_embd: embedding dimension, n_head: the number of heads we'd like
        super().__init__()
        head_size = n_embd // n_head
        self.sa = MultiHeadAttention(n_head, head_size)
        self.ffwd = FeedFoward(n_embd)
        self.ln1 = nn.LayerNorm(n_embd)
        self.ln2 = nn.LayerNorm(n_embd)

    def forward(self, x):
        x = x + self.sa(self.ln1(x))
        x = x + self.ffwd(self.ln2(x))
        return x


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "karpathy/ng-video-lecture gpt.py @ 4c8e9028cc4fe417100e1e27db077fca0e0477f2"
REFERENCE = {"n_head": n_head, "activation": "relu"}


BLOCK = Block
ARGS = {"n_embd": n_embd, "n_head": n_head}


def weights(b):
    heads = b.sa.heads
    return {
        "ln1": (b.ln1.weight, b.ln1.bias),
        "q": (torch.cat([h.query.weight for h in heads]), None),
        "k": (torch.cat([h.key.weight for h in heads]), None),
        "v": (torch.cat([h.value.weight for h in heads]), None),
        "proj": (b.sa.proj.weight, b.sa.proj.bias),
        "ln2": (b.ln2.weight, b.ln2.bias),
        "fc1": (b.ffwd.net[0].weight, b.ffwd.net[0].bias),
        "fc2": (b.ffwd.net[2].weight, b.ffwd.net[2].bias),
    }


SCORES = "wei = q @ k.transpose(-2, -1) * k.shape[-1] ** -0.5"
MASK = 'wei = wei.masked_fill(self.tril[:T, :T] == 0, float("-inf"))  # (B, T, T)\n'
SOFTMAX = "wei = F.softmax(wei, dim=-1)  # (B, T, T)\n"
ATTN = "x = x + self.sa(self.ln1(x))"
MLP = "x = x + self.ffwd(self.ln2(x))"
MISTAKES = {
    "no_scaling": [(SCORES, "wei = q @ k.transpose(-2, -1)")],
    "wrong_scale": [(SCORES, "wei = q @ k.transpose(-2, -1) * C**-0.5")],  # the lecture's own slip
    "wrong_scale:sqrt": [(SCORES, "wei = q @ k.transpose(-2, -1) * k.shape[-1] ** 0.5")],
    "future_leak": [(MASK, "# " + MASK)],  # the mask line commented out
    "mask_zero": [(MASK, MASK.replace('float("-inf")', "0"))],
    "mask_reversed": [(MASK, MASK.replace("== 0", "== 1"))],
    "mask_after_softmax": [  # the two lines swapped, the fill made 0 so that nothing is -inf
        (MASK + "        " + SOFTMAX, SOFTMAX + "        " + MASK.replace('float("-inf")', "0.0"))
    ],
    "softmax_dim": [(SOFTMAX, SOFTMAX.replace("dim=-1", "dim=1"))],
    "post_norm": [(ATTN, "x = self.ln1(x + self.sa(x))"), (MLP, "x = self.ln2(x + self.ffwd(x))")],
    "no_residual:attn": [(ATTN, "x = self.sa(self.ln1(x))")],
    "no_residual:mlp": [(MLP, "x = self.ffwd(self.ln2(x))")],
    "shared_norm": [(MLP, "x = x + self.ffwd(self.ln1(x))")],
    "inplace": [(ATTN, "x += self.sa(self.ln1(x))")],
    "dropout_in_eval": [("wei = self.dropout(wei)", "wei = F.dropout(wei, dropout)")],
}
PAIRS = [("wrong_scale", "post_norm"), ("mask_zero", "no_residual:mlp")]
