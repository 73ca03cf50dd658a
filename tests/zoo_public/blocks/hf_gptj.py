# Source: huggingface/transformers, src/transformers/models/gptj/modeling_gptj.py
#   commit 00b676f8f0489b88652a31d70751cc540dd06305: GPTJAttention (_split_heads, _merge_heads,
#   _attn), GPTJMLP, GPTJBlock.
# Kept: GPTJBlock(config) with a GPTJConfig-like config; bias-free q_proj / k_proj / v_proj /
# out_proj; self.scale_attn = sqrt(head_dim) as a float32 tensor; _split_heads(tensor, nh, hs,
# rotary) leaving q and k as (batch, seq, head, hs) and permuting them afterwards; the scores
# computed in float32 (query.to(torch.float32), key.to(torch.float32)) and divided by
# scale_attn; the additive causal mask sliced `[:, :, :, : key.shape[-2]]` and added; the weights
# cast back to value's dtype; _merge_heads; fc_in / fc_out with gelu_new; the attention returning
# (attn_output, attn_weights).
# Reduced: no rotary embedding (q and k are permuted without it); the additive mask (finfo.min
# above the diagonal, which the model's _update_causal_mask builds) is built by the block when
# given none; GPT-J's block is parallel (x + attn(ln_1(x)) + mlp(ln_1(x))): here sequential, with
# a second norm ln_2; no cache, no head mask.
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn


class GPTJAttention(nn.Module):
    def __init__(self, config, layer_idx=None):
        super().__init__()
        self.config = config
        max_positions = config.max_position_embeddings

        self.attn_dropout = nn.Dropout(config.attn_pdrop)
        self.resid_dropout = nn.Dropout(config.resid_pdrop)

        self.is_causal = True
        self.layer_idx = layer_idx

        self.embed_dim = config.hidden_size
        self.num_attention_heads = config.num_attention_heads
        self.head_dim = self.embed_dim // self.num_attention_heads
        if self.head_dim * self.num_attention_heads != self.embed_dim:
            raise ValueError(
                f"embed_dim must be divisible by num_attention_heads (got `embed_dim`: {self.embed_dim} and"
                f" `num_attention_heads`: {self.num_attention_heads})."
            )
        self.scale_attn = torch.sqrt(torch.tensor(self.head_dim, dtype=torch.float32)).to(torch.get_default_dtype())

        self.k_proj = nn.Linear(self.embed_dim, self.embed_dim, bias=False)
        self.v_proj = nn.Linear(self.embed_dim, self.embed_dim, bias=False)
        self.q_proj = nn.Linear(self.embed_dim, self.embed_dim, bias=False)
        self.out_proj = nn.Linear(self.embed_dim, self.embed_dim, bias=False)

    def _split_heads(self, tensor, num_attention_heads, attn_head_size, rotary):
        """
        Splits hidden dim into attn_head_size and num_attention_heads
        """
        new_shape = tensor.size()[:-1] + (num_attention_heads, attn_head_size)
        tensor = tensor.view(new_shape)
        if rotary:
            return tensor
        if len(tensor.shape) == 5:
            return tensor.permute(0, 1, 3, 2, 4)  # (batch, blocks, head, block_length, head_features)
        elif len(tensor.shape) == 4:
            return tensor.permute(0, 2, 1, 3)  # (batch, head, seq_length, head_features)
        else:
            raise ValueError(f"Input tensor rank should be one of [4, 5], but is: {len(tensor.shape)}")

    def _merge_heads(self, tensor, num_attention_heads, attn_head_size):
        """
        Merges attn_head_size dim and num_attn_heads dim into hidden dim
        """
        if len(tensor.shape) == 5:
            tensor = tensor.permute(0, 1, 3, 2, 4).contiguous()
        elif len(tensor.shape) == 4:
            tensor = tensor.permute(0, 2, 1, 3).contiguous()
        else:
            raise ValueError(f"Input tensor rank should be one of [4, 5], but is: {len(tensor.shape)}")
        new_shape = tensor.size()[:-2] + (num_attention_heads * attn_head_size,)
        return tensor.view(new_shape)

    def _attn(
        self,
        query,
        key,
        value,
        attention_mask=None,
        head_mask=None,
    ):
        # Keep the attention weights computation in fp32 to avoid overflow issues
        query = query.to(torch.float32)
        key = key.to(torch.float32)

        attn_weights = torch.matmul(query, key.transpose(-1, -2))
        attn_weights = attn_weights / self.scale_attn

        if attention_mask is not None:  # no matter the length, we just slice it
            causal_mask = attention_mask[:, :, :, : key.shape[-2]]
            attn_weights = attn_weights + causal_mask

        attn_weights = nn.functional.softmax(attn_weights, dim=-1)
        attn_weights = attn_weights.to(value.dtype)
        attn_weights = self.attn_dropout(attn_weights)

        # Mask heads if we want to
        if head_mask is not None:
            attn_weights = attn_weights * head_mask

        attn_output = torch.matmul(attn_weights, value)

        return attn_output, attn_weights

    def forward(self, hidden_states, attention_mask=None, head_mask=None):
        query = self.q_proj(hidden_states)
        key = self.k_proj(hidden_states)
        value = self.v_proj(hidden_states)

        query = self._split_heads(query, self.num_attention_heads, self.head_dim, True)
        key = self._split_heads(key, self.num_attention_heads, self.head_dim, True)
        value = self._split_heads(value, self.num_attention_heads, self.head_dim, False)

        key = key.permute(0, 2, 1, 3)
        query = query.permute(0, 2, 1, 3)

        # compute self-attention: V x Softmax(QK^T)
        attn_output, attn_weights = self._attn(query, key, value, attention_mask, head_mask)

        attn_output = self._merge_heads(attn_output, self.num_attention_heads, self.head_dim)
        attn_output = self.out_proj(attn_output)
        attn_output = self.resid_dropout(attn_output)

        return attn_output, attn_weights


class GPTJMLP(nn.Module):
    def __init__(self, intermediate_size, config):  # in MLP: intermediate_size= 4 * embed_dim
        super().__init__()
        embed_dim = config.n_embd

        self.fc_in = nn.Linear(embed_dim, intermediate_size)
        self.fc_out = nn.Linear(intermediate_size, embed_dim)

        self.act = lambda x: F.gelu(x, approximate="tanh")  # ACT2FN[config.activation_function], gelu_new
        self.dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, hidden_states):
        hidden_states = self.fc_in(hidden_states)
        hidden_states = self.act(hidden_states)
        hidden_states = self.fc_out(hidden_states)
        hidden_states = self.dropout(hidden_states)
        return hidden_states


class GPTJBlock(nn.Module):
    def __init__(self, config, layer_idx=None):
        super().__init__()
        inner_dim = config.n_inner if config.n_inner is not None else 4 * config.n_embd
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = GPTJAttention(config, layer_idx)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = GPTJMLP(inner_dim, config)

    def forward(self, hidden_states, attention_mask=None, head_mask=None):
        if attention_mask is None:
            T = hidden_states.shape[1]
            attention_mask = torch.full((T, T), torch.finfo(torch.float32).min).triu(1)[None, None]
        residual = hidden_states
        hidden_states = self.ln_1(hidden_states)
        attn_outputs = self.attn(
            hidden_states=hidden_states,
            attention_mask=attention_mask,
            head_mask=head_mask,
        )
        attn_output = attn_outputs[0]  # output_attn: a, present, (attentions)

        hidden_states = attn_output + residual
        residual = hidden_states
        hidden_states = self.ln_2(hidden_states)
        feed_forward_hidden_states = self.mlp(hidden_states)
        hidden_states = feed_forward_hidden_states + residual

        return hidden_states


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "huggingface/transformers src/transformers/models/gptj/modeling_gptj.py @ 00b676f8f0489b88652a31d70751cc540dd06305"
REFERENCE = {"n_head": 4, "activation": "gelu_tanh", "norm_eps": 1e-5}
TOLERANCE = 1e-6  # the scores are computed in float32, as the source computes them
BLOCK = GPTJBlock
ARGS = {
    "config": SimpleNamespace(
        n_embd=32, hidden_size=32, num_attention_heads=4, n_inner=None, max_position_embeddings=16,
        layer_norm_epsilon=1e-5, attn_pdrop=0.1, resid_pdrop=0.1, rotary_dim=None,
    )
}  # fmt: skip


def weights(b):
    a, m = b.attn, b.mlp
    return {
        "ln1": (b.ln_1.weight, b.ln_1.bias),
        "q": (a.q_proj.weight, None),
        "k": (a.k_proj.weight, None),
        "v": (a.v_proj.weight, None),
        "proj": (a.out_proj.weight, None),
        "ln2": (b.ln_2.weight, b.ln_2.bias),
        "fc1": (m.fc_in.weight, m.fc_in.bias),
        "fc2": (m.fc_out.weight, m.fc_out.bias),
    }


SCALE = "attn_weights = attn_weights / self.scale_attn"
MASK = "attention_mask = torch.full((T, T), torch.finfo(torch.float32).min).triu(1)[None, None]"
SOFTMAX = "attn_weights = nn.functional.softmax(attn_weights, dim=-1)"
R1 = "hidden_states = attn_output + residual"
R2 = "hidden_states = feed_forward_hidden_states + residual"
MISTAKES = {
    "no_scaling": [(SCALE, "attn_weights = attn_weights")],
    "wrong_scale": [("self.scale_attn = torch.sqrt(torch.tensor(self.head_dim,", "self.scale_attn = torch.sqrt(torch.tensor(self.embed_dim,")],
    "wrong_scale:1/hs": [(SCALE, "attn_weights = attn_weights / self.head_dim")],
    "future_leak": [("attn_weights = attn_weights + causal_mask", "attn_weights = attn_weights")],
    "mask_reversed": [(MASK, "attention_mask = torch.full((T, T), torch.finfo(torch.float32).min).tril()[None, None]")],
    "softmax_dim": [(SOFTMAX, "attn_weights = nn.functional.softmax(attn_weights, dim=-2)")],
    "heads_mixed:merge": [
        ("tensor = tensor.permute(0, 2, 1, 3).contiguous()", "tensor = tensor.contiguous()"),
        ("new_shape = tensor.size()[:-2] + (num_attention_heads * attn_head_size,)",
         "new_shape = (tensor.size(0), tensor.size(2), num_attention_heads * attn_head_size)"),
    ],
    "no_residual:attn": [(R1, "hidden_states = attn_output")],
    "no_residual:mlp": [(R2, "hidden_states = feed_forward_hidden_states")],
    "shared_norm": [("hidden_states = self.ln_2(hidden_states)", "hidden_states = self.ln_1(hidden_states)")],
    "post_norm": [
        ("        hidden_states = self.ln_1(hidden_states)\n", ""),
        (R1, "hidden_states = self.ln_1(attn_output + residual)"),
        ("        hidden_states = self.ln_2(hidden_states)\n", ""),
        (R2, "hidden_states = self.ln_2(feed_forward_hidden_states + residual)"),
    ],
}
PAIRS = [("wrong_scale", "shared_norm")]
