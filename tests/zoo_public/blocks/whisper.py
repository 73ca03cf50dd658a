# Source: openai/whisper, whisper/model.py
#   commit fdf63e51dc3089e10d72fd25ac04ffe22f86543e: LayerNorm, Linear, MultiHeadAttention,
#   ResidualAttentionBlock.
# Kept: ResidualAttentionBlock(n_state, n_head), query/key/value/out with no bias on the key,
# qkv_attention scaling q and k each by (n_state // n_head) ** -0.25, the additive -inf mask
# (the decoder's triu(1) buffer, sliced [:n_ctx, :n_ctx]), attn_ln / mlp_ln, the MLP as
# nn.Sequential(Linear, GELU, Linear), the float()/type(x.dtype) casts of its LayerNorm and
# Linear subclasses. Reduced: the LayerNorm's x.float() (it assumes float32 weights), no cross-attention, no kv_cache, the SDPA fast path off.
import torch
import torch.nn.functional as F
from torch import Tensor, nn


class LayerNorm(nn.LayerNorm):
    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x).type(x.dtype)  # Whisper: x.float(), for float32 weights


class Linear(nn.Linear):
    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight.to(x.dtype), None if self.bias is None else self.bias.to(x.dtype))


class MultiHeadAttention(nn.Module):
    def __init__(self, n_state: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.query = Linear(n_state, n_state)
        self.key = Linear(n_state, n_state, bias=False)
        self.value = Linear(n_state, n_state)
        self.out = Linear(n_state, n_state)

    def forward(self, x: Tensor, mask=None):
        q = self.query(x)
        k = self.key(x)
        v = self.value(x)
        wv, qk = self.qkv_attention(q, k, v, mask)
        return self.out(wv), qk

    def qkv_attention(self, q: Tensor, k: Tensor, v: Tensor, mask=None):
        n_batch, n_ctx, n_state = q.shape
        scale = (n_state // self.n_head) ** -0.25
        q = q.view(*q.shape[:2], self.n_head, -1).permute(0, 2, 1, 3)
        k = k.view(*k.shape[:2], self.n_head, -1).permute(0, 2, 1, 3)
        v = v.view(*v.shape[:2], self.n_head, -1).permute(0, 2, 1, 3)

        qk = (q * scale) @ (k * scale).transpose(-1, -2)
        if mask is not None:
            qk = qk + mask[:n_ctx, :n_ctx]
        qk = qk.float()

        w = F.softmax(qk, dim=-1).to(q.dtype)
        out = (w @ v).permute(0, 2, 1, 3).flatten(start_dim=2)
        return out, qk.detach()


class ResidualAttentionBlock(nn.Module):
    def __init__(self, n_state: int, n_head: int, n_ctx: int = 16):
        super().__init__()
        self.attn = MultiHeadAttention(n_state, n_head)
        self.attn_ln = LayerNorm(n_state)
        n_mlp = n_state * 4
        self.mlp = nn.Sequential(Linear(n_state, n_mlp), nn.GELU(), Linear(n_mlp, n_state))
        self.mlp_ln = LayerNorm(n_state)
        mask = torch.empty(n_ctx, n_ctx).fill_(-float("inf")).triu_(1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x: Tensor):
        x = x + self.attn(self.attn_ln(x), mask=self.mask)[0]
        x = x + self.mlp(self.mlp_ln(x))
        return x


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "openai/whisper whisper/model.py @ fdf63e51dc3089e10d72fd25ac04ffe22f86543e (MultiHeadAttention, ResidualAttentionBlock)"
REFERENCE = {"n_head": 4, "activation": "gelu"}
BLOCK = ResidualAttentionBlock
ARGS = {"n_state": 32, "n_head": 4}


def weights(b):
    a, m = b.attn, b.mlp
    return {
        "ln1": (b.attn_ln.weight, b.attn_ln.bias),
        "q": (a.query.weight, a.query.bias),
        "k": (a.key.weight, None),
        "v": (a.value.weight, a.value.bias),
        "proj": (a.out.weight, a.out.bias),
        "ln2": (b.mlp_ln.weight, b.mlp_ln.bias),
        "fc1": (m[0].weight, m[0].bias),
        "fc2": (m[2].weight, m[2].bias),
    }


TOLERANCE = 1e-6  # the scores are cast to float32 before the softmax, as in Whisper
SCALE = "scale = (n_state // self.n_head) ** -0.25"
MASK = "qk = qk + mask[:n_ctx, :n_ctx]"
ATTN = "x = x + self.attn(self.attn_ln(x), mask=self.mask)[0]"
MLP = "x = x + self.mlp(self.mlp_ln(x))"
MISTAKES = {
    "no_scaling": [(SCALE, "scale = 1")],
    "wrong_scale": [(SCALE, "scale = n_state**-0.25")],
    "wrong_scale:1/hs": [(SCALE, "scale = (n_state // self.n_head) ** -0.5")],  # -0.5 on q and on k
    "future_leak": [(ATTN, "x = x + self.attn(self.attn_ln(x))[0]")],
    "mask_reversed": [(".triu_(1)", ".tril_()")],
    "softmax_dim": [("w = F.softmax(qk, dim=-1).to(q.dtype)", "w = F.softmax(qk, dim=-2).to(q.dtype)")],
    "heads_mixed:merge": [
        (
            "out = (w @ v).permute(0, 2, 1, 3).flatten(start_dim=2)",
            "out = (w @ v).permute(0, 2, 3, 1).flatten(start_dim=2)",
        )
    ],
    "post_norm": [
        (ATTN, "x = self.attn_ln(x + self.attn(x, mask=self.mask)[0])"),
        (MLP, "x = self.mlp_ln(x + self.mlp(x))"),
    ],
    "no_residual:attn": [(ATTN, "x = self.attn(self.attn_ln(x), mask=self.mask)[0]")],
    "no_residual:mlp": [(MLP, "x = self.mlp(self.mlp_ln(x))")],
    "shared_norm": [(MLP, "x = x + self.mlp(self.attn_ln(x))")],
}
PAIRS = [("no_scaling", "post_norm"), ("future_leak", "shared_norm")]
