# Source: pytorch/torchtune, torchtune/modules/attention.py
#   commit 00c242bad053b9b63c27826a277a4522072f9d8f (MultiHeadAttention), with
#   torchtune/modules/transformer.py (TransformerSelfAttentionLayer), feed_forward.py
#   (FeedForward) and attention_utils.py (_sdpa_or_flex_attention, its SDPA branch).
# Kept: the dependency-injected construction: TransformerSelfAttentionLayer(attn, mlp, sa_norm,
# mlp_norm, sa_scale, mlp_scale) and MultiHeadAttention(embed_dim=..., num_heads=...,
# num_kv_heads=..., head_dim=..., q_proj=..., k_proj=..., v_proj=..., output_proj=..., ...)
# taking ready-made modules, keyword-only; attn(h, h, mask=..., input_pos=...); q viewed as
# (b, s_x, n_kv * q_per_kv, h_d) and k / v through the (b, s_y, n_kv, 1, h_d) view, expand and
# reshape of grouped-query attention; the SDPA call with is_causal = kv_cache is None and mask is
# None and self.is_causal; output.transpose(1, 2).contiguous().view(b, s_x, -1);
# FeedForward(gate_proj=w1, down_proj=w2, up_proj=None, activation) computing w2(act(w1(x)))
# when up_proj is None; h = sa_scale(attn_out) + x, out = h + mlp_scale(mlp_out) with
# nn.Identity scales.
# Reduced: none in the code: the lessons' block is built through the same API with LayerNorm
# norms (torchtune's models pass RMSNorm), nn.GELU as the FeedForward activation (SiLU with an
# up_proj in Llama), num_kv_heads == num_heads, biased projections and no pos_embeddings; the
# KV cache, q_norm / k_norm and the flex-attention branch are left out.
from typing import Optional

from torch import nn


def _sdpa_or_flex_attention():
    def _attention_call(q, k, v, mask, dropout_p, is_causal):
        # shape: [b, n_h, s, h_d]
        return nn.functional.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=dropout_p,
            is_causal=is_causal,
        )

    return _attention_call


class MultiHeadAttention(nn.Module):
    def __init__(
        self,
        *,
        embed_dim: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        q_proj: nn.Module,
        k_proj: nn.Module,
        v_proj: nn.Module,
        output_proj: nn.Module,
        pos_embeddings: Optional[nn.Module] = None,
        max_seq_len: int = 4096,
        is_causal: bool = True,
        attn_dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if num_heads % num_kv_heads != 0:
            raise ValueError(f"num_heads ({num_heads}) must be divisible by num_kv_heads ({num_kv_heads})")

        if embed_dim % num_heads != 0:
            raise ValueError(f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})")

        # Set attributes
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.embed_dim = embed_dim
        self.attn_dropout = attn_dropout
        self.head_dim = head_dim
        self.max_seq_len = max_seq_len
        self.is_causal = is_causal

        # Set layers
        self.kv_cache = None
        self.q_proj = q_proj
        self.k_proj = k_proj
        self.v_proj = v_proj
        self.output_proj = output_proj
        self.pos_embeddings = pos_embeddings

        self._attention_call = _sdpa_or_flex_attention()

    def forward(self, x, y=None, *, mask=None, input_pos=None):
        # x has shape [b, s_x, d]
        # y has shape [b, s_y, d]
        b, s_x, _ = x.shape
        s_y = y.shape[1] if y is not None else 0

        # q has shape [b, s_x, num_heads * head_dim]
        q = self.q_proj(x)

        # number of queries per key/value
        q_per_kv = self.num_heads // self.num_kv_heads
        q = q.view(b, s_x, self.num_kv_heads * q_per_kv, self.head_dim)

        # Apply positional embeddings
        if self.pos_embeddings is not None:
            q = self.pos_embeddings(q, input_pos=input_pos)

        # [b, n_h, s_x, h_d]
        q = q.transpose(1, 2)

        # k has shape [b, s_y, num_kv_heads * head_dim]
        # v has shape [b, s_y, num_kv_heads * head_dim]
        k = self.k_proj(y)
        v = self.v_proj(y)

        # Apply positional embeddings
        # k: [b, s_y, n_kv, h_d]
        k = k.view(b, s_y, -1, self.head_dim)
        if self.pos_embeddings is not None:
            k = self.pos_embeddings(k, input_pos=input_pos)

        # k: [b, s_y, n_kv, 1, h_d]
        # v: [b, s_y, n_kv, 1, h_d]
        k = k.view(b, s_y, self.num_kv_heads, 1, self.head_dim)
        v = v.view(b, s_y, self.num_kv_heads, 1, self.head_dim)

        # If needed, expand the key and value tensors to have the same shape
        # as the query tensor by copying values across the relevant dim
        if self.num_heads != self.num_kv_heads:
            k = k.expand(b, s_y, self.num_kv_heads, q_per_kv, self.head_dim)
            v = v.expand(b, s_y, self.num_kv_heads, q_per_kv, self.head_dim)

        # [b, s, n_h, h_d]
        k = k.reshape(b, s_y, -1, self.head_dim)
        v = v.reshape(b, s_y, -1, self.head_dim)

        # [b, n_h, s, h_d]
        k = k.transpose(1, 2)
        v = v.transpose(1, 2)

        output = self._attention_call(
            q,
            k,
            v,
            mask=mask,
            dropout_p=self.attn_dropout if self.training else 0.0,
            is_causal=self.kv_cache is None and mask is None and self.is_causal,
        )

        # reshape the output to be the same shape as the input
        output = output.transpose(1, 2).contiguous().view(b, s_x, -1)
        return self.output_proj(output)


class FeedForward(nn.Module):
    def __init__(self, *, gate_proj: nn.Module, down_proj: nn.Module, up_proj: Optional[nn.Module] = None,
                 activation: nn.Module = nn.SiLU()):
        super().__init__()
        self.w1 = gate_proj
        self.w2 = down_proj
        self.w3 = up_proj
        self.activation = activation

    def forward(self, x):
        h = self.activation(self.w1(x))
        if self.w3 is not None:
            h = h * self.w3(x)

        h = self.w2(h)
        return h


class TransformerSelfAttentionLayer(nn.Module):
    def __init__(
        self,
        attn: MultiHeadAttention,
        mlp: nn.Module,
        *,
        sa_norm: Optional[nn.Module] = None,
        mlp_norm: Optional[nn.Module] = None,
        sa_scale: Optional[nn.Module] = None,
        mlp_scale: Optional[nn.Module] = None,
    ) -> None:
        super().__init__()
        self.attn = attn
        self.mlp = mlp
        self.sa_norm = sa_norm or nn.Identity()
        self.mlp_norm = mlp_norm or nn.Identity()
        self.sa_scale = sa_scale or nn.Identity()
        self.mlp_scale = mlp_scale or nn.Identity()

    def forward(self, x, *, mask=None, input_pos=None, **kwargs):
        # Input tensor and attention output have the same shape
        # [b, s, d]
        # Norm applied before self-attention
        h = self.sa_norm(x)
        attn_out = self.attn(h, h, mask=mask, input_pos=input_pos)
        # Residual connection; shape: [batch_size, seq_length, embed_dim]
        h = self.sa_scale(attn_out) + x

        # Norm applied before the feedforward layer
        mlp_out = self.mlp(self.mlp_norm(h))

        # Residual connection; shape: [bsz, seq_len, embed_dim]
        out = h + self.mlp_scale(mlp_out)
        return out


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "pytorch/torchtune torchtune/modules/attention.py @ 00c242bad053b9b63c27826a277a4522072f9d8f"
REFERENCE = {"n_head": 4, "activation": "gelu"}
BLOCK = TransformerSelfAttentionLayer
_C, _NH = 32, 4
ARGS = {
    "attn": MultiHeadAttention(
        embed_dim=_C, num_heads=_NH, num_kv_heads=_NH, head_dim=_C // _NH,
        q_proj=nn.Linear(_C, _C), k_proj=nn.Linear(_C, _C), v_proj=nn.Linear(_C, _C),
        output_proj=nn.Linear(_C, _C), max_seq_len=16,
    ),
    "mlp": FeedForward(gate_proj=nn.Linear(_C, 4 * _C), down_proj=nn.Linear(4 * _C, _C), activation=nn.GELU()),
    "sa_norm": nn.LayerNorm(_C),
    "mlp_norm": nn.LayerNorm(_C),
}  # fmt: skip


def weights(b):
    a, m = b.attn, b.mlp
    return {
        "ln1": (b.sa_norm.weight, b.sa_norm.bias),
        "q": (a.q_proj.weight, a.q_proj.bias),
        "k": (a.k_proj.weight, a.k_proj.bias),
        "v": (a.v_proj.weight, a.v_proj.bias),
        "proj": (a.output_proj.weight, a.output_proj.bias),
        "ln2": (b.mlp_norm.weight, b.mlp_norm.bias),
        "fc1": (m.w1.weight, m.w1.bias),
        "fc2": (m.w2.weight, m.w2.bias),
    }


CALL = "is_causal=is_causal,\n        )"
R1 = "h = self.sa_scale(attn_out) + x"
R2 = "out = h + self.mlp_scale(mlp_out)"
MISTAKES = {
    "no_scaling": [(CALL, "is_causal=is_causal,\n            scale=1.0,\n        )")],
    "wrong_scale": [(CALL, "is_causal=is_causal,\n            scale=q.shape[1] ** -0.5 * q.shape[-1] ** -0.5,\n        )")],
    "wrong_scale:1/hs": [(CALL, "is_causal=is_causal,\n            scale=1 / q.shape[-1],\n        )")],
    "future_leak": [("is_causal=self.kv_cache is None and mask is None and self.is_causal,",
                     "is_causal=self.kv_cache is None and mask is None and not self.is_causal,")],
    "heads_mixed:merge": [("output = output.transpose(1, 2).contiguous().view(b, s_x, -1)", "output = output.contiguous().view(b, s_x, -1)")],
    "heads_mixed:split": [("q = q.view(b, s_x, self.num_kv_heads * q_per_kv, self.head_dim)",
                           "q = q.view(b, self.num_kv_heads * q_per_kv, s_x, self.head_dim).transpose(1, 2)")],
    "no_residual:attn": [(R1, "h = self.sa_scale(attn_out)")],
    "no_residual:mlp": [(R2, "out = self.mlp_scale(mlp_out)")],
    "shared_norm": [("mlp_out = self.mlp(self.mlp_norm(h))", "mlp_out = self.mlp(self.sa_norm(h))")],
    "post_norm": [
        ("h = self.sa_norm(x)\n        attn_out = self.attn(h, h, mask=mask, input_pos=input_pos)",
         "attn_out = self.attn(x, x, mask=mask, input_pos=input_pos)"),
        (R1, "h = self.sa_norm(self.sa_scale(attn_out) + x)"),
        ("mlp_out = self.mlp(self.mlp_norm(h))", "mlp_out = self.mlp(h)"),
        (R2, "out = self.mlp_norm(h + self.mlp_scale(mlp_out))"),
    ],
}
PAIRS = [("future_leak", "no_residual:attn")]
