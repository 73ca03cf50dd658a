# Source: huggingface/transformers, src/transformers/models/gptj/modeling_gptj.py
#   (create_sinusoidal_positions, rotate_every_two, apply_rotary_pos_emb, GPTJAttention's eager
#   _attn, GPTJMLP, GPTJBlock), written for the zoo in its shape.
# Kept: the parallel block (one ln_1 read by both branches: attn_output + feed_forward + residual),
# partial rotary (rotary_dim of each head's channels, the rest passed through) on adjacent pairs
# (rotate_every_two, sin/cos repeated with repeat_interleave), q_proj / k_proj / v_proj without
# bias, attention in float32 with torch.where(causal_mask, ...), divided by scale_attn, fc_in /
# fc_out with gelu_new (tanh).
# Reduced: plain-argument constructor; position ids made in forward (the checker calls
# forward(x)); no cache, no dropout, no head mask.
import torch
import torch.nn as nn
import torch.nn.functional as F


def create_sinusoidal_positions(num_pos, dim):
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.int64) / dim))
    sinusoid_inp = torch.einsum("i , j -> i j", torch.arange(num_pos, dtype=torch.int64).float(), inv_freq).float()
    return torch.cat((torch.sin(sinusoid_inp), torch.cos(sinusoid_inp)), dim=1)


def rotate_every_two(x):
    x1 = x[:, :, :, ::2]
    x2 = x[:, :, :, 1::2]
    x = torch.stack((-x2, x1), dim=-1)
    return x.flatten(-2)  # in einsum notation: rearrange(x, '... d j -> ... (d j)')


def apply_rotary_pos_emb(tensor, sin, cos):
    sin = torch.repeat_interleave(sin[:, :, None, :], 2, 3)
    cos = torch.repeat_interleave(cos[:, :, None, :], 2, 3)
    return (tensor * cos) + (rotate_every_two(tensor) * sin)


class GPTJAttention(nn.Module):
    def __init__(self, n_embd, n_head, rotary_dim, max_positions):
        super().__init__()
        self.register_buffer(
            "bias",
            torch.tril(torch.ones((max_positions, max_positions), dtype=torch.bool)).view(
                1, 1, max_positions, max_positions
            ),
            persistent=False,
        )
        self.embed_dim = n_embd
        self.num_attention_heads = n_head
        self.head_dim = self.embed_dim // self.num_attention_heads
        self.scale_attn = torch.sqrt(torch.tensor(self.head_dim, dtype=torch.float32))
        self.k_proj = nn.Linear(self.embed_dim, self.embed_dim, bias=False)
        self.v_proj = nn.Linear(self.embed_dim, self.embed_dim, bias=False)
        self.q_proj = nn.Linear(self.embed_dim, self.embed_dim, bias=False)
        self.out_proj = nn.Linear(self.embed_dim, self.embed_dim, bias=False)
        self.rotary_dim = rotary_dim
        self.embed_positions = create_sinusoidal_positions(max_positions, rotary_dim)

    def _split_heads(self, tensor, num_attention_heads, attn_head_size, rotary):
        new_shape = tensor.size()[:-1] + (num_attention_heads, attn_head_size)
        tensor = tensor.view(new_shape)
        if rotary:
            return tensor
        return tensor.permute(0, 2, 1, 3)  # (batch, head, seq_length, head_features)

    def _merge_heads(self, tensor, num_attention_heads, attn_head_size):
        tensor = tensor.permute(0, 2, 1, 3).contiguous()
        new_shape = tensor.size()[:-2] + (num_attention_heads * attn_head_size,)
        return tensor.view(new_shape)

    def _attn(self, query, key, value):
        query_length, key_length = query.size(-2), key.size(-2)
        causal_mask = self.bias[:, :, key_length - query_length : key_length, :key_length]
        query = query.to(torch.float32)
        key = key.to(torch.float32)
        attn_weights = torch.matmul(query, key.transpose(-1, -2))
        mask_value = torch.finfo(attn_weights.dtype).min
        mask_value = torch.tensor(mask_value, dtype=attn_weights.dtype).to(attn_weights.device)
        attn_weights = torch.where(causal_mask, attn_weights, mask_value)
        attn_weights = attn_weights / self.scale_attn
        attn_weights = nn.functional.softmax(attn_weights, dim=-1)
        attn_weights = attn_weights.to(value.dtype)
        return torch.matmul(attn_weights, value)

    def forward(self, hidden_states, position_ids):
        query = self.q_proj(hidden_states)
        key = self.k_proj(hidden_states)
        value = self.v_proj(hidden_states)

        query = self._split_heads(query, self.num_attention_heads, self.head_dim, True)
        key = self._split_heads(key, self.num_attention_heads, self.head_dim, True)
        value = self._split_heads(value, self.num_attention_heads, self.head_dim, False)

        embed_positions = self.embed_positions.to(position_ids.device)
        sincos = embed_positions[position_ids]
        sin, cos = torch.split(sincos, sincos.shape[-1] // 2, dim=-1)

        k_rot = key[:, :, :, : self.rotary_dim]
        k_pass = key[:, :, :, self.rotary_dim :]
        q_rot = query[:, :, :, : self.rotary_dim]
        q_pass = query[:, :, :, self.rotary_dim :]
        k_rot = apply_rotary_pos_emb(k_rot, sin, cos)
        q_rot = apply_rotary_pos_emb(q_rot, sin, cos)
        key = torch.cat([k_rot, k_pass], dim=-1)
        query = torch.cat([q_rot, q_pass], dim=-1)

        key = key.permute(0, 2, 1, 3)
        query = query.permute(0, 2, 1, 3)
        attn_output = self._attn(query, key, value)
        attn_output = self._merge_heads(attn_output, self.num_attention_heads, self.head_dim)
        return self.out_proj(attn_output)


class GPTJMLP(nn.Module):
    def __init__(self, intermediate_size, embed_dim):
        super().__init__()
        self.fc_in = nn.Linear(embed_dim, intermediate_size)
        self.fc_out = nn.Linear(intermediate_size, embed_dim)

    def forward(self, hidden_states):
        hidden_states = self.fc_in(hidden_states)
        hidden_states = F.gelu(hidden_states, approximate="tanh")
        hidden_states = self.fc_out(hidden_states)
        return hidden_states


class GPTJBlock(nn.Module):
    def __init__(self, n_embd=32, n_head=4, rotary_dim=4, n_positions=16, layer_norm_epsilon=1e-5):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, eps=layer_norm_epsilon)
        self.attn = GPTJAttention(n_embd, n_head, rotary_dim, n_positions)
        self.mlp = GPTJMLP(4 * n_embd, n_embd)

    def forward(self, hidden_states):
        position_ids = torch.arange(hidden_states.shape[1], device=hidden_states.device)[None]
        residual = hidden_states
        hidden_states = self.ln_1(hidden_states)
        attn_output = self.attn(hidden_states, position_ids)
        feed_forward_hidden_states = self.mlp(hidden_states)
        hidden_states = attn_output + feed_forward_hidden_states + residual
        return hidden_states


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "huggingface/transformers src/transformers/models/gptj/modeling_gptj.py"
BLOCK = GPTJBlock
ARGS = {"n_embd": 32, "n_head": 4, "rotary_dim": 4, "n_positions": 16}
REFERENCE = {
    "n_head": 4,
    "norm": "layernorm",
    "activation": "gelu_tanh",
    "parallel_residual": True,
    "position": "rope",
    "rotary_dim": 4,
    "rope_pairing": "adjacent",
}
TOLERANCE = 1e-6  # the scores and the rotary table are float32, as GPT-J's are


def weights(b):
    a, m = b.attn, b.mlp
    return {
        "norm1.weight": b.ln_1.weight,
        "norm1.bias": b.ln_1.bias,
        "self_attn.in_proj_weight": torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]),
        "self_attn.out_proj.weight": a.out_proj.weight,
        "linear1.weight": m.fc_in.weight,
        "linear1.bias": m.fc_in.bias,
        "linear2.weight": m.fc_out.weight,
        "linear2.bias": m.fc_out.bias,
    }


MISTAKES = {
    "rope_q_only": [("        k_rot = apply_rotary_pos_emb(k_rot, sin, cos)\n", "")],
    "rope_v": [
        (
            "value = self._split_heads(value, self.num_attention_heads, self.head_dim, False)",
            "value = self._split_heads(value, self.num_attention_heads, self.head_dim, True)\n"
            "        value = torch.cat([apply_rotary_pos_emb(value[..., :4], *torch.split(self.embed_positions[position_ids], 2, dim=-1)), value[..., 4:]], dim=-1).permute(0, 2, 1, 3)",
        ),
    ],
    "rope_pairing": [
        ("sin = torch.repeat_interleave(sin[:, :, None, :], 2, 3)", "sin = torch.cat((sin, sin), -1)[:, :, None, :]"),
        ("cos = torch.repeat_interleave(cos[:, :, None, :], 2, 3)", "cos = torch.cat((cos, cos), -1)[:, :, None, :]"),
    ],
    "no_scaling": [("        attn_weights = attn_weights / self.scale_attn\n", "")],
    "no_residual": [  # the branches added to the normalised stream (s19 unseen set, NeoX)
        (
            "hidden_states = attn_output + feed_forward_hidden_states + residual",
            "hidden_states = attn_output + feed_forward_hidden_states + hidden_states",
        )
    ],
    "future_leak": [
        ("attn_weights = torch.where(causal_mask, attn_weights, mask_value)", "attn_weights = attn_weights")
    ],
    "softmax_dim": [
        (
            "attn_weights = nn.functional.softmax(attn_weights, dim=-1)",
            "attn_weights = nn.functional.softmax(attn_weights, dim=-2)",
        )
    ],
}
PAIRS = [("rope_pairing", "no_scaling")]
