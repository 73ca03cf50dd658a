# Source: lucidrains/CoCa-pytorch, coca_pytorch/coca_pytorch.py at commit
#   0105ee7013ed19478b76a053526f49651dde4b58 (LayerNorm, Residual, RotaryEmbedding, rotate_half,
#   apply_rotary_pos_emb, SwiGLU, ParallelTransformerBlock: PaLM's block, as lucidrains/PaLM-pytorch
#   writes it), written for the zoo.
# Kept: PaLM's parallel block wrapped in Residual (x + attn_out(...) + ff_out(...)); LayerNorm with a
# learned gamma and a zero beta buffer (F.layer_norm, "layernorm without bias"); one fused projection
# fused_attn_ff_proj split into q (heads * dim_head), one key head, one value head (multi-query) and the
# MLP's 2 * ff_inner_dim (up first, gate second, as SwiGLU chunks it: F.silu(gate) * x); q scaled
# before the einsum "b h i d, b j d -> b h i j" against the single key head; the causal mask and the
# rotary table cached in buffers registered during forward (get_mask, get_rotary_embedding); rotary in
# halves (rotate_half through rearrange "... (j d) -> ... j d", table cat((freqs, freqs))); the softmax
# after subtracting the detached row max; the attn_mask argument (None).
# Reduced: einops' rearrange as tests/zoo_public/einops_lite (the project does not depend on einops);
# the block the checker builds is Residual(ParallelTransformerBlock(...)) as CoCa's unimodal layers are,
# written as a subclass of Residual with ParallelTransformerBlock's arguments.
# Dropped after the measurement (RESULTS_s57.md): swiglu_swapped, the halves of one unnamed matrix
# swapped (x.chunk(2) read as gate, x): as a function of fresh weights the same MLP, and only names
# tell the catalogue's swiglu_swapped (its entry says so); measured a PASS, as expected.
import torch
import torch.nn.functional as F
from torch import einsum, nn

from zoo_public.einops_lite import rearrange


def exists(val):
    return val is not None

# normalization
# they use layernorm without bias, something that pytorch does not offer


class LayerNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(dim))
        self.register_buffer("beta", torch.zeros(dim))

    def forward(self, x):
        return F.layer_norm(x, x.shape[-1:], self.gamma, self.beta)

# residual


class Residual(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x, *args, **kwargs):
        return self.fn(x, *args, **kwargs) + x

# rotary positional embedding
# https://arxiv.org/abs/2104.09864


class RotaryEmbedding(nn.Module):
    def __init__(self, dim):
        super().__init__()
        inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
        self.register_buffer("inv_freq", inv_freq)

    def forward(self, max_seq_len, *, device):
        seq = torch.arange(max_seq_len, device=device, dtype=self.inv_freq.dtype)
        freqs = einsum("i , j -> i j", seq, self.inv_freq)
        return torch.cat((freqs, freqs), dim=-1)


def rotate_half(x):
    x = rearrange(x, "... (j d) -> ... j d", j=2)
    x1, x2 = x.unbind(dim=-2)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(pos, t):
    return (t * pos.cos()) + (rotate_half(t) * pos.sin())


# classic Noam Shazeer paper, except here they use SwiGLU instead of the more popular GEGLU for gating the feedforward
# https://arxiv.org/abs/2002.05202


class SwiGLU(nn.Module):
    def forward(self, x):
        x, gate = x.chunk(2, dim=-1)
        return F.silu(gate) * x


# parallel attention and feedforward with residual
# discovered by Wang et al + EleutherAI from GPT-J fame


class ParallelTransformerBlock(nn.Module):
    def __init__(self, dim, dim_head=64, heads=8, ff_mult=4):
        super().__init__()
        self.norm = LayerNorm(dim)

        attn_inner_dim = dim_head * heads
        ff_inner_dim = dim * ff_mult
        self.fused_dims = (attn_inner_dim, dim_head, dim_head, (ff_inner_dim * 2))

        self.heads = heads
        self.scale = dim_head**-0.5
        self.rotary_emb = RotaryEmbedding(dim_head)

        self.fused_attn_ff_proj = nn.Linear(dim, sum(self.fused_dims), bias=False)
        self.attn_out = nn.Linear(attn_inner_dim, dim, bias=False)

        self.ff_out = nn.Sequential(
            SwiGLU(),
            nn.Linear(ff_inner_dim, dim, bias=False)
        )

        # for caching causal mask and rotary embeddings

        self.register_buffer("mask", None, persistent=False)
        self.register_buffer("pos_emb", None, persistent=False)

    def get_mask(self, n, device):
        if self.mask is not None and self.mask.shape[-1] >= n:
            return self.mask[:n, :n]

        mask = torch.ones((n, n), device=device, dtype=torch.bool).triu(1)
        self.register_buffer("mask", mask, persistent=False)
        return mask

    def get_rotary_embedding(self, n, device):
        if self.pos_emb is not None and self.pos_emb.shape[-2] >= n:
            return self.pos_emb[:n]

        pos_emb = self.rotary_emb(n, device=device)
        self.register_buffer("pos_emb", pos_emb, persistent=False)
        return pos_emb

    def forward(self, x, attn_mask=None):
        """
        einstein notation
        b - batch
        h - heads
        n, i, j - sequence length (base sequence length, source, target)
        d - feature dimension
        """

        n, device, h = x.shape[1], x.device, self.heads

        # pre layernorm

        x = self.norm(x)

        # attention queries, keys, values, and feedforward inner

        q, k, v, ff = self.fused_attn_ff_proj(x).split(self.fused_dims, dim=-1)

        # split heads
        # they use multi-query single-key-value attention, yet another Noam Shazeer paper
        # they found no performance loss past a certain scale, and more efficient decoding obviously
        # https://arxiv.org/abs/1911.02150

        q = rearrange(q, "b n (h d) -> b h n d", h=h)

        # rotary embeddings

        positions = self.get_rotary_embedding(n, device)
        q, k = map(lambda t: apply_rotary_pos_emb(positions, t), (q, k))

        # scale

        q = q * self.scale

        # similarity

        sim = einsum("b h i d, b j d -> b h i j", q, k)

        # causal mask

        causal_mask = self.get_mask(n, device)
        sim = sim.masked_fill(causal_mask, -torch.finfo(sim.dtype).max)

        # extra attention mask - for masking out attention from text CLS token to padding

        if exists(attn_mask):
            attn_mask = rearrange(attn_mask, 'b i j -> b 1 i j')
            sim = sim.masked_fill(~attn_mask, -torch.finfo(sim.dtype).max)

        # attention

        sim = sim - sim.amax(dim=-1, keepdim=True).detach()
        attn = sim.softmax(dim=-1)

        # aggregate values

        out = einsum("b h i j, b j d -> b h i d", attn, v)

        # merge heads

        out = rearrange(out, "b h n d -> b n (h d)")
        return self.attn_out(out) + self.ff_out(ff)


class UnimodalLayer(Residual):
    def __init__(self, dim=32, dim_head=8, heads=4, ff_mult=4):
        super().__init__(ParallelTransformerBlock(dim=dim, dim_head=dim_head, heads=heads, ff_mult=ff_mult))


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "lucidrains/CoCa-pytorch coca_pytorch/coca_pytorch.py"
BLOCK = UnimodalLayer
ARGS = {"dim": 32, "dim_head": 8, "heads": 4, "ff_mult": 4}
REFERENCE = {
    "n_head": 4,
    "n_kv_head": 1,
    "norm": "layernorm",
    "mlp": "swiglu",
    "norm_eps": 1e-5,
    "parallel_residual": True,
    "position": "rope",
    "rope_pairing": "halves",
}
TOLERANCE = 1e-6  # the rotary table is float32 (inv_freq's dtype), as the source's is


def weights(b):
    blk = b.fn
    C, hs = 32, 8
    H = blk.ff_out[1].weight.shape[1]
    w = blk.fused_attn_ff_proj.weight
    q, k, v, ff = w.split(blk.fused_dims, dim=0)
    return {
        "norm1.weight": blk.norm.gamma,
        "self_attn.in_proj_weight": torch.cat([q, k, v]),
        "self_attn.out_proj.weight": blk.attn_out.weight,
        "linear1.weight": ff[H:],  # the gate: the second half
        "linear3.weight": ff[:H],
        "linear2.weight": blk.ff_out[1].weight,
    }


ROPE = "q, k = map(lambda t: apply_rotary_pos_emb(positions, t), (q, k))"
MASK = "sim = sim.masked_fill(causal_mask, -torch.finfo(sim.dtype).max)"
MISTAKES = {
    "rope_q_only": [(ROPE, "q = apply_rotary_pos_emb(positions, q)")],
    "rope_v": [(ROPE, "q, k, v = map(lambda t: apply_rotary_pos_emb(positions, t), (q, k, v))")],
    "rope_pairing": [("return torch.cat((freqs, freqs), dim=-1)", "return freqs.repeat_interleave(2, dim=-1)")],
    "no_scaling": [("q = q * self.scale", "q = q")],
    "wrong_scale": [("self.scale = dim_head**-0.5", "self.scale = dim**-0.5")],
    "future_leak": [(MASK, "sim = sim")],
    "mask_reversed": [
        (
            "mask = torch.ones((n, n), device=device, dtype=torch.bool).triu(1)",
            "mask = torch.ones((n, n), device=device, dtype=torch.bool).tril()",
        )
    ],
    "softmax_dim": [("attn = sim.softmax(dim=-1)", "attn = sim.softmax(dim=-2)")],
    "heads_mixed:order": [('out = rearrange(out, "b h n d -> b n (h d)")', 'out = rearrange(out, "b h n d -> b n (d h)")')],
    "swiglu_silu": [("return F.silu(gate) * x", "return F.silu(gate * x)")],
    "no_residual:dropped": [
        ("return self.fn(x, *args, **kwargs) + x", "return self.fn(x, *args, **kwargs)"),
    ],
}
PAIRS = [("rope_q_only", "no_residual:dropped"), ("future_leak", "wrong_scale")]
