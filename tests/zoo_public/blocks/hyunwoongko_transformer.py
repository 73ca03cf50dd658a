# Source: hyunwoongko/transformer, models/layers/multi_head_attention.py
#   commit 8f7aaa19d37b088c156db0512868127ba9bf1a0f; models/layers/scale_dot_product_attention.py
#   commit 9c5515deafd0b224b50ea7500d38f6c370682633; models/layers/layer_norm.py commit
#   2eb96c790303f9230e52073af1118275d71dc894; models/layers/position_wise_feed_forward.py;
#   models/blocks/decoder_layer.py commit 6f1da5628ebbcce2908be2516985cd6f9f5397c9.
# Kept: MultiHeadAttention(d_model, n_head) with w_q / w_k / w_v / w_concat and its split() /
# concat() methods, ScaleDotProductAttention as a module with nn.Softmax(dim=-1) and
# masked_fill(mask == 0, -10000), the gamma / beta LayerNorm (eps=1e-12), linear1 / ReLU /
# linear2, DecoderLayer(d_model, ffn_hidden, n_head, drop_prob) with norm1 / dropout1 ...
# Reduced: DecoderLayer is post-norm (x = norm1(dropout1(x) + _x)); here the pre-norm wiring;
# no encoder-decoder attention; the target mask built as make_trg_mask builds it.
import math

import torch
from torch import nn


class LayerNorm(nn.Module):
    def __init__(self, d_model, eps=1e-12):
        super(LayerNorm, self).__init__()
        self.gamma = nn.Parameter(torch.ones(d_model))
        self.beta = nn.Parameter(torch.zeros(d_model))
        self.eps = eps

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = x.var(-1, unbiased=False, keepdim=True)
        # '-1' means last dimension.

        out = (x - mean) / torch.sqrt(var + self.eps)
        out = self.gamma * out + self.beta
        return out


class ScaleDotProductAttention(nn.Module):
    """
    compute scale dot product attention

    Query : given sentence that we focused on (decoder)
    Key : every sentence to check relationship with Qeury(encoder)
    Value : every sentence same with Key (encoder)
    """

    def __init__(self):
        super(ScaleDotProductAttention, self).__init__()
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, q, k, v, mask=None, e=1e-12):
        # input is 4 dimension tensor
        # [batch_size, head, length, d_tensor]
        batch_size, head, length, d_tensor = k.size()

        # 1. dot product Query with Key^T to compute similarity
        k_t = k.transpose(2, 3)  # transpose
        score = (q @ k_t) / math.sqrt(d_tensor)  # scaled dot product

        # 2. apply masking (opt)
        if mask is not None:
            score = score.masked_fill(mask == 0, -10000)

        # 3. pass them softmax to make [0, 1] range
        score = self.softmax(score)

        # 4. multiply with Value
        v = score @ v

        return v, score


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, n_head):
        super(MultiHeadAttention, self).__init__()
        self.n_head = n_head
        self.attention = ScaleDotProductAttention()
        self.w_q = nn.Linear(d_model, d_model)
        self.w_k = nn.Linear(d_model, d_model)
        self.w_v = nn.Linear(d_model, d_model)
        self.w_concat = nn.Linear(d_model, d_model)

    def forward(self, q, k, v, mask=None):
        # 1. dot product with weight matrices
        q, k, v = self.w_q(q), self.w_k(k), self.w_v(v)

        # 2. split tensor by number of heads
        q, k, v = self.split(q), self.split(k), self.split(v)

        # 3. do scale dot product to compute similarity
        out, attention = self.attention(q, k, v, mask=mask)

        # 4. concat and pass to linear layer
        out = self.concat(out)
        out = self.w_concat(out)

        return out

    def split(self, tensor):
        """
        split tensor by number of head

        :param tensor: [batch_size, length, d_model]
        :return: [batch_size, head, length, d_tensor]
        """
        batch_size, length, d_model = tensor.size()

        d_tensor = d_model // self.n_head
        tensor = tensor.view(batch_size, length, self.n_head, d_tensor).transpose(1, 2)
        # it is similar with group convolution (split by number of heads)

        return tensor

    def concat(self, tensor):
        """
        inverse function of self.split(tensor : torch.Tensor)

        :param tensor: [batch_size, head, length, d_tensor]
        :return: [batch_size, length, d_model]
        """
        batch_size, head, length, d_tensor = tensor.size()
        d_model = head * d_tensor

        tensor = tensor.transpose(1, 2).contiguous().view(batch_size, length, d_model)
        return tensor


class PositionwiseFeedForward(nn.Module):
    def __init__(self, d_model, hidden, drop_prob=0.1):
        super(PositionwiseFeedForward, self).__init__()
        self.linear1 = nn.Linear(d_model, hidden)
        self.linear2 = nn.Linear(hidden, d_model)
        self.relu = nn.ReLU()
        self.dropout = nn.Dropout(p=drop_prob)

    def forward(self, x):
        x = self.linear1(x)
        x = self.relu(x)
        x = self.dropout(x)
        x = self.linear2(x)
        return x


class DecoderLayer(nn.Module):
    def __init__(self, d_model, ffn_hidden, n_head, drop_prob):
        super(DecoderLayer, self).__init__()
        self.self_attention = MultiHeadAttention(d_model=d_model, n_head=n_head)
        self.norm1 = LayerNorm(d_model=d_model)
        self.dropout1 = nn.Dropout(p=drop_prob)

        self.ffn = PositionwiseFeedForward(d_model=d_model, hidden=ffn_hidden, drop_prob=drop_prob)
        self.norm3 = LayerNorm(d_model=d_model)
        self.dropout3 = nn.Dropout(p=drop_prob)

    def forward(self, dec, trg_mask=None):
        if trg_mask is None:  # Transformer.make_trg_mask, without the padding part
            trg_len = dec.shape[1]
            trg_mask = torch.tril(torch.ones(trg_len, trg_len)).type(torch.ByteTensor).to(dec.device)

        # 1. compute self attention
        _x = dec
        x = self.norm1(dec)
        x = self.self_attention(q=x, k=x, v=x, mask=trg_mask)

        # 2. add
        x = self.dropout1(x)
        x = x + _x

        # 3. positionwise feed forward network
        _x = x
        x = self.norm3(x)
        x = self.ffn(x)

        # 4. add
        x = self.dropout3(x)
        x = x + _x
        return x


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "hyunwoongko/transformer models/layers/multi_head_attention.py @ 8f7aaa19d37b088c156db0512868127ba9bf1a0f (+ the layers and blocks named above)"
REFERENCE = {"n_head": 4, "activation": "relu", "norm_eps": 1e-12}
BLOCK = DecoderLayer
ARGS = {"d_model": 32, "ffn_hidden": 128, "n_head": 4, "drop_prob": 0.1}


def weights(b):
    a, f = b.self_attention, b.ffn
    return {
        "ln1": (b.norm1.gamma, b.norm1.beta),
        "q": (a.w_q.weight, a.w_q.bias),
        "k": (a.w_k.weight, a.w_k.bias),
        "v": (a.w_v.weight, a.w_v.bias),
        "proj": (a.w_concat.weight, a.w_concat.bias),
        "ln2": (b.norm3.gamma, b.norm3.beta),
        "fc1": (f.linear1.weight, f.linear1.bias),
        "fc2": (f.linear2.weight, f.linear2.bias),
    }


SCORE = "score = (q @ k_t) / math.sqrt(d_tensor)"
FILL = "score = score.masked_fill(mask == 0, -10000)"
MISTAKES = {
    "no_scaling": [(SCORE, "score = q @ k_t")],
    "wrong_scale": [(SCORE, "score = (q @ k_t) / math.sqrt(head * d_tensor)")],  # this repository's own first version
    "wrong_scale:1/hs": [(SCORE, "score = (q @ k_t) / d_tensor")],
    "future_leak": [
        ("x = self.self_attention(q=x, k=x, v=x, mask=trg_mask)", "x = self.self_attention(q=x, k=x, v=x)")
    ],
    "mask_zero": [(FILL, "score = score.masked_fill(mask == 0, 0)")],
    "mask_reversed": [(FILL, "score = score.masked_fill(mask == 1, -10000)")],
    "softmax_dim": [("self.softmax = nn.Softmax(dim=-1)", "self.softmax = nn.Softmax(dim=2)")],
    "heads_mixed:split": [  # this repository's own first version of split()
        (
            "tensor = tensor.view(batch_size, length, self.n_head, d_tensor).transpose(1, 2)",
            "tensor = tensor.view(batch_size, self.n_head, length, d_tensor)",
        )
    ],
    "heads_mixed:merge": [
        (
            "tensor = tensor.transpose(1, 2).contiguous().view(batch_size, length, d_model)",
            "tensor = tensor.contiguous().view(batch_size, length, d_model)",
        )
    ],
    "post_norm": [  # the repository's own DecoderLayer
        (
            "x = self.norm1(dec)\n        x = self.self_attention(q=x, k=x, v=x, mask=trg_mask)",
            "x = self.self_attention(q=dec, k=dec, v=dec, mask=trg_mask)",
        ),
        ("x = self.dropout1(x)\n        x = x + _x", "x = self.dropout1(x)\n        x = self.norm1(x + _x)"),
        ("x = self.norm3(x)\n        x = self.ffn(x)", "x = self.ffn(x)"),
        ("x = self.dropout3(x)\n        x = x + _x", "x = self.dropout3(x)\n        x = self.norm3(x + _x)"),
    ],
    "no_residual:attn": [("x = self.dropout1(x)\n        x = x + _x", "x = self.dropout1(x)")],
    "no_residual:mlp": [("x = self.dropout3(x)\n        x = x + _x", "x = self.dropout3(x)")],
    "shared_norm": [("x = self.norm3(x)", "x = self.norm1(x)")],
}
PAIRS = [("wrong_scale", "post_norm"), ("heads_mixed:split", "no_scaling")]
