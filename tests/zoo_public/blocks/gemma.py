# Source: google/gemma_pytorch, gemma/model.py
#   commit c20d7ea7a961e813bea9401825a71f887c8c2336: RMSNorm, Linear, GemmaMLP, GemmaAttention,
#   GemmaDecoderLayer (and the mask GemmaForCausalLM builds).
# Kept: GemmaDecoderLayer(config) with a GemmaConfig-like dataclass, the norm gain stored as an
# offset from 1 (weight initialised to zeros, used as 1 + weight), Gemma's own Linear holding a
# frozen (requires_grad=False) weight used through F.linear, the fused qkv_proj split by sizes,
# the queries scaled (q.mul(self.scaling)) before the product, the additive mask of
# -2.3819763e38 above the diagonal, the float32 softmax, input_layernorm /
# post_attention_layernorm with explicit `residual` variables.
# Reduced: RMSNorm's maths made the lessons' LayerNorm (no bias), keeping 1 + weight; the GeGLU
# MLP (gate_proj, up_proj, down_proj) made down_proj(gelu_tanh(gate_proj(x))) of width 4C; no
# rotary embedding, kv cache, quantisation, sliding window or softcapping; q.mul_(self.scaling)
# made out of place (Gemma runs it under no_grad: in place on a split view, it cannot be trained
# through), the source's own line being the zoo's `inplace` mistake.
import dataclasses

import torch
import torch.nn.functional as F
from torch import nn


@dataclasses.dataclass
class GemmaConfig:
    hidden_size: int = 3072
    intermediate_size: int = 24576
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: int = 256
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 8192
    quant: bool = False


class RMSNorm(torch.nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6, add_unit_offset: bool = True):
        super().__init__()
        self.eps = eps
        self.add_unit_offset = add_unit_offset
        self.weight = nn.Parameter(torch.zeros(dim))

    def _norm(self, x):
        x = x - x.mean(-1, keepdim=True)  # the zoo's reduction: LayerNorm's maths
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        output = self._norm(x.float())
        if self.add_unit_offset:
            output = output * (1 + self.weight.float())
        else:
            output = output * self.weight.float()
        return output.type_as(x)


class Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, quant: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.empty((out_features, in_features)), requires_grad=False)
        nn.init.normal_(self.weight, std=in_features**-0.5)
        self.quant = quant

    def forward(self, x):
        weight = self.weight
        output = F.linear(x, weight)
        return output


class GemmaMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, quant: bool):
        super().__init__()
        self.gate_proj = Linear(hidden_size, intermediate_size, quant)
        self.down_proj = Linear(intermediate_size, hidden_size, quant)

    def forward(self, x):
        gate = self.gate_proj(x)
        gate = F.gelu(gate, approximate="tanh")
        outputs = self.down_proj(gate)
        return outputs


class GemmaAttention(nn.Module):
    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, quant: bool):
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads

        assert self.num_heads % self.num_kv_heads == 0
        self.num_queries_per_kv = self.num_heads // self.num_kv_heads

        self.hidden_size = hidden_size
        self.head_dim = head_dim

        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim

        self.scaling = self.head_dim**-0.5

        self.qkv_proj = Linear(self.hidden_size, (self.num_heads + 2 * self.num_kv_heads) * self.head_dim, quant=quant)
        self.o_proj = Linear(self.num_heads * self.head_dim, self.hidden_size, quant=quant)

    def forward(self, hidden_states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        hidden_states_shape = hidden_states.shape
        assert len(hidden_states_shape) == 3

        batch_size, input_len, _ = hidden_states_shape

        qkv = self.qkv_proj(hidden_states)
        xq, xk, xv = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)

        xq = xq.view(batch_size, -1, self.num_heads, self.head_dim)
        xk = xk.view(batch_size, -1, self.num_kv_heads, self.head_dim)
        xv = xv.view(batch_size, -1, self.num_kv_heads, self.head_dim)

        key = xk
        value = xv
        if self.num_kv_heads != self.num_heads:
            # [batch_size, max_seq_len, n_local_heads, head_dim]
            key = torch.repeat_interleave(key, self.num_queries_per_kv, dim=2)
            value = torch.repeat_interleave(value, self.num_queries_per_kv, dim=2)

        # [batch_size, n_local_heads, input_len, head_dim]
        q = xq.transpose(1, 2)
        # [batch_size, n_local_heads, max_seq_len, head_dim]
        k = key.transpose(1, 2)
        v = value.transpose(1, 2)

        # [batch_size, n_local_heads, input_len, max_seq_len]
        q = q.mul(self.scaling)
        scores = torch.matmul(q, k.transpose(2, 3))
        scores = scores + mask
        scores = F.softmax(scores.float(), dim=-1).type_as(q)

        # [batch_size, n_local_heads, input_len, head_dim]
        output = torch.matmul(scores, v)

        # [batch_size, input_len, hidden_dim]
        output = output.transpose(1, 2).contiguous().view(batch_size, input_len, -1)
        output = self.o_proj(output)
        return output


class GemmaDecoderLayer(nn.Module):
    def __init__(self, config: GemmaConfig):
        super().__init__()
        self.self_attn = GemmaAttention(
            hidden_size=config.hidden_size,
            num_heads=config.num_attention_heads,
            num_kv_heads=config.num_key_value_heads,
            head_dim=config.head_dim,
            quant=config.quant,
        )
        self.mlp = GemmaMLP(
            hidden_size=config.hidden_size, intermediate_size=config.intermediate_size, quant=config.quant
        )
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        max_seq_len = config.max_position_embeddings
        mask_tensor = torch.full((1, 1, max_seq_len, max_seq_len), -2.3819763e38).to(torch.float)
        mask_tensor = torch.triu(mask_tensor, diagonal=1)
        self.register_buffer("mask_tensor", mask_tensor, persistent=False)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_len = hidden_states.shape[1]
        mask = self.mask_tensor[:, :, :input_len, :input_len]

        # Self Attention
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states = self.self_attn(hidden_states=hidden_states, mask=mask)
        hidden_states = residual + hidden_states

        # MLP
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        hidden_states = residual + hidden_states

        return hidden_states


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "google/gemma_pytorch gemma/model.py @ c20d7ea7a961e813bea9401825a71f887c8c2336"
REFERENCE = {"n_head": 4, "activation": "gelu_tanh", "norm_eps": 1e-6}
BLOCK = GemmaDecoderLayer
ARGS = {
    "config": GemmaConfig(
        hidden_size=32, intermediate_size=128, num_attention_heads=4, num_key_value_heads=4, head_dim=8,
        max_position_embeddings=16,
    )
}  # fmt: skip
TOLERANCE = 1e-6  # the norm and the softmax compute in float32, as Gemma's do


def weights(b):
    a, m = b.self_attn, b.mlp
    q, k, v = a.qkv_proj.weight.split(a.q_size)
    return {
        "ln1": (1 + b.input_layernorm.weight, None),  # the gain is stored as an offset from 1
        "q": (q, None),
        "k": (k, None),
        "v": (v, None),
        "proj": (a.o_proj.weight, None),
        "ln2": (1 + b.post_attention_layernorm.weight, None),
        "fc1": (m.gate_proj.weight, None),
        "fc2": (m.down_proj.weight, None),
    }


RES1 = "hidden_states = self.self_attn(hidden_states=hidden_states, mask=mask)\n        hidden_states = residual + hidden_states"
RES2 = "hidden_states = self.mlp(hidden_states)\n        hidden_states = residual + hidden_states"
MISTAKES = {
    "no_scaling": [("q = q.mul(self.scaling)\n", "\n")],
    "inplace": [("q = q.mul(self.scaling)\n", "q.mul_(self.scaling)\n")],  # the source's own line
    "wrong_scale": [("self.scaling = self.head_dim**-0.5", "self.scaling = self.hidden_size**-0.5")],
    "wrong_scale:1/hs": [("self.scaling = self.head_dim**-0.5", "self.scaling = self.head_dim**-1")],
    "future_leak": [("scores = scores + mask\n", "\n")],
    "mask_reversed": [("mask_tensor = torch.triu(mask_tensor, diagonal=1)", "mask_tensor = torch.tril(mask_tensor)")],
    "softmax_dim": [
        (
            "scores = F.softmax(scores.float(), dim=-1).type_as(q)",
            "scores = F.softmax(scores.float(), dim=-2).type_as(q)",
        )
    ],
    "heads_mixed:merge": [
        (
            "output = output.transpose(1, 2).contiguous().view(batch_size, input_len, -1)",
            "output = output.contiguous().view(batch_size, input_len, -1)",
        )
    ],
    "no_residual:attn": [(RES1, RES1.replace("residual + hidden_states", "hidden_states"))],
    "no_residual:mlp": [(RES2, RES2.replace("residual + hidden_states", "hidden_states"))],
    "shared_norm": [
        (
            "hidden_states = self.post_attention_layernorm(hidden_states)",
            "hidden_states = self.input_layernorm(hidden_states)",
        )
    ],
    "post_norm": [
        ("        hidden_states = self.input_layernorm(hidden_states)\n", ""),
        (RES1, RES1.replace("residual + hidden_states", "self.input_layernorm(residual + hidden_states)")),
        ("        hidden_states = self.post_attention_layernorm(hidden_states)\n", ""),
        (RES2, RES2.replace("residual + hidden_states", "self.post_attention_layernorm(residual + hidden_states)")),
    ],
}
PAIRS = [("no_scaling", "post_norm"), ("mask_reversed", "no_residual:mlp")]
