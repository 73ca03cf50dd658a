# Source: jaymody/picoGPT, gpt2.py
#   commit dfb5df895a7a6b18705866a0bf7ec04947d8e05a: gelu, softmax, layer_norm, linear, ffn,
#   attention, mha, transformer_block.
# Kept: plain functions on one sequence [n_seq, n_embd], weights passed as nested dicts (here an
# nn.ModuleDict of nn.ParameterDicts, as GPT-2's checkpoint names them: c_attn {w, b} with w
# stored [in, out]), np.split into q|k|v and then into heads, a per-head loop, the additive
# (1 - tri) * -1e10 mask, np.hstack to merge. Ported: NumPy -> torch one call for one call; a
# module that runs transformer_block on each sequence of the batch (picoGPT has no batch).
import torch
import torch.nn as nn


def gelu(x):
    return 0.5 * x * (1 + torch.tanh(torch.sqrt(torch.tensor(2 / torch.pi, dtype=x.dtype)) * (x + 0.044715 * x**3)))


def softmax(x):
    exp_x = torch.exp(x - torch.max(x, dim=-1, keepdim=True).values)
    return exp_x / torch.sum(exp_x, dim=-1, keepdim=True)


def layer_norm(x, g, b, eps: float = 1e-5):
    mean = torch.mean(x, dim=-1, keepdim=True)
    variance = torch.var(x, dim=-1, keepdim=True, unbiased=False)
    x = (x - mean) / torch.sqrt(variance + eps)  # normalize x to have mean=0 and var=1 over last axis
    return g * x + b  # scale and offset with gamma/beta params


def linear(x, w, b):  # [m, in], [in, out], [out] -> [m, out]
    return x @ w + b


def ffn(x, c_fc, c_proj):  # [n_seq, n_embd] -> [n_seq, n_embd]
    # project up
    a = gelu(linear(x, **c_fc))  # [n_seq, n_embd] -> [n_seq, 4*n_embd]

    # project back down
    x = linear(a, **c_proj)  # [n_seq, 4*n_embd] -> [n_seq, n_embd]

    return x


def attention(q, k, v, mask):  # [n_q, d_k], [n_k, d_k], [n_k, d_v], [n_q, n_k] -> [n_q, d_v]
    return softmax(q @ k.T / torch.sqrt(torch.tensor(q.shape[-1], dtype=q.dtype)) + mask) @ v


def mha(x, c_attn, c_proj, n_head):  # [n_seq, n_embd] -> [n_seq, n_embd]
    # qkv projection
    x = linear(x, **c_attn)  # [n_seq, n_embd] -> [n_seq, 3*n_embd]

    # split into qkv
    qkv = torch.tensor_split(x, 3, dim=-1)  # [n_seq, 3*n_embd] -> [3, n_seq, n_embd]

    # split into heads
    qkv_heads = list(
        map(lambda x: torch.tensor_split(x, n_head, dim=-1), qkv)
    )  # [3, n_seq, n_embd] -> [3, n_head, n_seq, n_embd/n_head]

    # causal mask to hide future inputs from being attended to
    causal_mask = (1 - torch.tril(torch.ones(x.shape[0], x.shape[0], dtype=x.dtype))) * -1e10  # [n_seq, n_seq]

    # perform attention over each head
    out_heads = [
        attention(q, k, v, causal_mask) for q, k, v in zip(*qkv_heads)
    ]  # [3, n_head, n_seq, n_embd/n_head] -> [n_head, n_seq, n_embd/n_head]

    # merge heads
    x = torch.hstack(out_heads)  # [n_head, n_seq, n_embd/n_head] -> [n_seq, n_embd]

    # out projection
    x = linear(x, **c_proj)  # [n_seq, n_embd] -> [n_seq, n_embd]

    return x


def transformer_block(x, mlp, attn, ln_1, ln_2, n_head):  # [n_seq, n_embd] -> [n_seq, n_embd]
    # multi-head causal self attention
    x = x + mha(layer_norm(x, **ln_1), **attn, n_head=n_head)  # [n_seq, n_embd] -> [n_seq, n_embd]

    # position-wise feed forward network
    x = x + ffn(layer_norm(x, **ln_2), **mlp)  # [n_seq, n_embd] -> [n_seq, n_embd]

    return x


def params(n_in, n_out):
    return nn.ParameterDict(
        {"w": nn.Parameter(0.02 * torch.randn(n_in, n_out)), "b": nn.Parameter(torch.zeros(n_out))}
    )


class TransformerBlock(nn.Module):
    """GPT-2's block params (the checkpoint's "blocks" entry), run by transformer_block."""

    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        ln = lambda: nn.ParameterDict({"g": nn.Parameter(torch.ones(n_embd)), "b": nn.Parameter(torch.zeros(n_embd))})  # noqa: E731
        self.block = nn.ModuleDict({
            "attn": nn.ModuleDict({"c_attn": params(n_embd, 3 * n_embd), "c_proj": params(n_embd, n_embd)}),
            "ln_1": ln(),
            "ln_2": ln(),
            "mlp": nn.ModuleDict({"c_fc": params(n_embd, 4 * n_embd), "c_proj": params(4 * n_embd, n_embd)}),
        })  # fmt: skip

    def forward(self, x):  # [B, n_seq, n_embd] -> [B, n_seq, n_embd]
        return torch.stack([transformer_block(seq, **self.block, n_head=self.n_head) for seq in x])


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "jaymody/picoGPT gpt2.py @ dfb5df895a7a6b18705866a0bf7ec04947d8e05a (NumPy, ported to torch)"
REFERENCE = {"n_head": 4, "activation": "gelu_tanh"}


BLOCK = TransformerBlock
ARGS = {"n_embd": 32, "n_head": 4}


def weights(m):
    p = m.block
    q, k, v = p["attn"]["c_attn"]["w"].T.chunk(3)  # stored [in, out]
    bq, bk, bv = p["attn"]["c_attn"]["b"].chunk(3)
    return {
        "ln1": (p["ln_1"]["g"], p["ln_1"]["b"]),
        "q": (q, bq),
        "k": (k, bk),
        "v": (v, bv),
        "proj": (p["attn"]["c_proj"]["w"].T, p["attn"]["c_proj"]["b"]),
        "ln2": (p["ln_2"]["g"], p["ln_2"]["b"]),
        "fc1": (p["mlp"]["c_fc"]["w"].T, p["mlp"]["c_fc"]["b"]),
        "fc2": (p["mlp"]["c_proj"]["w"].T, p["mlp"]["c_proj"]["b"]),
    }


ATT = "return softmax(q @ k.T / torch.sqrt(torch.tensor(q.shape[-1], dtype=q.dtype)) + mask) @ v"
MASK = "causal_mask = (1 - torch.tril(torch.ones(x.shape[0], x.shape[0], dtype=x.dtype))) * -1e10"
A = "x = x + mha(layer_norm(x, **ln_1), **attn, n_head=n_head)"
F = "x = x + ffn(layer_norm(x, **ln_2), **mlp)"
MISTAKES = {
    "no_scaling": [(ATT, "return softmax(q @ k.T + mask) @ v")],
    "wrong_scale:1/hs": [(ATT, "return softmax(q @ k.T / q.shape[-1] + mask) @ v")],
    "wrong_scale:sqrt": [
        (ATT, "return softmax(q @ k.T * torch.sqrt(torch.tensor(q.shape[-1], dtype=q.dtype)) + mask) @ v")
    ],
    "future_leak": [(ATT, "return softmax(q @ k.T / torch.sqrt(torch.tensor(q.shape[-1], dtype=q.dtype))) @ v")],
    "mask_reversed": [(MASK, "causal_mask = torch.tril(torch.ones(x.shape[0], x.shape[0], dtype=x.dtype)) * -1e10")],
    "mask_after_softmax": [
        (ATT, "return softmax(q @ k.T / torch.sqrt(torch.tensor(q.shape[-1], dtype=q.dtype))) * (mask == 0) @ v")
    ],
    "softmax_dim": [
        ("torch.max(x, dim=-1, keepdim=True)", "torch.max(x, dim=0, keepdim=True)"),
        ("torch.sum(exp_x, dim=-1, keepdim=True)", "torch.sum(exp_x, dim=0, keepdim=True)"),
    ],
    "heads_mixed:order": [
        ("x = torch.hstack(out_heads)", "x = torch.stack(out_heads, dim=-1).reshape(x.shape[0], -1)")
    ],
    "post_norm": [
        (A, "x = layer_norm(x + mha(x, **attn, n_head=n_head), **ln_1)"),
        (F, "x = layer_norm(x + ffn(x, **mlp), **ln_2)"),
    ],
    "no_residual:attn": [(A, "x = mha(layer_norm(x, **ln_1), **attn, n_head=n_head)")],
    "no_residual:mlp": [(F, "x = ffn(layer_norm(x, **ln_2), **mlp)")],
    "shared_norm": [(F, "x = x + ffn(layer_norm(x, **ln_1), **mlp)")],
}
PAIRS = [("no_scaling", "post_norm"), ("mask_reversed", "no_residual:mlp")]
