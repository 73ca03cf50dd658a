# Source: microsoft/LoRA, examples/NLG/src/model.py
#   commit 3d267d7036b5795e07482fd06d2ad568f95612cc: gelu, LayerNorm, Conv1D, Attention, MLP, Block,
#   GPT2Config.
# Kept: Block(n_ctx, config, scale) with a GPT2Config-like config; the hand-written TF-style
# LayerNorm (mean, variance, epsilon inside the sqrt); Conv1D weights stored (in, out) and used
# through torch.addmm; the (1, 1, n_ctx, n_ctx) float `bias` buffer and the masking arithmetic
# (scores times the mask minus 1e10 where it is 0); split_heads(x, k=True) that returns the keys already transposed
# (batch, head, head_features, seq); merge_heads; nn.Softmax(dim=-1) built inline; the hand-written
# tanh gelu; Attention returning (a, present).
# Reduced: lora.MergedLinear (r = lora_attn_dim = 0, fan_in_fan_out=True, i.e. a Conv1D) is a
# Conv1D here; no layer_past / len_past; Block returns x alone (the source returns (x, present)).
import math
from types import SimpleNamespace

import torch
from torch import nn
from torch.nn.parameter import Parameter


def gelu(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * torch.pow(x, 3))))


class LayerNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-12):
        """Construct a layernorm module in the TF style (epsilon inside the square root)."""
        super(LayerNorm, self).__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.bias = nn.Parameter(torch.zeros(hidden_size))
        self.variance_epsilon = eps

    def forward(self, x):
        u = x.mean(-1, keepdim=True)
        s = (x - u).pow(2).mean(-1, keepdim=True)
        x = (x - u) / torch.sqrt(s + self.variance_epsilon)
        return self.weight * x + self.bias


class Conv1D(nn.Module):
    def __init__(self, nf, nx):
        super(Conv1D, self).__init__()
        self.nf = nf
        w = torch.empty(nx, nf)
        nn.init.normal_(w, std=0.02)
        self.weight = Parameter(w)
        self.bias = Parameter(torch.zeros(nf))

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        x = x.view(*size_out)
        return x


class Attention(nn.Module):
    def __init__(self, nx, n_ctx, config, scale=False):
        super(Attention, self).__init__()
        n_state = nx  # in Attention: n_state=768 (nx=n_embd)
        # [switch nx => n_state from Block to Attention to keep identical to TF implem]

        assert n_state % config.n_head == 0
        self.register_buffer("bias", torch.tril(torch.ones(n_ctx, n_ctx)).view(1, 1, n_ctx, n_ctx))
        self.n_head = config.n_head
        self.split_size = n_state
        self.scale = scale
        self.c_attn = Conv1D(n_state * 3, nx)
        self.c_proj = Conv1D(n_state, nx)

        self.config = config

    def _attn(self, q, k, v, len_kv=None):
        w = torch.matmul(q, k)
        if self.scale:
            w = w / math.sqrt(v.size(-1))
        nd, ns = w.size(-2), w.size(-1)
        b = self.bias[:, :, ns-nd:ns, :ns]
        w = w * b - 1e10 * (1 - b)

        w = nn.Softmax(dim=-1)(w)
        return torch.matmul(w, v)

    def merge_heads(self, x):
        x = x.permute(0, 2, 1, 3).contiguous()
        new_x_shape = x.size()[:-2] + (x.size(-2) * x.size(-1),)
        return x.view(*new_x_shape)  # in Tensorflow implem: fct merge_states

    def split_heads(self, x, k=False):
        new_x_shape = x.size()[:-1] + (self.n_head, x.size(-1) // self.n_head)
        x = x.view(*new_x_shape)  # in Tensorflow implem: fct split_states
        if k:
            return x.permute(0, 2, 3, 1).contiguous()  # (batch, head, head_features, seq_length)
        else:
            return x.permute(0, 2, 1, 3).contiguous()  # (batch, head, seq_length, head_features)

    def forward(self, x, history=None, layer_past=None, len_past=None):
        hidden_states = x

        x = self.c_attn(x)
        query, key, value = x.split(self.split_size, dim=2)

        query = self.split_heads(query)
        key = self.split_heads(key, k=True)
        value = self.split_heads(value)

        len_kv = None

        present = torch.stack((key.transpose(-2, -1), value))  # transpose to have same shapes for stacking
        a = self._attn(query, key, value, len_kv = len_kv)
        a = self.merge_heads(a)
        a = self.c_proj(a)
        return a, present


class MLP(nn.Module):
    def __init__(self, n_state, config):  # in MLP: n_state=3072 (4 * n_embd)
        super(MLP, self).__init__()
        nx = config.n_embd
        self.c_fc = Conv1D(n_state, nx)
        self.c_proj = Conv1D(nx, n_state)
        self.act = gelu

    def forward(self, x):
        h = self.act(self.c_fc(x))
        h2 = self.c_proj(h)
        return h2


class Block(nn.Module):
    def __init__(self, n_ctx, config, scale=False):
        super(Block, self).__init__()
        nx = config.n_embd
        self.ln_1 = LayerNorm(nx, eps=config.layer_norm_epsilon)
        self.attn = Attention(nx, n_ctx, config, scale)
        self.ln_2 = LayerNorm(nx, eps=config.layer_norm_epsilon)
        self.mlp = MLP(4 * nx, config)

    def forward(self, x, layer_past=None, len_past=None):
        a, present = self.attn(self.ln_1(x), layer_past=layer_past, len_past=len_past)
        x = x + a
        m = self.mlp(self.ln_2(x))
        x = x + m
        return x


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "microsoft/LoRA examples/NLG/src/model.py @ 3d267d7036b5795e07482fd06d2ad568f95612cc"
REFERENCE = {"n_head": 4, "activation": "gelu_tanh", "norm_eps": 1e-5}
BLOCK = Block
ARGS = {
    "n_ctx": 16,
    "config": SimpleNamespace(n_embd=32, n_head=4, layer_norm_epsilon=1e-5, n_ctx=16, n_positions=16),
    "scale": True,
}


def weights(b):
    a, m = b.attn, b.mlp
    q, k, v = a.c_attn.weight.T.chunk(3)
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


MASK = "w = w * b - 1e10 * (1 - b)"
SOFTMAX = "w = nn.Softmax(dim=-1)(w)"
R1 = "x = x + a\n"
A1 = "a, present = self.attn(self.ln_1(x), layer_past=layer_past, len_past=len_past)"
M1 = "m = self.mlp(self.ln_2(x))"
R2 = "x = x + m\n"
MISTAKES = {
    "no_scaling": [("self.attn = Attention(nx, n_ctx, config, scale)", "self.attn = Attention(nx, n_ctx, config)")],
    "wrong_scale": [("w = w / math.sqrt(v.size(-1))", "w = w / math.sqrt(self.split_size)")],
    "wrong_scale:1/hs": [("w = w / math.sqrt(v.size(-1))", "w = w / v.size(-1)")],
    "future_leak": [(MASK, "# " + MASK)],
    "mask_zero": [(MASK, "w = w * b")],
    "mask_reversed": [(MASK, "w = w * (1 - b) - 1e10 * b")],
    "mask_after_softmax": [(MASK + "\n\n        " + SOFTMAX, SOFTMAX + "\n        w = w * b")],
    "softmax_dim": [(SOFTMAX, "w = nn.Softmax(dim=-2)(w)")],
    "heads_mixed:merge": [("x = x.permute(0, 2, 1, 3).contiguous()\n        new_x_shape = x.size()[:-2] + (x.size(-2) * x.size(-1),)",
                           "x = x.contiguous()\n        new_x_shape = (x.size(0), x.size(2), x.size(1) * x.size(-1))")],
    "no_residual:attn": [(R1, "x = a\n")],
    "no_residual:mlp": [(R2, "x = m\n")],
    "shared_norm": [(M1, "m = self.mlp(self.ln_1(x))")],
    "post_norm": [
        (A1, "a, present = self.attn(x, layer_past=layer_past, len_past=len_past)"),
        (R1, "x = self.ln_1(x + a)\n"),
        (M1, "m = self.mlp(x)"),
        (R2, "x = self.ln_2(x + m)\n"),
    ],
}
PAIRS = [("mask_zero", "no_residual:attn")]
