# Source: huggingface/transformers, src/transformers/models/gpt2/modeling_gpt2.py
#   commit c44b2d9976e8eafbdcb89cb2710141b2bc9b138f: Conv1D (pytorch_utils), GPT2Attention
#   (eager_attention_forward), GPT2MLP, GPT2Block.
# Kept: GPT2Block(config) with a GPT2Config-like config, Conv1D weights stored (in, out) and used
# through torch.addmm, packed c_attn split in thirds, the bool `bias` buffer and torch.where with
# finfo.min, gelu_new, scale_attn_weights dividing by value.size(-1) ** 0.5. Reduced: no cache,
# no cross-attention, no head mask, no attention-implementation dispatch.
from types import SimpleNamespace

import torch
import torch.nn as nn
import torch.nn.functional as F


class Conv1D(nn.Module):
    """
    1D-convolutional layer as defined by Radford et al. for OpenAI GPT (and also used in GPT-2).

    Basically works like a linear layer but the weights are transposed.
    """

    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.nx = nx
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        x = x.view(size_out)
        return x


def eager_attention_forward(module, query, key, value, attention_mask, head_mask=None, **kwargs):
    attn_weights = torch.matmul(query, key.transpose(-1, -2))

    if module.scale_attn_weights:
        attn_weights = attn_weights / torch.full(
            [], value.size(-1) ** 0.5, dtype=attn_weights.dtype, device=attn_weights.device
        )

    if not module.is_cross_attention:
        # if only "normal" attention layer implements causal mask
        query_length, key_length = query.size(-2), key.size(-2)
        causal_mask = module.bias[:, :, key_length - query_length : key_length, :key_length]
        mask_value = torch.finfo(attn_weights.dtype).min
        # Need to be a tensor, otherwise we get error: `RuntimeError: expected scalar type float but found double`.
        # Need to be on the same device, otherwise `RuntimeError: ..., x and y to be on the same device`
        mask_value = torch.full([], mask_value, dtype=attn_weights.dtype, device=attn_weights.device)
        attn_weights = torch.where(causal_mask, attn_weights.to(attn_weights.dtype), mask_value)

    attn_weights = nn.functional.softmax(attn_weights, dim=-1)

    # Downcast (if necessary) back to V's dtype (if in mixed-precision) -- No-Op otherwise
    attn_weights = attn_weights.type(value.dtype)
    attn_weights = module.attn_dropout(attn_weights)

    attn_output = torch.matmul(attn_weights, value)
    attn_output = attn_output.transpose(1, 2)

    return attn_output, attn_weights


class GPT2Attention(nn.Module):
    def __init__(self, config, is_cross_attention=False, layer_idx=None):
        super().__init__()
        self.config = config
        max_positions = config.max_position_embeddings
        self.register_buffer(
            "bias",
            torch.tril(torch.ones((max_positions, max_positions), dtype=torch.bool)).view(
                1, 1, max_positions, max_positions
            ),
            persistent=False,
        )

        self.embed_dim = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_dim = self.embed_dim // self.num_heads
        self.split_size = self.embed_dim

        self.scale_attn_weights = config.scale_attn_weights
        self.is_cross_attention = is_cross_attention
        self.layer_idx = layer_idx

        self.c_attn = Conv1D(3 * self.embed_dim, self.embed_dim)
        self.c_proj = Conv1D(self.embed_dim, self.embed_dim)

        self.attn_dropout = nn.Dropout(config.attn_pdrop)
        self.resid_dropout = nn.Dropout(config.resid_pdrop)
        self.is_causal = True

    def forward(self, hidden_states, attention_mask=None):
        query_states, key_states, value_states = self.c_attn(hidden_states).split(self.split_size, dim=2)

        shape_q = (*query_states.shape[:-1], -1, self.head_dim)
        shape_kv = (*key_states.shape[:-1], -1, self.head_dim)

        query_states = query_states.view(shape_q).transpose(1, 2)
        key_states = key_states.view(shape_kv).transpose(1, 2)
        value_states = value_states.view(shape_kv).transpose(1, 2)

        attn_output, attn_weights = eager_attention_forward(
            self, query_states, key_states, value_states, attention_mask, dropout=0.0
        )

        attn_output = attn_output.reshape(*attn_output.shape[:-2], -1).contiguous()
        attn_output = self.c_proj(attn_output)
        attn_output = self.resid_dropout(attn_output)

        return attn_output, attn_weights


class GPT2MLP(nn.Module):
    def __init__(self, intermediate_size, config):
        super().__init__()
        embed_dim = config.hidden_size
        self.c_fc = Conv1D(intermediate_size, embed_dim)
        self.c_proj = Conv1D(embed_dim, intermediate_size)
        self.act = lambda x: F.gelu(x, approximate="tanh")  # ACT2FN["gelu_new"]
        self.dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, hidden_states):
        hidden_states = self.c_fc(hidden_states)
        hidden_states = self.act(hidden_states)
        hidden_states = self.c_proj(hidden_states)
        hidden_states = self.dropout(hidden_states)
        return hidden_states


class GPT2Block(nn.Module):
    def __init__(self, config, layer_idx=None):
        super().__init__()
        hidden_size = config.hidden_size
        inner_dim = config.n_inner if config.n_inner is not None else 4 * hidden_size

        self.ln_1 = nn.LayerNorm(hidden_size, eps=config.layer_norm_epsilon)
        self.attn = GPT2Attention(config=config, layer_idx=layer_idx)
        self.ln_2 = nn.LayerNorm(hidden_size, eps=config.layer_norm_epsilon)
        self.mlp = GPT2MLP(inner_dim, config)

    def forward(self, hidden_states):
        residual = hidden_states
        hidden_states = self.ln_1(hidden_states)
        attn_output, self_attn_weights = self.attn(hidden_states)
        # residual connection
        hidden_states = attn_output + residual

        residual = hidden_states
        hidden_states = self.ln_2(hidden_states)
        feed_forward_hidden_states = self.mlp(hidden_states)
        # residual connection
        hidden_states = residual + feed_forward_hidden_states

        return hidden_states


# ----- the zoo's data (the checker never sees it) -----

SOURCE = (
    "huggingface/transformers src/transformers/models/gpt2/modeling_gpt2.py @ c44b2d9976e8eafbdcb89cb2710141b2bc9b138f"
)
REFERENCE = {"n_head": 4, "activation": "gelu_tanh", "norm_eps": 1e-5}


BLOCK = GPT2Block
ARGS = {
    "config": SimpleNamespace(
        hidden_size=32, num_attention_heads=4, n_inner=None, max_position_embeddings=16,
        layer_norm_epsilon=1e-5, scale_attn_weights=True, attn_pdrop=0.1, resid_pdrop=0.1,
    )
}  # fmt: skip


def weights(b):
    a, m = b.attn, b.mlp
    q, k, v = a.c_attn.weight.T.chunk(3)  # Conv1D stores (in, out)
    bq, bk, bv = a.c_attn.bias.chunk(3)
    return {
        "ln1": (b.ln_1.weight, b.ln_1.bias),
        "q": (q, bq),
        "k": (k, bk),
        "v": (v, bv),
        "proj": (a.c_proj.weight.T, a.c_proj.bias),
        "ln2": (b.ln_2.weight, b.ln_2.bias),
        "fc1": (m.c_fc.weight.T, m.c_fc.bias),
        "fc2": (m.c_proj.weight.T, m.c_proj.bias),
    }


SCALE = "value.size(-1) ** 0.5, dtype"
WHERE = "attn_weights = torch.where(causal_mask, attn_weights.to(attn_weights.dtype), mask_value)\n"
SOFTMAX = "attn_weights = nn.functional.softmax(attn_weights, dim=-1)\n"
RES1 = "hidden_states = attn_output + residual"
RES2 = "hidden_states = residual + feed_forward_hidden_states"
MISTAKES = {
    "no_scaling": [("if module.scale_attn_weights:", "if False:  # module.scale_attn_weights")],
    "wrong_scale": [(SCALE, "module.embed_dim ** 0.5, dtype")],
    "wrong_scale:1/hs": [(SCALE, "value.size(-1), dtype")],
    "future_leak": [("if not module.is_cross_attention:", "if module.is_cross_attention:")],
    "mask_reversed": [(WHERE, WHERE.replace("torch.where(causal_mask", "torch.where(~causal_mask"))],
    "mask_zero": [("mask_value = torch.finfo(attn_weights.dtype).min", "mask_value = 0.0")],
    "softmax_dim": [(SOFTMAX, SOFTMAX.replace("dim=-1", "dim=-2"))],
    "no_residual:attn": [(RES1, "hidden_states = attn_output")],
    "no_residual:mlp": [(RES2, "hidden_states = feed_forward_hidden_states")],
    "shared_norm": [("hidden_states = self.ln_2(hidden_states)", "hidden_states = self.ln_1(hidden_states)")],
    "post_norm": [
        (
            "residual = hidden_states\n        hidden_states = self.ln_1(hidden_states)\n        attn_output, self_attn_weights = self.attn(hidden_states)",
            "residual = hidden_states\n        attn_output, self_attn_weights = self.attn(hidden_states)",
        ),
        (RES1, "hidden_states = self.ln_1(attn_output + residual)"),
        ("        hidden_states = self.ln_2(hidden_states)\n", ""),
        (RES2, "hidden_states = self.ln_2(residual + feed_forward_hidden_states)"),
    ],
}
PAIRS = [("wrong_scale", "no_residual:mlp"), ("mask_zero", "shared_norm")]
