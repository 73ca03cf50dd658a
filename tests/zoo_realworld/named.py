"""The naming schemes of other widely copied codebases, each on the lessons' pre-norm block.

Llama (attention.wq / feed_forward.w1, attention_norm / ffn_norm), Hugging Face's Llama-style
projections (q_proj ... o_proj, up_proj / down_proj, input_layernorm), BERT's names in a pre-norm
block (attention.self.query, attention.output.dense, intermediate.dense, output.dense), GPT-NeoX
(query_key_value, dense_h_to_4h), fairseq (self_attn_layer_norm, final_layer_norm, fc1 / fc2,
q scaled before the product) and a learner's capitalised names flat on the block (Wq, W1, LN1).
"""

import math

import torch
import torch.nn as nn
from torch.nn import functional as F

from .common import (
    HEAD_BUGS,
    MANUAL_BUGS,
    WIRING_BUGS,
    Style,
    finish,
    merge_heads,
    residual,
    scale,
    softmax_masked,
    split_heads,
)

SDPA_BUGS = ("no_scaling", "wrong_scale", "future_leak", "mask_reversed", "dropout_in_eval")


def sdpa(q, k, v, bugs, p, training):
    """F.scaled_dot_product_attention, causal, or with the mistake that is on."""
    C, hs = q.shape[1] * q.shape[-1], q.shape[-1]
    p = p if (training or "dropout_in_eval" in bugs) else 0.0
    if "mask_reversed" in bugs:  # nn.MultiheadAttention's convention (True = blocked) given to SDPA
        T = q.shape[-2]
        blocked = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=blocked, dropout_p=p)
    return F.scaled_dot_product_attention(
        q, k, v, dropout_p=p, is_causal="future_leak" not in bugs, scale=scale(bugs, None, hs, C)
    )


class LlamaAttention(nn.Module):
    def __init__(self, dim, n_heads, p, bugs):
        super().__init__()
        self.n_heads, self.head_dim, self.p, self.bugs = n_heads, dim // n_heads, p, bugs
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)
        xq, xk, xv = (split_heads(t, self.n_heads, self.bugs) for t in (xq, xk, xv))
        return self.wo(merge_heads(sdpa(xq, xk, xv, self.bugs, self.p, self.training), self.bugs))


class LlamaFeedForward(nn.Module):
    def __init__(self, dim, hidden_dim):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)

    def forward(self, x):
        return self.w2(F.gelu(self.w1(x)))


class Llama(nn.Module):
    """Llama's TransformerBlock names (with LayerNorm and GELU instead of RMSNorm and SwiGLU)."""

    def __init__(self, dim, n_heads, dropout=0.1, bugs=frozenset()):
        super().__init__()
        self.attention = LlamaAttention(dim, n_heads, dropout, bugs)
        self.feed_forward = LlamaFeedForward(dim, 4 * dim)
        self.attention_norm = nn.LayerNorm(dim, bias=False)
        self.ffn_norm = nn.LayerNorm(dim, bias=False)
        self.bugs = bugs

    def forward(self, x):
        return finish(
            residual(
                x, self.attention, self.feed_forward, self.attention_norm, self.ffn_norm, self.bugs
            ),
            self.bugs,
        )


class HFProjAttention(nn.Module):
    def __init__(self, hidden_size, num_heads, bugs):
        super().__init__()
        self.num_heads, self.head_dim, self.bugs = num_heads, hidden_size // num_heads, bugs
        self.q_proj = nn.Linear(hidden_size, hidden_size)
        self.k_proj = nn.Linear(hidden_size, hidden_size)
        self.v_proj = nn.Linear(hidden_size, hidden_size)
        self.o_proj = nn.Linear(hidden_size, hidden_size)

    def forward(self, hidden_states):
        B, T, C = hidden_states.shape
        q = split_heads(self.q_proj(hidden_states), self.num_heads, self.bugs)
        k = split_heads(self.k_proj(hidden_states), self.num_heads, self.bugs)
        v = split_heads(self.v_proj(hidden_states), self.num_heads, self.bugs)
        w = torch.matmul(q, k.transpose(2, 3)) * scale(
            self.bugs, 1 / math.sqrt(self.head_dim), self.head_dim, C
        )
        causal = torch.full((T, T), torch.finfo(w.dtype).min, device=w.device).triu(1)
        if set(self.bugs) & {
            "future_leak",
            "mask_reversed",
            "mask_zero",
            "mask_after_softmax",
            "softmax_dim",
        }:
            w = softmax_masked(w, causal == 0, self.bugs)
        else:
            w = F.softmax(w + causal, dim=-1, dtype=torch.float32).to(q.dtype)
        return self.o_proj(merge_heads(torch.matmul(w, v), self.bugs))


class HFProj(nn.Module):
    """Hugging Face Llama-style names: input_layernorm, self_attn.q_proj ... o_proj,
    post_attention_layernorm, mlp.up_proj / down_proj."""

    def __init__(self, hidden_size, num_attention_heads, bugs=frozenset()):
        super().__init__()
        self.input_layernorm = nn.LayerNorm(hidden_size)
        self.self_attn = HFProjAttention(hidden_size, num_attention_heads, bugs)
        self.post_attention_layernorm = nn.LayerNorm(hidden_size)
        self.mlp = nn.Module()
        self.mlp.up_proj = nn.Linear(hidden_size, 4 * hidden_size)
        self.mlp.down_proj = nn.Linear(4 * hidden_size, hidden_size)
        self.bugs = bugs

    def forward(self, hidden_states):
        mlp = lambda h: self.mlp.down_proj(F.gelu(self.mlp.up_proj(h)))  # noqa: E731
        return finish(
            residual(
                hidden_states,
                self.self_attn,
                mlp,
                self.input_layernorm,
                self.post_attention_layernorm,
                self.bugs,
            ),
            self.bugs,
        )


class BertSelf(nn.Module):
    def __init__(self, hidden, heads, bugs):
        super().__init__()
        self.num_attention_heads, self.attention_head_size, self.bugs = heads, hidden // heads, bugs
        self.query, self.key, self.value = (
            nn.Linear(hidden, hidden),
            nn.Linear(hidden, hidden),
            nn.Linear(hidden, hidden),
        )

    def forward(self, h):
        T, C = h.shape[1], h.shape[2]
        q, k, v = (
            split_heads(f(h), self.num_attention_heads, self.bugs)
            for f in (self.query, self.key, self.value)
        )
        scores = torch.matmul(q, k.transpose(-1, -2))
        scores = scores / (
            1
            / scale(self.bugs, 1 / math.sqrt(self.attention_head_size), self.attention_head_size, C)
        )
        allowed = torch.tril(torch.ones(T, T, device=h.device)).bool()
        return merge_heads(softmax_masked(scores, allowed, self.bugs, fill=-10000.0) @ v, self.bugs)


class Bert(nn.Module):
    """BERT's module names (attention.self.query ..., attention.output.dense, intermediate.dense,
    output.dense), each LayerNorm called `LayerNorm`, wired pre-norm and causal."""

    def __init__(self, hidden_size, num_attention_heads, bugs=frozenset()):
        super().__init__()
        self.attention = nn.Module()
        self.attention.self = BertSelf(hidden_size, num_attention_heads, bugs)
        self.attention.output = nn.Module()
        self.attention.output.dense = nn.Linear(hidden_size, hidden_size)
        self.attention.output.LayerNorm = nn.LayerNorm(hidden_size, eps=1e-12)
        self.intermediate = nn.Module()
        self.intermediate.dense = nn.Linear(hidden_size, 4 * hidden_size)
        self.output = nn.Module()
        self.output.dense = nn.Linear(4 * hidden_size, hidden_size)
        self.output.LayerNorm = nn.LayerNorm(hidden_size, eps=1e-12)
        self.bugs = bugs

    def forward(self, x):
        attn = lambda h: self.attention.output.dense(self.attention.self(h))  # noqa: E731
        mlp = lambda h: self.output.dense(F.gelu(self.intermediate.dense(h)))  # noqa: E731
        ln1, ln2 = self.attention.output.LayerNorm, self.output.LayerNorm
        return finish(residual(x, attn, mlp, ln1, ln2, self.bugs), self.bugs)


class NeoX(nn.Module):
    """GPT-NeoX's names (input_layernorm, attention.query_key_value, attention.dense,
    post_attention_layernorm, mlp.dense_h_to_4h / dense_4h_to_h), q|k|v packed in thirds."""

    def __init__(self, hidden_size, num_attention_heads, bugs=frozenset()):
        super().__init__()
        C = hidden_size
        self.input_layernorm = nn.LayerNorm(C)
        self.post_attention_layernorm = nn.LayerNorm(C)
        self.attention = nn.Module()
        self.attention.num_attention_heads = num_attention_heads
        self.attention.query_key_value = nn.Linear(C, 3 * C)
        self.attention.dense = nn.Linear(C, C)
        self.mlp = nn.Module()
        self.mlp.dense_h_to_4h = nn.Linear(C, 4 * C)
        self.mlp.dense_4h_to_h = nn.Linear(4 * C, C)
        self.bugs = bugs

    def attn(self, h):
        B, T, C = h.shape
        nh = self.attention.num_attention_heads
        q, k, v = (
            split_heads(t, nh, self.bugs)
            for t in self.attention.query_key_value(h).split(C, dim=-1)
        )
        w = torch.matmul(q, k.transpose(-1, -2)) * scale(
            self.bugs, 1.0 / math.sqrt(C // nh), C // nh, C
        )
        allowed = torch.ones(T, T, dtype=torch.bool, device=h.device).tril()
        w = softmax_masked(w, allowed, self.bugs, fill=torch.finfo(w.dtype).min)
        return self.attention.dense(merge_heads(w @ v, self.bugs))

    def forward(self, x):
        mlp = lambda h: self.mlp.dense_4h_to_h(F.gelu(self.mlp.dense_h_to_4h(h)))  # noqa: E731
        return finish(
            residual(
                x, self.attn, mlp, self.input_layernorm, self.post_attention_layernorm, self.bugs
            ),
            self.bugs,
        )


class FairseqAttention(nn.Module):
    def __init__(self, embed_dim, num_heads, bugs):
        super().__init__()
        self.num_heads, self.head_dim, self.bugs = num_heads, embed_dim // num_heads, bugs
        self.scaling = self.head_dim**-0.5
        self.k_proj = nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, x):
        T, C = x.shape[1], x.shape[2]
        q = self.q_proj(x)
        q *= scale(self.bugs, self.scaling, self.head_dim, C)  # fairseq scales q in place
        q, k, v = (
            split_heads(t, self.num_heads, self.bugs) for t in (q, self.k_proj(x), self.v_proj(x))
        )
        allowed = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        return self.out_proj(
            merge_heads(softmax_masked(q @ k.transpose(-1, -2), allowed, self.bugs) @ v, self.bugs)
        )


class Fairseq(nn.Module):
    """fairseq's TransformerEncoderLayer with normalize_before: self_attn_layer_norm,
    self_attn.{k,v,q}_proj / out_proj, final_layer_norm, fc1 / fc2 (ReLU)."""

    def __init__(self, embed_dim, num_heads, bugs=frozenset()):
        super().__init__()
        self.self_attn = FairseqAttention(embed_dim, num_heads, bugs)
        self.self_attn_layer_norm = nn.LayerNorm(embed_dim)
        self.fc1 = nn.Linear(embed_dim, 4 * embed_dim)
        self.fc2 = nn.Linear(4 * embed_dim, embed_dim)
        self.final_layer_norm = nn.LayerNorm(embed_dim)
        self.bugs = bugs

    def forward(self, x):
        mlp = lambda h: self.fc2(F.relu(self.fc1(h)))  # noqa: E731
        return finish(
            residual(
                x, self.self_attn, mlp, self.self_attn_layer_norm, self.final_layer_norm, self.bugs
            ),
            self.bugs,
        )


class Capitals(nn.Module):
    """A learner's capitalised names flat on the block: LN1, Wq, Wk, Wv, Wo, LN2, W1, W2."""

    def __init__(self, n_embd, n_head, bugs=frozenset()):
        super().__init__()
        C = n_embd
        self.n_head, self.bugs = n_head, bugs
        self.LN1, self.LN2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.Wq, self.Wk, self.Wv, self.Wo = (nn.Linear(C, C) for _ in range(4))
        self.W1, self.W2 = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def attn(self, x):
        B, T, C = x.shape
        q, k, v = (split_heads(w(x), self.n_head, self.bugs) for w in (self.Wq, self.Wk, self.Wv))
        hs = C // self.n_head
        att = softmax_masked(
            q @ k.transpose(-2, -1) * scale(self.bugs, hs**-0.5, hs, C),
            torch.tril(torch.ones(T, T, device=x.device)) == 1,
            self.bugs,
        )
        return self.Wo(merge_heads(att @ v, self.bugs))

    def forward(self, x):
        mlp = lambda h: self.W2(F.gelu(self.W1(h), approximate="tanh"))  # noqa: E731
        return finish(residual(x, self.attn, mlp, self.LN1, self.LN2, self.bugs), self.bugs)


STYLES = [
    Style(
        "llama",
        "Llama's model.py names (attention.wq ... wo, feed_forward.w1 / w2, attention_norm, ffn_norm)",
        Llama,
        {"dim": 32, "n_heads": 4},
        (*SDPA_BUGS, *HEAD_BUGS, *WIRING_BUGS),
        (("wrong_scale", "shared_norm"), ("future_leak", "heads_mixed:merge", "post_norm")),
    ),
    Style(
        "hf-proj",
        "Hugging Face Llama-style names (q_proj ... o_proj, up_proj / down_proj, input_layernorm)",
        HFProj,
        {"hidden_size": 32, "num_attention_heads": 2},
        (*MANUAL_BUGS, *HEAD_BUGS, *WIRING_BUGS),
        (("mask_zero", "post_norm"), ("wrong_scale:sqrt", "no_residual:normed")),
    ),
    Style(
        "bert-names",
        "BERT's module names (attention.self.query, intermediate.dense, output.dense), pre-norm",
        Bert,
        {"hidden_size": 32, "num_attention_heads": 4},
        (*MANUAL_BUGS, *HEAD_BUGS, *WIRING_BUGS),
        (("no_scaling", "post_norm"), ("mask_after_softmax", "heads_mixed:split")),
    ),
    Style(
        "gpt-neox",
        "GPT-NeoX's names (query_key_value, dense_h_to_4h / dense_4h_to_h)",
        NeoX,
        {"hidden_size": 48, "num_attention_heads": 4},
        (*MANUAL_BUGS, *HEAD_BUGS, *WIRING_BUGS),
        (("wrong_scale", "no_residual:attn"), ("softmax_dim", "post_norm")),
    ),
    Style(
        "fairseq",
        "fairseq's TransformerEncoderLayer (normalize_before), k_proj registered first",
        Fairseq,
        {"embed_dim": 32, "num_heads": 4},
        (*MANUAL_BUGS, *HEAD_BUGS, *WIRING_BUGS),
        (("wrong_scale:1/hs", "shared_norm"), ("mask_reversed", "post_norm")),
    ),
    Style(
        "capitals",
        "a learner's capitalised names flat on the block (LN1, Wq ... Wo, W1, W2), tanh GELU",
        Capitals,
        {"n_embd": 32, "n_head": 4},
        (*MANUAL_BUGS, *HEAD_BUGS, *WIRING_BUGS),
        (("no_scaling", "no_residual:both"), ("future_leak", "wrong_scale", "shared_norm")),
    ),
]
