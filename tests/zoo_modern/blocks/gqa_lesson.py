# Source: the lesson's block (gptblock.lesson, "Reimplement the transformer block") with
#   grouped-query attention as PyTorch's own nn.RMSNorm and the GQA recipe of
#   pytorch-labs/gpt-fast model.py (k.repeat_interleave(n_head // n_local_heads, dim=1)) write it,
#   written for the zoo.
# Kept: the lesson's shape (one fused projection per role, view(B, T, nh, hs).transpose(1, 2),
# masked_fill(-inf) + softmax, x = x + sa(ln1(x))), torch's nn.RMSNorm with eps=1e-5, keys and
# values of n_kv_head heads repeated with repeat_interleave, a GELU MLP of width 4C.
# Reduced: no positions in the block (position="none": a GPT-2 model adds learned ones).
import torch
import torch.nn as nn
from torch.nn import functional as F


class GroupedAttention(nn.Module):
    def __init__(self, n_embd, n_head, n_kv_head, block_size):
        super().__init__()
        self.n_head, self.n_kv_head = n_head, n_kv_head
        self.hs = n_embd // n_head
        self.query = nn.Linear(n_embd, n_head * self.hs)
        self.key = nn.Linear(n_embd, n_kv_head * self.hs)
        self.value = nn.Linear(n_embd, n_kv_head * self.hs)
        self.proj = nn.Linear(n_head * self.hs, n_embd)
        self.register_buffer("tril", torch.tril(torch.ones(block_size, block_size)))

    def forward(self, x):
        B, T, C = x.shape
        q = self.query(x).view(B, T, self.n_head, self.hs).transpose(1, 2)  # (B, nh, T, hs)
        k = self.key(x).view(B, T, self.n_kv_head, self.hs).transpose(1, 2)  # (B, nkv, T, hs)
        v = self.value(x).view(B, T, self.n_kv_head, self.hs).transpose(1, 2)
        group = self.n_head // self.n_kv_head
        k = k.repeat_interleave(group, dim=1)  # (B, nh, T, hs): kv head j serves q heads j*g..
        v = v.repeat_interleave(group, dim=1)
        wei = q @ k.transpose(-2, -1) * self.hs**-0.5  # (B, nh, T, T)
        wei = wei.masked_fill(self.tril[:T, :T] == 0, float("-inf"))
        wei = F.softmax(wei, dim=-1)
        out = (wei @ v).transpose(1, 2).reshape(B, T, C)  # (B, T, C)
        return self.proj(out)


class FeedForward(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        return self.net(x)


class Block(nn.Module):
    def __init__(self, n_embd=32, n_head=4, n_kv_head=2, block_size=16):
        super().__init__()
        self.sa = GroupedAttention(n_embd, n_head, n_kv_head, block_size)
        self.ffwd = FeedForward(n_embd)
        self.ln1 = nn.RMSNorm(n_embd, eps=1e-5)
        self.ln2 = nn.RMSNorm(n_embd, eps=1e-5)

    def forward(self, x):
        x = x + self.sa(self.ln1(x))
        x = x + self.ffwd(self.ln2(x))
        return x


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "the-lessons+pytorch-labs/gpt-fast model.py"
BLOCK = Block
ARGS = {"n_embd": 32, "n_head": 4, "n_kv_head": 2, "block_size": 16}
REFERENCE = {"n_head": 4, "n_kv_head": 2, "norm": "rmsnorm", "mlp": "dense", "activation": "gelu", "norm_eps": 1e-5}


def weights(b):
    a, f = b.sa, b.ffwd.net
    return {
        "norm1.weight": b.ln1.weight,
        "self_attn.in_proj_weight": torch.cat([a.query.weight, a.key.weight, a.value.weight]),
        "self_attn.in_proj_bias": torch.cat([a.query.bias, a.key.bias, a.value.bias]),
        "self_attn.out_proj.weight": a.proj.weight,
        "self_attn.out_proj.bias": a.proj.bias,
        "norm2.weight": b.ln2.weight,
        "linear1.weight": f[0].weight,
        "linear1.bias": f[0].bias,
        "linear2.weight": f[2].weight,
        "linear2.bias": f[2].bias,
    }


MISTAKES = {
    "gqa_order": [
        ("k = k.repeat_interleave(group, dim=1)", "k = k.repeat(1, group, 1, 1)"),
        ("v = v.repeat_interleave(group, dim=1)", "v = v.repeat(1, group, 1, 1)"),
    ],
    "no_scaling": [("wei = q @ k.transpose(-2, -1) * self.hs**-0.5", "wei = q @ k.transpose(-2, -1)")],
    "mask_zero": [
        (
            'wei = wei.masked_fill(self.tril[:T, :T] == 0, float("-inf"))',
            "wei = wei.masked_fill(self.tril[:T, :T] == 0, 0)",
        )
    ],
    "post_norm": [
        ("x = x + self.sa(self.ln1(x))", "x = self.ln1(x + self.sa(x))"),
        ("x = x + self.ffwd(self.ln2(x))", "x = self.ln2(x + self.ffwd(x))"),
    ],
    "shared_norm": [("x = x + self.ffwd(self.ln2(x))", "x = x + self.ffwd(self.ln1(x))")],
}
PAIRS = [("gqa_order", "no_scaling")]
