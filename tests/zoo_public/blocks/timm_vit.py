# Source: huggingface/pytorch-image-models, timm/models/vision_transformer.py
#   commit 0041cb7ba4ab3b8b3bce5bf105300f0ee57ffc22 (Block) and timm/layers: Attention, Mlp,
#   LayerScale, DropPath, resolve_self_attn_mask / maybe_add_mask.
# Kept: Block(dim, num_heads, mlp_ratio, qkv_bias, ...) with norm1 / attn / ls1 / drop_path1 /
# norm2 / mlp / ls2 / drop_path2 (identities when unused), forward(x, attn_mask, is_causal),
# Attention's fused qkv reshaped to (B, N, 3, num_heads, head_dim) and permuted (2, 0, 3, 1, 4)
# then unbind(0), q * self.scale before q @ k.transpose(-2, -1), an additive attention bias,
# attn.softmax(dim=-1), q_norm / k_norm / norm identities, Mlp's fc1 / act / drop1 / norm / fc2.
# Reduced: the manual attention path (fused_attn False, as with TIMM_FUSED_ATTN=0); is_causal
# defaults to True (a ViT attends both ways: timm's default False is this zoo's future_leak);
# resolve_self_attn_mask and maybe_add_mask written out locally for the causal case only.
from typing import Optional

import torch
import torch.nn as nn


def resolve_self_attn_mask(seq_len, attn, attn_mask=None, is_causal=False):
    """The additive bias (seq_len, seq_len) for self-attention: -inf above the diagonal if causal."""
    if not is_causal:
        return attn_mask
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=attn.device).tril()
    return torch.zeros(seq_len, seq_len, dtype=attn.dtype, device=attn.device).masked_fill(~causal, float("-inf"))


def maybe_add_mask(scores, attn_mask=None):
    return scores if attn_mask is None else scores + attn_mask


class Mlp(nn.Module):
    """MLP as used in Vision Transformer, MLP-Mixer and related networks"""

    def __init__(
        self,
        in_features,
        hidden_features=None,
        out_features=None,
        act_layer=nn.GELU,
        norm_layer=None,
        bias=True,
        drop=0.0,
    ):
        super().__init__()
        out_features = out_features or in_features
        hidden_features = hidden_features or in_features

        self.fc1 = nn.Linear(in_features, hidden_features, bias=bias)
        self.act = act_layer()
        self.drop1 = nn.Dropout(drop)
        self.norm = norm_layer(hidden_features) if norm_layer is not None else nn.Identity()
        self.fc2 = nn.Linear(hidden_features, out_features, bias=bias)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x):
        x = self.fc1(x)
        x = self.act(x)
        x = self.drop1(x)
        x = self.norm(x)
        x = self.fc2(x)
        x = self.drop2(x)
        return x


class Attention(nn.Module):
    def __init__(
        self,
        dim,
        num_heads=8,
        qkv_bias=False,
        qk_norm=False,
        proj_bias=True,
        attn_drop=0.0,
        proj_drop=0.0,
        norm_layer=None,
    ):
        super().__init__()
        assert dim % num_heads == 0, "dim should be divisible by num_heads"
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.fused_attn = False

        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.q_norm = norm_layer(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = norm_layer(self.head_dim) if qk_norm else nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.norm = nn.Identity()
        self.proj = nn.Linear(dim, dim, bias=proj_bias)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(
        self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False
    ) -> torch.Tensor:
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)

        q = q * self.scale
        attn = q @ k.transpose(-2, -1)
        attn_bias = resolve_self_attn_mask(N, attn, attn_mask, is_causal=is_causal)
        attn = maybe_add_mask(attn, attn_bias)
        attn = attn.softmax(dim=-1)
        attn = self.attn_drop(attn)
        x = attn @ v

        x = x.transpose(1, 2).reshape(B, N, C)
        x = self.norm(x)
        x = self.proj(x)
        x = self.proj_drop(x)
        return x


class Block(nn.Module):
    """Transformer block with pre-normalization."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = False,
        proj_bias: bool = True,
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        act_layer=nn.GELU,
        norm_layer=nn.LayerNorm,
        mlp_layer=Mlp,
    ) -> None:
        super().__init__()
        self.norm1 = norm_layer(dim)
        self.attn = Attention(
            dim,
            num_heads=num_heads,
            qkv_bias=qkv_bias,
            proj_bias=proj_bias,
            attn_drop=attn_drop,
            proj_drop=proj_drop,
            norm_layer=norm_layer,
        )
        self.ls1 = nn.Identity()
        self.drop_path1 = nn.Identity()

        self.norm2 = norm_layer(dim)
        self.mlp = mlp_layer(
            in_features=dim, hidden_features=int(dim * mlp_ratio), act_layer=act_layer, bias=proj_bias, drop=proj_drop
        )
        self.ls2 = nn.Identity()
        self.drop_path2 = nn.Identity()

    def forward(
        self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None, is_causal: bool = True
    ) -> torch.Tensor:
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x), attn_mask=attn_mask, is_causal=is_causal)))
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return x


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "huggingface/pytorch-image-models timm/models/vision_transformer.py @ 0041cb7ba4ab3b8b3bce5bf105300f0ee57ffc22 (+ timm/layers)"
REFERENCE = {"n_head": 4, "activation": "gelu"}
BLOCK = Block
ARGS = {"dim": 32, "num_heads": 4, "qkv_bias": True, "proj_drop": 0.1, "attn_drop": 0.1}


def weights(b):
    a, m = b.attn, b.mlp
    q, k, v = a.qkv.weight.chunk(3)  # (3, nh, hs) in the output: thirds, then heads
    bq, bk, bv = a.qkv.bias.chunk(3)
    return {
        "ln1": (b.norm1.weight, b.norm1.bias),
        "q": (q, bq),
        "k": (k, bk),
        "v": (v, bv),
        "proj": (a.proj.weight, a.proj.bias),
        "ln2": (b.norm2.weight, b.norm2.bias),
        "fc1": (m.fc1.weight, m.fc1.bias),
        "fc2": (m.fc2.weight, m.fc2.bias),
    }


ATTN = "x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x), attn_mask=attn_mask, is_causal=is_causal)))"
MLP = "x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))"
MISTAKES = {
    "no_scaling": [("q = q * self.scale\n", "\n")],
    "wrong_scale": [("self.scale = self.head_dim**-0.5", "self.scale = dim**-0.5")],
    "wrong_scale:1/hs": [("self.scale = self.head_dim**-0.5", "self.scale = self.head_dim**-1")],
    "future_leak": [("is_causal: bool = True", "is_causal: bool = False")],  # timm's default
    "mask_reversed": [(".tril()\n", ".triu(1)\n")],
    "softmax_dim": [("attn = attn.softmax(dim=-1)", "attn = attn.softmax(dim=-2)")],
    "heads_mixed:split": [
        (".permute(2, 0, 3, 1, 4)", ".permute(2, 0, 1, 3, 4).reshape(3, B, self.num_heads, N, self.head_dim)")
    ],
    "heads_mixed:merge": [("x = x.transpose(1, 2).reshape(B, N, C)", "x = x.reshape(B, N, C)")],
    "post_norm": [
        (
            ATTN,
            "x = self.norm1(x + self.drop_path1(self.ls1(self.attn(x, attn_mask=attn_mask, is_causal=is_causal))))",
        ),
        (MLP, "x = self.norm2(x + self.drop_path2(self.ls2(self.mlp(x))))"),
    ],  # timm's own ResPostBlock normalises the branch, not the stream: this is the lessons' post-norm
    "no_residual:attn": [(ATTN, ATTN.replace("x = x + ", "x = "))],
    "no_residual:mlp": [(MLP, MLP.replace("x = x + ", "x = "))],
    "shared_norm": [(MLP, MLP.replace("self.norm2(x)", "self.norm1(x)"))],
}
PAIRS = [("wrong_scale", "shared_norm"), ("heads_mixed:merge", "no_residual:mlp")]
