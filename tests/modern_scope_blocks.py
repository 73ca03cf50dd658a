"""Modern blocks as public code writes them, for ``tests/test_check_modern_scope.py``.

Written after Hugging Face's layers (``modeling_llama``, ``modeling_phi3``, ``modeling_qwen3``,
``modeling_gemma``, ``modeling_gemma2``, ``modeling_olmo2``, ``modeling_mistral``) and BLOOM's
ALiBi, reduced to a constructor of plain arguments and ``forward(x)`` (the rotary table and the
mask made there). The first three are correct modern blocks the reference models (a rotary base
of 8e6 on half of each head, gate and up packed in one matrix, a qk norm with the scores written
``q @ k.transpose(2, 3)``); the rest are correct blocks with a part the reference does not model
(soft-capped logits, sandwich norms, ALiBi, a sliding window, a qk norm over the whole width).

Shapes: B batch, T time, C channels, nh heads, hs head size.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class WeightlessRMSNorm(nn.Module):
    """nanochat's (Hugging Face's NanoChatRMSNorm): no weight, computed in float32."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps

    def forward(self, x):
        return (
            x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        ).type_as(x)


class GemmaRMSNorm(nn.Module):
    """Gemma's: the weight is stored as gain - 1, initialised to 0."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        output = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        output = output * (1.0 + self.weight.float())
        return output.type_as(x)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rotary(dim, T, base, device, factor=1.0):
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    inv_freq = inv_freq / factor  # linear rope scaling (position interpolation)
    freqs = torch.outer(torch.arange(T, device=device).float(), inv_freq.to(device))
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def truncated_rotary(x):
    """modded-nanogpt's: pairs (i, i + hs/2), the frequencies of the last quarter's pairs 0."""
    hs, T = x.shape[-1], x.shape[-2]
    f = (1 / 1024) ** torch.linspace(0, 1, hs // 4, device=x.device)
    at = torch.arange(T, device=x.device).float()
    theta = torch.outer(at, torch.cat([f, f.new_zeros(hs // 4)]))  # (T, hs/2)
    cos, sin = theta.cos(), theta.sin()
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos + x2 * sin, -x1 * sin + x2 * cos), -1).type_as(x)


def by_head(x):
    """A learner's slip (s86 unseen set): (B, h, T, hs) turned by the table's row h, not t."""
    cos, sin = rotary(x.shape[-1], x.shape[1], 10000.0, x.device)  # (h, hs), as if h were t
    return x * cos[:, None].to(x) + rotate_half(x) * sin[:, None].to(x)


def causal(T, x, window=None):
    i = torch.arange(T, device=x.device)
    blocked = i[None, :] > i[:, None]
    if window is not None:
        blocked = blocked | (i[:, None] - i[None, :] >= window)
    return torch.zeros(T, T, dtype=x.dtype, device=x.device).masked_fill(blocked, float("-inf"))


class Attention(nn.Module):
    """Llama's eager attention with the options the public layers add: a qk norm per head
    (Qwen3) or over the whole width (OLMo 2), partial rotary (Phi, StableLM), soft-capped logits
    (Gemma 2), ALiBi (BLOOM: added, or as ``baddbmm``'s input) and a sliding window (Mistral);
    a qk norm the references do not model: a LayerNorm per head (Persimmon), an RMSNorm per head
    after the rotation (HunYuan)."""

    def __init__(self, hidden_size, n_head, n_kv_head, rope_theta=10000.0, partial_rotary_factor=1.0,
                 qk_norm=None, softcap=None, alibi=False, window=None, rope_scaling=1.0,
                 gate=False, subnorm=False, truncated=False, by_head=False):  # fmt: skip
        super().__init__()
        self.n_head, self.n_kv_head = n_head, n_kv_head
        self.head_dim = hidden_size // n_head
        self.rotary_dim = int(self.head_dim * partial_rotary_factor)
        self.rope_theta, self.softcap, self.alibi, self.window = rope_theta, softcap, alibi, window
        self.rope_scaling, self.truncated, self.by_head = rope_scaling, truncated, by_head
        self.q_proj = nn.Linear(hidden_size, n_head * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, n_kv_head * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, n_kv_head * self.head_dim, bias=False)
        self.o_proj = nn.Linear(n_head * self.head_dim, hidden_size, bias=False)
        self.gate = nn.Linear(hidden_size, n_head * self.head_dim, bias=False) if gate else None
        self.sub_norm = RMSNorm(n_head * self.head_dim) if subnorm else None
        self.qk_norm = qk_norm
        if qk_norm in ("head", "after"):
            self.q_norm, self.k_norm = RMSNorm(self.head_dim), RMSNorm(self.head_dim)
        elif qk_norm == "weightless":
            self.q_norm, self.k_norm = (
                WeightlessRMSNorm(self.head_dim),
                WeightlessRMSNorm(self.head_dim),
            )
        elif qk_norm == "layer":
            self.q_norm, self.k_norm = nn.LayerNorm(self.head_dim), nn.LayerNorm(self.head_dim)
        elif qk_norm == "width":
            self.q_norm = RMSNorm(n_head * self.head_dim)
            self.k_norm = RMSNorm(n_kv_head * self.head_dim)

    def forward(self, hidden_states):
        B, T, _ = hidden_states.shape
        hidden_shape = (B, T, -1, self.head_dim)
        q, k = self.q_proj(hidden_states), self.k_proj(hidden_states)
        if self.qk_norm == "width":
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.view(hidden_shape), k.view(hidden_shape)
        if self.qk_norm in ("head", "layer", "weightless"):
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        if self.truncated:
            q, k = truncated_rotary(q), truncated_rotary(k)
        elif self.by_head:
            q, k = by_head(q), by_head(k)
        elif not self.alibi:
            cos, sin = rotary(
                self.rotary_dim, T, self.rope_theta, hidden_states.device, self.rope_scaling
            )
            r = self.rotary_dim
            q = torch.cat((q[..., :r] * cos + rotate_half(q[..., :r]) * sin, q[..., r:]), dim=-1)
            k = torch.cat((k[..., :r] * cos + rotate_half(k[..., :r]) * sin, k[..., r:]), dim=-1)
        if self.qk_norm == "after":
            q, k = self.q_norm(q), self.k_norm(k)
        groups = self.n_head // self.n_kv_head
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.head_dim)
        if self.alibi == "baddbmm":  # BLOOM: alibi.baddbmm(q, k^T, beta=1, alpha=1/sqrt(hs))
            slopes = 2.0 ** (-8.0 * torch.arange(1, self.n_head + 1, device=q.device) / self.n_head)
            bias = (slopes[:, None] * torch.arange(T, device=q.device)).to(q.dtype)  # (nh, T)
            bias = bias[None, :, None, :].expand(B, -1, T, -1).reshape(B * self.n_head, T, T)
            hs = self.head_dim
            scores = bias.baddbmm(q.reshape(-1, T, hs), k.reshape(-1, T, hs).transpose(1, 2),
                                  beta=1.0, alpha=1 / math.sqrt(hs)).view(B, -1, T, T)  # fmt: skip
        if self.softcap is not None:
            scores = scores / self.softcap
            scores = torch.tanh(scores)
            scores = scores * self.softcap
        if self.alibi is True:
            slopes = 2.0 ** (-8.0 * torch.arange(1, self.n_head + 1, device=q.device) / self.n_head)
            i = torch.arange(T, device=q.device)
            scores = scores + slopes[:, None, None] * (i[None, :] - i[:, None]).to(q.dtype)
        scores = scores + causal(T, hidden_states, self.window)
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(B, T, -1)
        if self.gate is not None:  # Qwen3-Next's gated attention (HRM's too)
            out = torch.sigmoid(self.gate(hidden_states)) * out
        if self.sub_norm is not None:  # BitNet's attn_sub_norm: a norm, not a gate
            out = self.sub_norm(out)
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, hidden_size, intermediate_size, act=F.silu):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.act = act

    def forward(self, x):
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class Phi3MLP(nn.Module):
    """Phi-3's: gate and up packed in one matrix, split with chunk(2)."""

    def __init__(self, hidden_size, intermediate_size):
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, hidden_states):
        up_states = self.gate_up_proj(hidden_states)
        gate, up_states = up_states.chunk(2, dim=-1)
        return self.down_proj(up_states * F.silu(gate))


class W13MLP(nn.Module):
    """Up first, then gate, packed in ``w13`` and split by slicing."""

    def __init__(self, hidden_size, intermediate_size):
        super().__init__()
        self.hidden = intermediate_size
        self.w13 = nn.Linear(hidden_size, 2 * intermediate_size, bias=False)
        self.w2 = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x):
        h = self.w13(x)
        up, gate = h[..., : self.hidden], h[..., self.hidden :]
        return self.w2(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    """Llama's pre-norm layer; ``sandwich`` adds Gemma 2's norms after each sub-layer, inside
    its residual branch; ``pre=False`` drops the norms before them (OLMo 2)."""

    def __init__(self, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=64, mlp="llama", norm=RMSNorm, sandwich=False, pre=True,
                 **attention):  # fmt: skip
        super().__init__()
        self.self_attn = Attention(
            hidden_size, num_attention_heads, num_key_value_heads, **attention
        )
        if mlp == "phi3":
            self.mlp = Phi3MLP(hidden_size, intermediate_size)
        elif mlp == "w13":
            self.mlp = W13MLP(hidden_size, intermediate_size)
        elif mlp == "geglu":
            self.mlp = MLP(hidden_size, intermediate_size, lambda u: F.gelu(u, approximate="tanh"))
        else:
            self.mlp = MLP(hidden_size, intermediate_size)
        self.pre = pre
        if pre:
            self.input_layernorm = norm(hidden_size)
            self.pre_feedforward_layernorm = norm(hidden_size)
        self.sandwich = sandwich
        if sandwich:
            self.post_attention_layernorm = norm(hidden_size)
            self.post_feedforward_layernorm = norm(hidden_size)

    def forward(self, hidden_states):
        residual = hidden_states
        if self.pre:
            hidden_states = self.input_layernorm(hidden_states)
        hidden_states = self.self_attn(hidden_states)
        if self.sandwich:
            hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = residual + hidden_states
        residual = hidden_states
        if self.pre:
            hidden_states = self.pre_feedforward_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        if self.sandwich:
            hidden_states = self.post_feedforward_layernorm(hidden_states)
        return residual + hidden_states


class RopeHead(nn.Module):
    """The lecture's ``Head`` with Llama's rotation: its own q, k, v (B, T, C) -> (B, T, hs)."""

    def __init__(self, hidden_size, head_dim):
        super().__init__()
        self.q = nn.Linear(hidden_size, head_dim, bias=False)
        self.k = nn.Linear(hidden_size, head_dim, bias=False)
        self.v = nn.Linear(hidden_size, head_dim, bias=False)

    def forward(self, x):
        cos, sin = rotary(self.q.out_features, x.shape[1], 10000.0, x.device)  # (T, hs)
        q, k = self.q(x), self.k(x)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        return F.scaled_dot_product_attention(q, k, self.v(x), is_causal=True)


class PerHeadLlama(nn.Module):
    """A module a head, with Llama's rotation, RMSNorm and SwiGLU (s62: UNVERIFIED before)."""

    def __init__(self, hidden_size=32, num_attention_heads=4):
        super().__init__()
        hs = hidden_size // num_attention_heads
        self.heads = nn.ModuleList(RopeHead(hidden_size, hs) for _ in range(num_attention_heads))
        self.o_proj = nn.Linear(hidden_size, hidden_size, bias=False)
        self.mlp = MLP(hidden_size, 64)
        self.input_layernorm = RMSNorm(hidden_size)
        self.post_attention_layernorm = RMSNorm(hidden_size)

    def forward(self, x):
        h = self.input_layernorm(x)
        x = x + self.o_proj(torch.cat([head(h) for head in self.heads], dim=-1))
        return x + self.mlp(self.post_attention_layernorm(x))


def PartialRope(hidden_size=32, num_attention_heads=4):
    return DecoderLayer(hidden_size, num_attention_heads, rope_theta=8e6, partial_rotary_factor=0.5)


def PackedGateUp(hidden_size=32, num_attention_heads=4):
    return DecoderLayer(hidden_size, num_attention_heads, mlp="phi3")


def W13(hidden_size=32, num_attention_heads=4):
    return DecoderLayer(hidden_size, num_attention_heads, mlp="w13")


def Qwen3(hidden_size=32, num_attention_heads=4):
    return DecoderLayer(hidden_size, num_attention_heads, qk_norm="head", rope_theta=1e6)


def Gemma(hidden_size=32, num_attention_heads=4):
    return DecoderLayer(hidden_size, num_attention_heads, 1, mlp="geglu", norm=GemmaRMSNorm)


def SoftCap(hidden_size=32, num_attention_heads=4):
    return DecoderLayer(hidden_size, num_attention_heads, softcap=5.0)


def Sandwich(hidden_size=32, num_attention_heads=4):
    return DecoderLayer(hidden_size, num_attention_heads, sandwich=True)


def Gemma2(hidden_size=32, num_attention_heads=4):
    return DecoderLayer(hidden_size, num_attention_heads, 2, mlp="geglu", norm=GemmaRMSNorm,
                        sandwich=True, softcap=5.0)  # fmt: skip


def Olmo2(hidden_size=32, num_attention_heads=4):
    return DecoderLayer(hidden_size, num_attention_heads, 4, sandwich=True, pre=False,
                        qk_norm="width", rope_theta=5e5)  # fmt: skip


def WidthQkNorm(hidden_size=32, num_attention_heads=4):
    return DecoderLayer(hidden_size, num_attention_heads, qk_norm="width")


def Alibi(hidden_size=32, num_attention_heads=4):
    return DecoderLayer(hidden_size, num_attention_heads, alibi=True)


def AlibiBaddbmm(hidden_size=32, num_attention_heads=4):
    return DecoderLayer(hidden_size, num_attention_heads, alibi="baddbmm")


def TurnedByHead(hidden_size=32, num_attention_heads=4):  # (s93) a turn that cancels
    return DecoderLayer(hidden_size, num_attention_heads, num_attention_heads, by_head=True)


def LayerQkNorm(hidden_size=32, num_attention_heads=4):
    return DecoderLayer(hidden_size, num_attention_heads, qk_norm="layer")


def QkNormAfterRope(hidden_size=32, num_attention_heads=4):
    return DecoderLayer(hidden_size, num_attention_heads, qk_norm="after")


def Weightless(hidden_size=32, num_attention_heads=4):
    return DecoderLayer(
        hidden_size, num_attention_heads, norm=WeightlessRMSNorm, qk_norm="weightless"
    )


def GatedAttention(hidden_size=32, num_attention_heads=4):
    return DecoderLayer(hidden_size, num_attention_heads, gate=True)


def SubNorm(hidden_size=32, num_attention_heads=4):
    return DecoderLayer(hidden_size, num_attention_heads, subnorm=True)


def ScaledRope(hidden_size=32, num_attention_heads=4):
    return DecoderLayer(hidden_size, num_attention_heads, rope_scaling=4.0)


def ScaledRopeQkNorm(hidden_size=32, num_attention_heads=4):  # Apertus: Llama 3's scaling too
    return DecoderLayer(hidden_size, num_attention_heads, rope_scaling=4.0, qk_norm="head")


def TruncatedRope(hidden_size=32, num_attention_heads=4):
    return DecoderLayer(hidden_size, num_attention_heads, truncated=True)


def TruncatedRopeQkNorm(hidden_size=32, num_attention_heads=4):
    return DecoderLayer(hidden_size, num_attention_heads, truncated=True, qk_norm="head")


def Sliding(hidden_size=32, num_attention_heads=4):
    return DecoderLayer(hidden_size, num_attention_heads, window=3)


def WideWindow(hidden_size=32, num_attention_heads=4, max_seq_len=16):
    """A window of 8: wider than the traced sequences (7), narrower than the file's (16)."""
    return DecoderLayer(hidden_size, num_attention_heads, window=8)


def FullWindow(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, max_seq_len=16):
    """A window of 16 (Mistral's ``window_size``, not a size) at the file's length of 16: causal
    there; the checker's other sizes are longer, where the window bites."""
    return DecoderLayer(hidden_size, num_attention_heads, num_key_value_heads, window=16)


class CausalSelfAttention(nn.Module):
    """nanoGPT's, with a learned temperature (``temperature``: a parameter multiplying the
    scores, initialised to 1 / sqrt(hs)) or soft-capped logits (``softcap``)."""

    def __init__(self, n_embd, n_head, temperature=False, softcap=None):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head, self.n_embd, self.softcap = n_head, n_embd, softcap
        hs = n_embd // n_head
        self.temperature = nn.Parameter(torch.tensor(hs**-0.5)) if temperature else None

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = q @ k.transpose(-2, -1)
        if self.temperature is not None:
            att = att * self.temperature
        else:
            att = att * (1.0 / math.sqrt(k.size(-1)))
        if self.softcap is not None:
            att = self.softcap * torch.tanh(att / self.softcap)
        mask = torch.tril(torch.ones(T, T, device=x.device)).view(1, 1, T, T)
        att = att.masked_fill(mask == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class GPT2Block(nn.Module):
    def __init__(self, n_embd=32, n_head=4, temperature=False, softcap=None, act=F.gelu):
        super().__init__()
        self.act = act
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, temperature, softcap)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(self.act(self.c_fc(self.ln_2(x))))


def SiluGPT2(n_embd=32, n_head=4):  # a dense MLP: the lessons' reference tries GELU and ReLU
    return GPT2Block(n_embd, n_head, act=F.silu)


def Relu2GPT2(n_embd=32, n_head=4):  # the speedrun's relu(x)^2
    return GPT2Block(n_embd, n_head, act=lambda u: F.relu(u).square())


def QuickGeluGPT2(n_embd=32, n_head=4):  # OpenAI CLIP's x * sigmoid(1.702 x)
    return GPT2Block(n_embd, n_head, act=lambda u: u * torch.sigmoid(1.702 * u))


def SoftCapGPT2(n_embd=32, n_head=4):
    return GPT2Block(n_embd, n_head, softcap=5.0)


class LayerScaleGPT2(GPT2Block):
    """CaiT's LayerScale: each branch's output times a learned per-channel gain."""

    def __init__(self, n_embd=32, n_head=4, init=0.1):
        super().__init__(n_embd, n_head)
        self.gamma_1 = nn.Parameter(torch.full((n_embd,), init))
        self.gamma_2 = nn.Parameter(torch.full((n_embd,), init))

    def forward(self, x):
        x = x + self.gamma_1 * self.attn(self.ln_1(x))
        return x + self.gamma_2 * self.c_proj(F.gelu(self.c_fc(self.ln_2(x))))


def ReZeroGPT2(n_embd=32, n_head=4):  # ReZero's alpha: a gain of one value, 0 at first
    return LayerScaleGPT2(n_embd, n_head, init=0.0)


class PositionsGPT2(GPT2Block):
    """A GPT-2 block adding a fixed sinusoid table to its input first (the s84 unseen set)."""

    def __init__(self, n_embd=32, n_head=4, block_size=16):
        super().__init__(n_embd, n_head)
        at = torch.arange(block_size)[:, None] * torch.logspace(0, -4, n_embd // 2, base=10.0)
        self.register_buffer("pe", torch.cat((at.sin(), at.cos()), dim=-1))  # (block_size, C)

    def forward(self, x):
        x = x + self.pe[: x.shape[1]]  # (T, C), broadcast over the batch
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x))))


class LeakyGPT2(GPT2Block):
    """A GPT-2 block whose MLP's activation is a LeakyReLU (the s22 unseen set)."""

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.leaky_relu(self.c_fc(self.ln_2(x))))


class TanhGPT2(GPT2Block):
    """A GPT-2 block whose MLP's activation is a tanh: named by its values, not its operator (a
    tanh is also a piece of the tanh GELU), as is the hand-written sigmoid of ``SigmoidGPT2``."""

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(torch.tanh(self.c_fc(self.ln_2(x))))


class SigmoidGPT2(GPT2Block):
    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(1 / (1 + torch.exp(-self.c_fc(self.ln_2(x)))))


class EluLlama(DecoderLayer):
    """A Llama layer whose MLP's gate is an ELU: the modern reading names it too."""

    def __init__(self, hidden_size=32, num_attention_heads=4):
        super().__init__(hidden_size, num_attention_heads)
        self.mlp.act = F.elu


def TemperatureGPT2(n_embd=32, n_head=4):
    return GPT2Block(n_embd, n_head, temperature=True)


class MoEGPT2(GPT2Block):
    """A GPT-2 block whose MLP is a mixture of experts: the top 2 of 4 GELU MLPs, chosen per
    token by a router (the s19 unseen set's gqa_moe): no reference models it."""

    def __init__(self, n_embd=32, n_head=4, experts=4):
        super().__init__(n_embd, n_head)
        del self.c_fc, self.c_proj
        self.router = nn.Linear(n_embd, experts, bias=False)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(n_embd, 2 * n_embd), nn.GELU(), nn.Linear(2 * n_embd, n_embd))
            for _ in range(experts)
        )

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        h = self.ln_2(x)
        weight, chosen = self.router(h).softmax(-1).topk(2, dim=-1)  # (B, T, 2)
        out = torch.zeros_like(h)
        for i, expert in enumerate(self.experts):
            out = out + (weight * (chosen == i)).sum(-1, keepdim=True) * expert(h)
        return x + out
