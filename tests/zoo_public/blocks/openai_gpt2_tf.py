# Source: openai/gpt-2, src/model.py
#   commit c2dae27c1029770cea40978813f17a5fd545b883: softmax, gelu, norm, split_states,
#   merge_states, conv1d, attention_mask, attn, mlp, block.
# Kept: TensorFlow 1's function style: variables created by name inside variable scopes when
# the graph is first built ('h0/attn/c_attn/w' of shape [1, nx, nf], 'h0/ln_1/g'), conv1d as a
# reshape-matmul, the multiplicative mask w*b - 1e10*(1-b), rsqrt scaling, split/merge_states.
# Ported: tf -> torch one call for one call; tf.get_variable -> a scoped nn.ParameterDict filled
# by building the graph once in __init__. Reduced: no `past` (key/value cache).
import math
from contextlib import contextmanager
from types import SimpleNamespace

import torch
import torch.nn as nn

_store = None  # the variables of the graph being built or run
_scope = []


@contextmanager
def variable_scope(name):
    _scope.append(name)
    try:
        yield
    finally:
        _scope.pop()


def get_variable(name, shape, initializer):
    key = "/".join([*_scope, name])
    if key not in _store:
        _store[key] = nn.Parameter(initializer(shape))
    return _store[key]


def shape_list(x):
    return list(x.shape)


def softmax(x, axis=-1):
    x = x - torch.amax(x, dim=axis, keepdim=True)
    ex = torch.exp(x)
    return ex / torch.sum(ex, dim=axis, keepdim=True)


def gelu(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * torch.pow(x, 3))))


def norm(x, scope, *, axis=-1, epsilon=1e-5):
    """Normalize to mean = 0, std = 1, then do a diagonal affine transform."""
    with variable_scope(scope):
        n_state = x.shape[-1]
        g = get_variable("g", [n_state], initializer=torch.ones)
        b = get_variable("b", [n_state], initializer=torch.zeros)
        u = torch.mean(x, dim=axis, keepdim=True)
        s = torch.mean(torch.square(x - u), dim=axis, keepdim=True)
        x = (x - u) * torch.rsqrt(s + epsilon)
        x = x * g + b
        return x


def split_states(x, n):
    """Reshape the last dimension of x into [n, x.shape[-1]/n]."""
    *start, m = shape_list(x)
    return torch.reshape(x, start + [n, m // n])


def merge_states(x):
    """Smash the last two dimensions of x into a single dimension."""
    *start, a, b = shape_list(x)
    return torch.reshape(x, start + [a * b])


def conv1d(x, scope, nf, *, w_init_stdev=0.02):
    with variable_scope(scope):
        *start, nx = shape_list(x)
        w = get_variable("w", [1, nx, nf], initializer=lambda s: w_init_stdev * torch.randn(s))
        b = get_variable("b", [nf], initializer=torch.zeros)
        c = torch.reshape(torch.matmul(torch.reshape(x, [-1, nx]), torch.reshape(w, [-1, nf])) + b, start + [nf])
        return c


def attention_mask(nd, ns, *, dtype):
    """1's in the lower triangle, counting from the lower right corner.

    Same as tf.matrix_band_part(tf.ones([nd, ns]), -1, ns-nd), but doesn't produce garbage on TPUs.
    """
    i = torch.arange(nd)[:, None]
    j = torch.arange(ns)
    m = i >= j - ns + nd
    return m.to(dtype)


def attn(x, scope, n_state, *, hparams):
    assert x.dim() == 3  # Should be [batch, sequence, features]
    assert n_state % hparams.n_head == 0

    def split_heads(x):
        # From [batch, sequence, features] to [batch, heads, sequence, features]
        return torch.permute(split_states(x, hparams.n_head), [0, 2, 1, 3])

    def merge_heads(x):
        # Reverse of split_heads
        return merge_states(torch.permute(x, [0, 2, 1, 3]))

    def mask_attn_weights(w):
        # w has shape [batch, heads, dst_sequence, src_sequence], where information flows from src to dst.
        _, _, nd, ns = shape_list(w)
        b = attention_mask(nd, ns, dtype=w.dtype)
        b = torch.reshape(b, [1, 1, nd, ns])
        w = w * b - 1e10 * (1 - b)
        return w

    def multihead_attn(q, k, v):
        # q, k, v have shape [batch, heads, sequence, features]
        w = torch.matmul(q, k.transpose(-1, -2))
        w = w * torch.rsqrt(torch.tensor(v.shape[-1], dtype=w.dtype))

        w = mask_attn_weights(w)
        w = softmax(w)
        a = torch.matmul(w, v)
        return a

    with variable_scope(scope):
        c = conv1d(x, "c_attn", n_state * 3)
        q, k, v = map(split_heads, torch.split(c, n_state, dim=2))
        a = multihead_attn(q, k, v)
        a = merge_heads(a)
        a = conv1d(a, "c_proj", n_state)
        return a


def mlp(x, scope, n_state, *, hparams):
    with variable_scope(scope):
        nx = x.shape[-1]
        h = gelu(conv1d(x, "c_fc", n_state))
        h2 = conv1d(h, "c_proj", nx)
        return h2


def block(x, scope, *, hparams):
    with variable_scope(scope):
        nx = x.shape[-1]
        a = attn(norm(x, "ln_1"), "attn", nx, hparams=hparams)
        x = x + a
        m = mlp(norm(x, "ln_2"), "mlp", nx * 4, hparams=hparams)
        x = x + m
        return x


class Block(nn.Module):
    """One layer of the graph, 'h0', its variables built by running it once."""

    def __init__(self, hparams):
        super().__init__()
        self.hparams = hparams
        self.variables = nn.ParameterDict()
        self(torch.zeros(1, 1, hparams.n_embd))  # builds the graph: creates the variables

    def forward(self, x):
        global _store
        _store = self.variables
        return block(x, "h0", hparams=self.hparams)


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "openai/gpt-2 src/model.py @ c2dae27c1029770cea40978813f17a5fd545b883 (TensorFlow 1, ported to torch)"
REFERENCE = {"n_head": 4, "activation": "gelu_tanh"}
BLOCK = Block
ARGS = {"hparams": SimpleNamespace(n_embd=32, n_head=4, n_ctx=16)}


def weights(b):
    v = b.variables

    def conv(name):  # w is [1, in, out]
        return v[f"h0/{name}/w"][0].T, v[f"h0/{name}/b"]

    (w, bias), C = conv("attn/c_attn"), b.hparams.n_embd
    return {
        "ln1": (v["h0/ln_1/g"], v["h0/ln_1/b"]),
        "q": (w[:C], bias[:C]),
        "k": (w[C : 2 * C], bias[C : 2 * C]),
        "v": (w[2 * C :], bias[2 * C :]),
        "proj": conv("attn/c_proj"),
        "ln2": (v["h0/ln_2/g"], v["h0/ln_2/b"]),
        "fc1": conv("mlp/c_fc"),
        "fc2": conv("mlp/c_proj"),
    }


SCALE = "w = w * torch.rsqrt(torch.tensor(v.shape[-1], dtype=w.dtype))\n"
MASK = "w = mask_attn_weights(w)\n"
A = 'a = attn(norm(x, "ln_1"), "attn", nx, hparams=hparams)\n        x = x + a'
M = 'm = mlp(norm(x, "ln_2"), "mlp", nx * 4, hparams=hparams)\n        x = x + m'
MISTAKES = {
    "no_scaling": [(SCALE, "# " + SCALE)],
    "wrong_scale": [(SCALE, "w = w * torch.rsqrt(torch.tensor(n_state, dtype=w.dtype))\n")],
    "wrong_scale:1/hs": [(SCALE, "w = w / v.shape[-1]\n")],
    "future_leak": [(MASK, "# " + MASK)],
    "mask_zero": [("w = w * b - 1e10 * (1 - b)", "w = w * b")],
    "mask_reversed": [("w = w * b - 1e10 * (1 - b)", "w = w * (1 - b) - 1e10 * b")],
    "mask_after_softmax": [
        (
            MASK + "        w = softmax(w)\n",
            "w = softmax(w)\n        w = w * attention_mask(w.shape[-2], w.shape[-1], dtype=w.dtype)\n",
        )
    ],
    "softmax_dim": [("w = softmax(w)\n", "w = softmax(w, axis=2)\n")],
    "heads_mixed:split": [
        (
            "return torch.permute(split_states(x, hparams.n_head), [0, 2, 1, 3])",
            "return torch.reshape(split_states(x, hparams.n_head), [x.shape[0], hparams.n_head, x.shape[1], -1])",
        )
    ],
    "post_norm": [
        (A, 'a = attn(x, "attn", nx, hparams=hparams)\n        x = norm(x + a, "ln_1")'),
        (M, 'm = mlp(x, "mlp", nx * 4, hparams=hparams)\n        x = norm(x + m, "ln_2")'),
    ],
    "no_residual:attn": [(A, A.replace("x = x + a", "x = a"))],
    "no_residual:mlp": [(M, M.replace("x = x + m", "x = m"))],
    "shared_norm": [('m = mlp(norm(x, "ln_2")', 'm = mlp(norm(x, "ln_1")')],
}
PAIRS = [("wrong_scale", "no_residual:attn"), ("mask_zero", "post_norm")]
