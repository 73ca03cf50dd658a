# Source: huggingface/transformers, src/transformers/models/codegen/modeling_codegen.py
#   commit 00491ceeee1a918b3c91685ddbd439f787eef424: CodeGenAttention, CodeGenMLP, CodeGenBlock.
# Kept: CodeGenBlock(config, layer_idx) with a CodeGenConfig-like config; the bias-free
# qkv_proj whose output is cut into mp_num = 4 blocks ("logical TPU-v4 cores"), each holding a
# query, a VALUE and a key slice in that order (torch.split(..., local_dim) -> query, value, key),
# _split_heads' two reshapes, the float32 cast of query and key for the scores, the additive
# mask added before dividing by scale_attn (a tensor, sqrt(head_dim)), nn.Softmax(dim=-1) built in
# the call, _merge_heads' permute and view, fc_in / fc_out with gelu_new.
# Reduced: CodeGenBlock runs attention and MLP in parallel off one ln_1 (attn + mlp + residual):
# here the sequential pre-norm block, with an ln_2; no rotary embedding, no cache; the model's
# causal mask (finfo.min above the diagonal) built in the block.
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

ACT2FN = {"gelu_new": lambda x: F.gelu(x, approximate="tanh")}


class CodeGenAttention(nn.Module):
    def __init__(self, config, layer_idx=None):
        super().__init__()

        self.attn_dropout = nn.Dropout(config.attn_pdrop)
        self.resid_dropout = nn.Dropout(config.resid_pdrop)
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
        self.qkv_proj = nn.Linear(self.embed_dim, self.embed_dim * 3, bias=False)

        self.out_proj = nn.Linear(self.embed_dim, self.embed_dim, bias=False)

    def _split_heads(self, x, n_head, dim_head, mp_num):
        reshaped = x.reshape(x.shape[:-1] + (n_head // mp_num, dim_head))
        reshaped = reshaped.reshape(x.shape[:-2] + (-1,) + reshaped.shape[-1:])
        return reshaped

    def _merge_heads(self, tensor, num_attention_heads, attn_head_size):
        """
        Merges attn_head_size dim and num_attn_heads dim into n_ctx
        """
        if len(tensor.shape) == 5:
            tensor = tensor.permute(0, 1, 3, 2, 4).contiguous()
        elif len(tensor.shape) == 4:
            tensor = tensor.permute(0, 2, 1, 3).contiguous()
        else:
            raise ValueError(f"Input tensor rank should be one of [4, 5], but is: {len(tensor.shape)}")
        new_shape = tensor.size()[:-2] + (num_attention_heads * attn_head_size,)
        return tensor.view(new_shape)

    def _attn(self, query, key, value, attention_mask=None, head_mask=None):
        # Keep the attention weights computation in fp32 to avoid overflow issues
        query = query.to(torch.float32)
        key = key.to(torch.float32)

        attn_weights = torch.matmul(query, key.transpose(-1, -2))

        if attention_mask is not None:
            causal_mask = attention_mask[:, :, :, : key.shape[-2]]
            attn_weights += causal_mask

        attn_weights = attn_weights / self.scale_attn
        attn_weights = nn.Softmax(dim=-1)(attn_weights)
        attn_weights = attn_weights.to(value.dtype)
        attn_weights = self.attn_dropout(attn_weights)

        # Mask heads if we want to
        if head_mask is not None:
            attn_weights = attn_weights * head_mask

        attn_output = torch.matmul(attn_weights, value)

        return attn_output, attn_weights

    def forward(self, hidden_states, attention_mask=None, head_mask=None):
        qkv = self.qkv_proj(hidden_states)
        # TODO(enijkamp): factor out number of logical TPU-v4 cores or make forward pass agnostic
        mp_num = 4
        qkv_split = qkv.reshape(qkv.shape[:-1] + (mp_num, -1))

        local_dim = self.head_dim * self.num_attention_heads // mp_num
        query, value, key = torch.split(qkv_split, local_dim, dim=-1)
        query = self._split_heads(query, self.num_attention_heads, self.head_dim, mp_num=mp_num)
        key = self._split_heads(key, self.num_attention_heads, self.head_dim, mp_num=mp_num)

        value = self._split_heads(value, self.num_attention_heads, self.head_dim, mp_num=mp_num)
        value = value.permute(0, 2, 1, 3)

        key = key.permute(0, 2, 1, 3)
        query = query.permute(0, 2, 1, 3)

        # compute self-attention: V x Softmax(QK^T)
        attn_output, attn_weights = self._attn(query, key, value, attention_mask, head_mask)

        attn_output = self._merge_heads(attn_output, self.num_attention_heads, self.head_dim)
        attn_output = self.out_proj(attn_output)
        attn_output = self.resid_dropout(attn_output)

        outputs = (attn_output, None)
        return outputs  # a, present, (attentions)


class CodeGenMLP(nn.Module):
    def __init__(self, intermediate_size, config):  # in MLP: intermediate_size= 4 * embed_dim
        super().__init__()
        embed_dim = config.n_embd

        self.fc_in = nn.Linear(embed_dim, intermediate_size)
        self.fc_out = nn.Linear(intermediate_size, embed_dim)

        self.act = ACT2FN[config.activation_function]
        self.dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, hidden_states):
        hidden_states = self.fc_in(hidden_states)
        hidden_states = self.act(hidden_states)
        hidden_states = self.fc_out(hidden_states)
        hidden_states = self.dropout(hidden_states)
        return hidden_states


class CodeGenBlock(nn.Module):
    def __init__(self, config, layer_idx=None):
        super().__init__()
        inner_dim = config.n_inner if config.n_inner is not None else 4 * config.n_embd
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = CodeGenAttention(config, layer_idx)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = CodeGenMLP(inner_dim, config)

    def forward(self, hidden_states, attention_mask=None, head_mask=None):
        if attention_mask is None:  # the model's 4-D causal mask
            T = hidden_states.shape[1]
            attention_mask = torch.full(
                (T, T), torch.finfo(hidden_states.dtype).min, dtype=hidden_states.dtype, device=hidden_states.device
            )
            attention_mask = torch.triu(attention_mask, diagonal=1)[None, None]

        residual = hidden_states
        hidden_states = self.ln_1(hidden_states)
        attn_outputs = self.attn(hidden_states=hidden_states, attention_mask=attention_mask, head_mask=head_mask)
        attn_output = attn_outputs[0]  # output_attn: a, present, (attentions)

        hidden_states = attn_output + residual
        feed_forward_hidden_states = self.mlp(self.ln_2(hidden_states))
        hidden_states = feed_forward_hidden_states + hidden_states

        return hidden_states


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "huggingface/transformers src/transformers/models/codegen/modeling_codegen.py @ 00491ceeee1a918b3c91685ddbd439f787eef424"
REFERENCE = {"n_head": 8, "activation": "gelu_tanh"}
BLOCK = CodeGenBlock
ARGS = {
    "config": SimpleNamespace(
        hidden_size=64, n_embd=64, num_attention_heads=8, n_inner=None, layer_norm_epsilon=1e-5,
        attn_pdrop=0.1, resid_pdrop=0.1, activation_function="gelu_new",
    ),
    "layer_idx": 0,
}  # fmt: skip
TOLERANCE = 1e-6  # the scores are computed in float32, as CodeGen's are


def weights(b):
    a, m = b.attn, b.mlp
    C = a.embed_dim
    W = a.qkv_proj.weight.view(4, 3, C // 4, C)  # mp_num blocks of [query | value | key]
    return {
        "ln1": (b.ln_1.weight, b.ln_1.bias),
        "q": (W[:, 0].reshape(C, C), None),
        "k": (W[:, 2].reshape(C, C), None),
        "v": (W[:, 1].reshape(C, C), None),
        "proj": (a.out_proj.weight, None),
        "ln2": (b.ln_2.weight, b.ln_2.bias),
        "fc1": (m.fc_in.weight, m.fc_in.bias),
        "fc2": (m.fc_out.weight, m.fc_out.bias),
    }


MISTAKES = {
    "no_scaling": [("attn_weights = attn_weights / self.scale_attn\n", "\n")],
    "wrong_scale": [
        (
            "torch.sqrt(torch.tensor(self.head_dim, dtype=torch.float32))",
            "torch.sqrt(torch.tensor(self.embed_dim, dtype=torch.float32))",
        )
    ],
    "wrong_scale:1/hs": [
        (
            "torch.sqrt(torch.tensor(self.head_dim, dtype=torch.float32))",
            "torch.tensor(self.head_dim, dtype=torch.float32)",
        )
    ],
    "future_leak": [("attention_mask = torch.triu(attention_mask, diagonal=1)[None, None]", "attention_mask = None")],
    "mask_reversed": [
        (
            "attention_mask = torch.triu(attention_mask, diagonal=1)[None, None]",
            "attention_mask = torch.tril(attention_mask)[None, None]",
        )
    ],
    "softmax_dim": [
        ("attn_weights = nn.Softmax(dim=-1)(attn_weights)", "attn_weights = nn.Softmax(dim=-2)(attn_weights)")
    ],
    "no_residual:attn": [("hidden_states = attn_output + residual", "hidden_states = attn_output")],
    "no_residual:mlp": [
        ("hidden_states = feed_forward_hidden_states + hidden_states", "hidden_states = feed_forward_hidden_states")
    ],
    "shared_norm": [
        (
            "feed_forward_hidden_states = self.mlp(self.ln_2(hidden_states))",
            "feed_forward_hidden_states = self.mlp(self.ln_1(hidden_states))",
        )
    ],
    "post_norm": [
        ("hidden_states = self.ln_1(hidden_states)\n", "\n"),
        ("hidden_states = attn_output + residual", "hidden_states = self.ln_1(attn_output + residual)"),
        (
            "feed_forward_hidden_states = self.mlp(self.ln_2(hidden_states))",
            "feed_forward_hidden_states = self.mlp(hidden_states)",
        ),
        (
            "hidden_states = feed_forward_hidden_states + hidden_states",
            "hidden_states = self.ln_2(feed_forward_hidden_states + hidden_states)",
        ),
    ],
}
PAIRS = [("wrong_scale", "no_residual:attn"), ("future_leak", "shared_norm")]
