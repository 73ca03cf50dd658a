# Source: huggingface/transformers, src/transformers/models/gpt_neo/modeling_gpt_neo.py
#   commit 002fb3e7a2db86cef2160e206c878ff895b74ef0: GPTNeoSelfAttention, GPTNeoAttention,
#   GPTNeoMLP, GPTNeoBlock.
# Kept: GPTNeoBlock(config, layer_id) with a GPTNeoConfig-like config and its attention_layers
# list ("global" / "local"), the wrapper GPTNeoAttention choosing GPTNeoSelfAttention by layer,
# bias-free q_proj / k_proj / v_proj and out_proj with a bias, _split_heads / _merge_heads
# (view + permute), the scores in float32, the bool `bias` buffer and torch.where with the
# `masked_bias` buffer (-1e9), nn.Softmax(dim=-1) built in the call, c_fc / gelu_new / c_proj.
# Reduced: GPT-Neo does not scale its scores (its checkpoints were trained that way): here they
# are divided by sqrt(head_dim) after the product, the source's own line being this zoo's
# no_scaling; global attention only, no cache or head mask.
import math
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

ACT2FN = {"gelu_new": lambda x: F.gelu(x, approximate="tanh")}


class GPTNeoSelfAttention(nn.Module):
    def __init__(self, config, attention_type):
        super().__init__()

        max_positions = config.max_position_embeddings
        bias = torch.tril(torch.ones((max_positions, max_positions), dtype=torch.uint8)).view(
            1, 1, max_positions, max_positions
        )

        # local causal self attention is a sliding window where each token can only attend to the previous
        # window_size tokens. This is implemented by updating the causal mask such that for each token
        # all other tokens are masked except the previous window_size tokens.
        if attention_type == "local":
            bias = bias ^ torch.tril(bias, -config.window_size)

        self.register_buffer("bias", bias)
        self.register_buffer("masked_bias", torch.tensor(-1e9))

        self.attn_dropout = nn.Dropout(config.attention_dropout)
        self.resid_dropout = nn.Dropout(config.resid_dropout)

        self.embed_dim = config.hidden_size
        self.num_heads = config.num_heads
        self.head_dim = self.embed_dim // self.num_heads
        if self.head_dim * self.num_heads != self.embed_dim:
            raise ValueError(
                f"embed_dim must be divisible by num_heads (got `embed_dim`: {self.embed_dim} and `num_heads`: {self.num_heads})."
            )

        self.k_proj = nn.Linear(self.embed_dim, self.embed_dim, bias=False)
        self.v_proj = nn.Linear(self.embed_dim, self.embed_dim, bias=False)
        self.q_proj = nn.Linear(self.embed_dim, self.embed_dim, bias=False)
        self.out_proj = nn.Linear(self.embed_dim, self.embed_dim, bias=True)

    def _split_heads(self, tensor, num_heads, attn_head_size):
        """
        Splits hidden_size dim into attn_head_size and num_heads
        """
        new_shape = tensor.size()[:-1] + (num_heads, attn_head_size)
        tensor = tensor.view(*new_shape)
        return tensor.permute(0, 2, 1, 3)  # (batch, head, seq_length, head_features)

    def _merge_heads(self, tensor, num_heads, attn_head_size):
        """
        Merges attn_head_size dim and num_attn_heads dim into hidden_size
        """
        tensor = tensor.permute(0, 2, 1, 3).contiguous()
        new_shape = tensor.size()[:-2] + (num_heads * attn_head_size,)
        return tensor.view(new_shape)

    def _attn(self, query, key, value, attention_mask=None, head_mask=None):
        # Keep the attention weights computation in fp32 to avoid overflow issues
        query = query.to(torch.float32)
        key = key.to(torch.float32)

        attn_weights = torch.matmul(query, key.transpose(-1, -2))
        attn_weights = attn_weights / math.sqrt(self.head_dim)

        query_length, key_length = query.size(-2), key.size(-2)
        causal_mask = self.bias[:, :, key_length - query_length : key_length, :key_length].bool()
        attn_weights = torch.where(causal_mask, attn_weights, self.masked_bias.to(attn_weights.dtype))

        if attention_mask is not None:
            # Apply the attention mask
            attn_weights = attn_weights + attention_mask

        attn_weights = nn.Softmax(dim=-1)(attn_weights)
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

        query = self._split_heads(query, self.num_heads, self.head_dim)
        key = self._split_heads(key, self.num_heads, self.head_dim)
        value = self._split_heads(value, self.num_heads, self.head_dim)

        attn_output, attn_weights = self._attn(query, key, value, attention_mask, head_mask)

        attn_output = self._merge_heads(attn_output, self.num_heads, self.head_dim)
        attn_output = self.out_proj(attn_output)
        attn_output = self.resid_dropout(attn_output)

        outputs = (attn_output, None)
        return outputs  # a, present, (attentions)


class GPTNeoAttention(nn.Module):
    def __init__(self, config, layer_id=0):
        super().__init__()
        self.layer_id = layer_id
        self.attention_layers = config.attention_layers
        self.attention_type = self.attention_layers[layer_id]

        if self.attention_type in ["global", "local"]:
            self.attention = GPTNeoSelfAttention(config, self.attention_type)
        else:
            raise NotImplementedError(
                "Only attn layer types 'global' and 'local' exist, but got `config.attention_layers`: "
                f"{config.attention_layers}. Select attn layer types from ['global', 'local'] only."
            )

    def forward(self, hidden_states, attention_mask=None, head_mask=None):
        return self.attention(hidden_states, attention_mask=attention_mask, head_mask=head_mask)


class GPTNeoMLP(nn.Module):
    def __init__(self, intermediate_size, config):  # in MLP: intermediate_size= 4 * hidden_size
        super().__init__()
        embed_dim = config.hidden_size
        self.c_fc = nn.Linear(embed_dim, intermediate_size)
        self.c_proj = nn.Linear(intermediate_size, embed_dim)
        self.act = ACT2FN[config.activation_function]
        self.dropout = nn.Dropout(config.resid_dropout)

    def forward(self, hidden_states):
        hidden_states = self.c_fc(hidden_states)
        hidden_states = self.act(hidden_states)
        hidden_states = self.c_proj(hidden_states)
        hidden_states = self.dropout(hidden_states)
        return hidden_states


class GPTNeoBlock(nn.Module):
    def __init__(self, config, layer_id):
        super().__init__()
        hidden_size = config.hidden_size
        inner_dim = config.intermediate_size if config.intermediate_size is not None else 4 * hidden_size
        self.ln_1 = nn.LayerNorm(hidden_size, eps=config.layer_norm_epsilon)
        self.attn = GPTNeoAttention(config, layer_id)
        self.ln_2 = nn.LayerNorm(hidden_size, eps=config.layer_norm_epsilon)
        self.mlp = GPTNeoMLP(inner_dim, config)

    def forward(self, hidden_states, attention_mask=None, head_mask=None):
        residual = hidden_states
        hidden_states = self.ln_1(hidden_states)
        attn_outputs = self.attn(hidden_states, attention_mask=attention_mask, head_mask=head_mask)
        attn_output = attn_outputs[0]  # output_attn: a, present, (attentions)
        # residual connection
        hidden_states = attn_output + residual

        residual = hidden_states
        hidden_states = self.ln_2(hidden_states)
        feed_forward_hidden_states = self.mlp(hidden_states)
        # residual connection
        hidden_states = residual + feed_forward_hidden_states

        return hidden_states


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "huggingface/transformers src/transformers/models/gpt_neo/modeling_gpt_neo.py @ 002fb3e7a2db86cef2160e206c878ff895b74ef0"
REFERENCE = {"n_head": 4, "activation": "gelu_tanh"}
BLOCK = GPTNeoBlock
ARGS = {
    "config": SimpleNamespace(
        hidden_size=32, num_heads=4, intermediate_size=None, max_position_embeddings=16, window_size=4,
        attention_layers=["global", "local"], attention_dropout=0.1, resid_dropout=0.1, layer_norm_epsilon=1e-5,
        activation_function="gelu_new",
    ),
    "layer_id": 0,
}  # fmt: skip
TOLERANCE = 1e-6  # the scores are computed in float32, as GPT-Neo's are


def weights(b):
    a, m = b.attn.attention, b.mlp
    return {
        "ln1": (b.ln_1.weight, b.ln_1.bias),
        "q": (a.q_proj.weight, None),
        "k": (a.k_proj.weight, None),
        "v": (a.v_proj.weight, None),
        "proj": (a.out_proj.weight, a.out_proj.bias),
        "ln2": (b.ln_2.weight, b.ln_2.bias),
        "fc1": (m.c_fc.weight, m.c_fc.bias),
        "fc2": (m.c_proj.weight, m.c_proj.bias),
    }


SCALE = "attn_weights = attn_weights / math.sqrt(self.head_dim)\n"
WHERE = "attn_weights = torch.where(causal_mask, attn_weights, self.masked_bias.to(attn_weights.dtype))"
MISTAKES = {
    "no_scaling": [(SCALE, "\n")],  # GPT-Neo's own
    "wrong_scale": [(SCALE, "attn_weights = attn_weights / math.sqrt(self.embed_dim)\n")],
    "wrong_scale:1/hs": [(SCALE, "attn_weights = attn_weights / self.head_dim\n")],
    "future_leak": [(WHERE, "# " + WHERE)],
    "mask_reversed": [(WHERE, WHERE.replace("torch.where(causal_mask", "torch.where(~causal_mask"))],
    "mask_zero": [
        (
            'self.register_buffer("masked_bias", torch.tensor(-1e9))',
            'self.register_buffer("masked_bias", torch.tensor(0.0))',
        )
    ],
    "softmax_dim": [
        ("attn_weights = nn.Softmax(dim=-1)(attn_weights)", "attn_weights = nn.Softmax(dim=-2)(attn_weights)")
    ],
    "heads_mixed:split": [
        (
            "return tensor.permute(0, 2, 1, 3)  # (batch, head, seq_length, head_features)",
            "return tensor.reshape(tensor.shape[0], num_heads, -1, attn_head_size)",
        )
    ],
    "no_residual:attn": [("hidden_states = attn_output + residual", "hidden_states = attn_output")],
    "no_residual:mlp": [
        ("hidden_states = residual + feed_forward_hidden_states", "hidden_states = feed_forward_hidden_states")
    ],
    "shared_norm": [("hidden_states = self.ln_2(hidden_states)", "hidden_states = self.ln_1(hidden_states)")],
}
PAIRS = [("no_scaling", "shared_norm"), ("mask_zero", "no_residual:attn")]
