# Source: TransformerLensOrg/TransformerLens, transformer_lens/components/
#   layer_norm.py @ 0d2c62c8a5efed61e5915af3370444bdf933f4ae, attention.py / abstract_attention.py
#   @ 54bd335c684e235c49c555033899c5df337b013b / ea33f6711fc81ea25b89129777d8bd4ee054f69e,
#   mlps/mlp.py @ 827ab3d3cacb7447492736600eb1cf00986d6ced, transformer_block.py @ 54bd335c.
# Kept: TransformerBlock(cfg, block_index), per-head 3-D weights W_Q/W_K/W_V (n_heads, d_model,
# d_head) with b_Q (n_heads, d_head), W_O (n_heads, d_head, d_model), MLP W_in (d_model, d_mlp),
# the hand-written LayerNorm with w/b, the IGNORE buffer and torch.where mask, einsums with
# named-looking axes, HookPoints on every activation. Reduced: no rotary/shortstack options,
# fancy_einsum's word axes written as letters for torch.einsum.
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


class HookPoint(nn.Module):
    """An identity a hook can be attached to (TransformerLens's hook_points.HookPoint)."""

    def forward(self, x):
        return x


@dataclass
class HookedTransformerConfig:
    d_model: int
    n_heads: int
    d_head: int
    d_mlp: int
    n_ctx: int
    eps: float = 1e-5
    act_fn: str = "gelu_new"


class LayerNorm(nn.Module):
    def __init__(self, cfg, length=None):
        super().__init__()
        self.cfg = cfg
        self.eps = self.cfg.eps
        self.length = self.cfg.d_model if length is None else length
        self.w = nn.Parameter(torch.ones(self.length))
        self.b = nn.Parameter(torch.zeros(self.length))
        self.hook_scale = HookPoint()  # [batch, pos, 1]
        self.hook_normalized = HookPoint()  # [batch, pos, length]

    def forward(self, x):
        x = x - x.mean(-1, keepdim=True)  # [batch, pos, length]
        scale = self.hook_scale((x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())
        x = x / scale  # [batch, pos, length]
        return self.hook_normalized(x * self.w + self.b)


class Attention(nn.Module):
    def __init__(self, cfg, attn_type="global", layer_id=None):
        super().__init__()
        self.cfg = cfg
        self.W_Q = nn.Parameter(torch.empty(self.cfg.n_heads, self.cfg.d_model, self.cfg.d_head))
        self.W_K = nn.Parameter(torch.empty(self.cfg.n_heads, self.cfg.d_model, self.cfg.d_head))
        self.W_V = nn.Parameter(torch.empty(self.cfg.n_heads, self.cfg.d_model, self.cfg.d_head))
        self.W_O = nn.Parameter(torch.empty(self.cfg.n_heads, self.cfg.d_head, self.cfg.d_model))
        self.b_Q = nn.Parameter(torch.zeros(self.cfg.n_heads, self.cfg.d_head))
        self.b_K = nn.Parameter(torch.zeros(self.cfg.n_heads, self.cfg.d_head))
        self.b_V = nn.Parameter(torch.zeros(self.cfg.n_heads, self.cfg.d_head))
        self.b_O = nn.Parameter(torch.zeros(self.cfg.d_model))
        for W in (self.W_Q, self.W_K, self.W_V, self.W_O):
            nn.init.normal_(W, std=0.02)
        self.attn_type = attn_type
        # Create a max_ctx x max_ctx mask, with True iff that query position
        # can attend to that key position (query is first axis, key is second axis)
        causal_mask = torch.tril(torch.ones((self.cfg.n_ctx, self.cfg.n_ctx)).bool())
        self.register_buffer("mask", causal_mask)
        self.register_buffer("IGNORE", torch.tensor(-torch.inf))
        self.layer_id = layer_id
        self.attn_scale = self.cfg.d_head**0.5
        self.hook_k = HookPoint()  # [batch, pos, head_index, d_head]
        self.hook_q = HookPoint()  # [batch, pos, head_index, d_head]
        self.hook_v = HookPoint()  # [batch, pos, head_index, d_head]
        self.hook_z = HookPoint()  # [batch, pos, head_index, d_head]
        self.hook_attn_scores = HookPoint()  # [batch, head_index, query_pos, key_pos]
        self.hook_pattern = HookPoint()  # [batch, head_index, query_pos, key_pos]

    def forward(self, query_input, key_input, value_input):
        # "batch pos d_model, head_index d_model d_head -> batch pos head_index d_head"
        q = self.hook_q(torch.einsum("bpm,imh->bpih", query_input, self.W_Q) + self.b_Q)
        k = self.hook_k(torch.einsum("bpm,imh->bpih", key_input, self.W_K) + self.b_K)
        v = self.hook_v(torch.einsum("bpm,imh->bpih", value_input, self.W_V) + self.b_V)
        # "batch query_pos head_index d_head, batch key_pos head_index d_head -> batch head_index query_pos key_pos"
        attn_scores = torch.einsum("bqih,bkih->biqk", q, k) / self.attn_scale
        attn_scores = self.apply_causal_mask(attn_scores)  # [batch, head_index, query_pos, key_pos]
        attn_scores = self.hook_attn_scores(attn_scores)
        pattern = F.softmax(attn_scores, dim=-1)
        pattern = torch.where(torch.isnan(pattern), torch.zeros_like(pattern), pattern)
        pattern = self.hook_pattern(pattern)  # [batch, head_index, query_pos, key_pos]
        # "batch key_pos head_index d_head, batch head_index query_pos key_pos -> batch query_pos head_index d_head"
        z = self.hook_z(torch.einsum("bkih,biqk->bqih", v, pattern))
        # "batch pos head_index d_head, head_index d_head d_model -> batch pos d_model"
        out = torch.einsum("bpih,ihm->bpm", z, self.W_O) + self.b_O
        return out

    def apply_causal_mask(self, attn_scores):
        query_ctx_length = attn_scores.size(-2)
        key_ctx_length = attn_scores.size(-1)
        final_mask = self.mask[None, None, -query_ctx_length:, -key_ctx_length:]  # [1, 1, pos, pos]
        return torch.where(final_mask, attn_scores, self.IGNORE)


def gelu_new(input):
    return (
        0.5
        * input
        * (
            1.0
            + torch.tanh(
                torch.sqrt(torch.tensor(2.0 / torch.pi, dtype=input.dtype))
                * (input + 0.044715 * torch.pow(input, 3.0))
            )
        )
    )


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.W_in = nn.Parameter(torch.empty(self.cfg.d_model, self.cfg.d_mlp))
        self.b_in = nn.Parameter(torch.zeros(self.cfg.d_mlp))
        self.W_out = nn.Parameter(torch.empty(self.cfg.d_mlp, self.cfg.d_model))
        self.b_out = nn.Parameter(torch.zeros(self.cfg.d_model))
        nn.init.normal_(self.W_in, std=0.02)
        nn.init.normal_(self.W_out, std=0.02)
        self.act_fn = gelu_new
        self.hook_pre = HookPoint()  # [batch, pos, d_mlp]
        self.hook_post = HookPoint()  # [batch, pos, d_mlp]

    def forward(self, x):
        # "batch pos d_model, d_model d_mlp -> batch pos d_mlp"
        pre_act = self.hook_pre(torch.einsum("bpm,mf->bpf", x, self.W_in) + self.b_in)
        post_act = self.hook_post(self.act_fn(pre_act))  # [batch, pos, d_mlp]
        return torch.einsum("bpf,fm->bpm", post_act, self.W_out) + self.b_out


class TransformerBlock(nn.Module):
    def __init__(self, cfg, block_index):
        super().__init__()
        self.cfg = cfg
        self.ln1 = LayerNorm(cfg)
        self.ln2 = LayerNorm(cfg)
        self.attn = Attention(self.cfg, "global", block_index)
        self.mlp = MLP(self.cfg)
        self.hook_attn_in = HookPoint()  # [batch, pos, d_model]
        self.hook_mlp_in = HookPoint()  # [batch, pos, d_model]
        self.hook_attn_out = HookPoint()  # [batch, pos, d_model]
        self.hook_mlp_out = HookPoint()  # [batch, pos, d_model]
        self.hook_resid_pre = HookPoint()  # [batch, pos, d_model]
        self.hook_resid_mid = HookPoint()  # [batch, pos, d_model]
        self.hook_resid_post = HookPoint()  # [batch, pos, d_model]

    def forward(self, resid_pre):
        resid_pre = self.hook_resid_pre(resid_pre)  # [batch, pos, d_model]
        attn_in = resid_pre
        attn_out = self.hook_attn_out(
            # hook the residual stream states that are used to calculate the
            # queries, keys and values, independently.
            # Then take the layer norm of these inputs, and pass these to the attention module.
            self.attn(
                query_input=self.ln1(attn_in),
                key_input=self.ln1(attn_in),
                value_input=self.ln1(attn_in),
            )
        )  # [batch, pos, d_model]
        resid_mid = self.hook_resid_mid(resid_pre + attn_out)  # [batch, pos, d_model]
        mlp_in = self.hook_mlp_in(resid_mid.clone())
        normalized_resid_mid = self.ln2(mlp_in)
        mlp_out = self.hook_mlp_out(self.mlp(normalized_resid_mid))  # [batch, pos, d_model]
        resid_post = self.hook_resid_post(resid_mid + mlp_out)  # [batch, pos, d_model]
        return resid_post


# ----- the zoo's data (the checker never sees it) -----

SOURCE = (
    "TransformerLensOrg/TransformerLens transformer_lens/components/ (LayerNorm, Attention, MLP, TransformerBlock)"
)
REFERENCE = {"n_head": 4, "activation": "gelu_tanh"}
BLOCK = TransformerBlock
ARGS = {"cfg": HookedTransformerConfig(d_model=32, n_heads=4, d_head=8, d_mlp=128, n_ctx=16), "block_index": 0}


def weights(b):
    a, m = b.attn, b.mlp

    def heads(W, bias):  # (nh, C, hs) -> (C, C) stored (out, in), head i in rows i*hs:(i+1)*hs
        return torch.cat(list(W.transpose(1, 2))), bias.reshape(-1)

    return {
        "ln1": (b.ln1.w, b.ln1.b),
        "q": heads(a.W_Q, a.b_Q),
        "k": heads(a.W_K, a.b_K),
        "v": heads(a.W_V, a.b_V),
        "proj": (a.W_O.reshape(-1, a.W_O.shape[-1]).T, a.b_O),  # (nh, hs, C) -> (C, nh*hs)
        "ln2": (b.ln2.w, b.ln2.b),
        "fc1": (m.W_in.T, m.b_in),
        "fc2": (m.W_out.T, m.b_out),
    }


SCORES = 'attn_scores = torch.einsum("bqih,bkih->biqk", q, k) / self.attn_scale'
MASK = "attn_scores = self.apply_causal_mask(attn_scores)"
MISTAKES = {
    "no_scaling": [(SCORES, 'attn_scores = torch.einsum("bqih,bkih->biqk", q, k)')],
    "wrong_scale": [("self.attn_scale = self.cfg.d_head**0.5", "self.attn_scale = self.cfg.d_model**0.5")],
    "wrong_scale:1/hs": [("self.attn_scale = self.cfg.d_head**0.5", "self.attn_scale = self.cfg.d_head")],
    "future_leak": [(MASK, "# " + MASK)],
    "mask_reversed": [
        (
            "return torch.where(final_mask, attn_scores, self.IGNORE)",
            "return torch.where(final_mask, self.IGNORE, attn_scores)",
        )
    ],
    "mask_zero": [
        (
            'self.register_buffer("IGNORE", torch.tensor(-torch.inf))',
            'self.register_buffer("IGNORE", torch.tensor(0.0))',
        )
    ],
    "softmax_dim": [("pattern = F.softmax(attn_scores, dim=-1)", "pattern = F.softmax(attn_scores, dim=-2)")],
    "heads_mixed:order": [
        (
            'out = torch.einsum("bpih,ihm->bpm", z, self.W_O) + self.b_O',
            "out = z.transpose(-1, -2).reshape(z.shape[0], z.shape[1], -1) @ self.W_O.reshape(-1, self.cfg.d_model) + self.b_O",
        )
    ],
    "no_residual:attn": [
        ("resid_mid = self.hook_resid_mid(resid_pre + attn_out)", "resid_mid = self.hook_resid_mid(attn_out)")
    ],
    "no_residual:mlp": [
        ("resid_post = self.hook_resid_post(resid_mid + mlp_out)", "resid_post = self.hook_resid_post(mlp_out)")
    ],
    "shared_norm": [("normalized_resid_mid = self.ln2(mlp_in)", "normalized_resid_mid = self.ln1(mlp_in)")],
}
PAIRS = [("no_scaling", "no_residual:mlp"), ("mask_zero", "shared_norm")]
