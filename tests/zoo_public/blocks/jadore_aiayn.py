# Source: jadore801120/attention-is-all-you-need-pytorch, transformer/SubLayers.py
#   commit 144902aa6fc57cfa294db487f796dad600210d5e (MultiHeadAttention, PositionwiseFeedForward)
#   and transformer/Modules.py commit 002815545bf743d0bf2b9d172af047b37e20b6e9 (Linear,
#   LayerNormalization, ScaledDotProductAttention); the repository's early version.
# Kept: per-head 3-D weights w_qs / w_ks / w_vs (n_head, d_model, d_k) applied by torch.bmm to
# the input repeated n_head times ("treat as a (n_head) size batch"), the xavier-initialised
# Linear wrapper (self.linear), the norm and the residual held *inside* each sub-layer, the
# position-wise MLP as two nn.Conv1d(kernel_size=1) run channels-first, the bool mask filled
# through attn.data.masked_fill_, DecoderLayer(d_model, d_inner_hid, n_head, d_k, d_v).
# Reduced: the sub-layers are post-norm (layer_norm(outputs + residual)): here they normalise
# their input first; the temperature is sqrt(d_k), the source's sqrt(d_model) being the very
# wrong_scale this zoo injects; LayerNormalization's maths (unbiased std over dim=1, + eps) made
# the lessons'; the heads merged back with torch.cat(torch.split(...)) as the repository's later
# versions do (this version's .view(mb_size, len_q, -1) mixes them); no encoder attention.
import numpy as np
import torch
import torch.nn as nn
import torch.nn.init as init


class Linear(nn.Module):
    """Simple Linear layer with xavier init"""

    def __init__(self, d_in, d_out, bias=True):
        super(Linear, self).__init__()
        self.linear = nn.Linear(d_in, d_out, bias=bias)
        init.xavier_normal_(self.linear.weight)

    def forward(self, x):
        return self.linear(x)


class LayerNormalization(nn.Module):
    """Layer normalization module"""

    def __init__(self, d_hid, eps=1e-5):
        super(LayerNormalization, self).__init__()

        self.eps = eps
        self.a_2 = nn.Parameter(torch.ones(d_hid), requires_grad=True)
        self.b_2 = nn.Parameter(torch.zeros(d_hid), requires_grad=True)

    def forward(self, z):
        mu = torch.mean(z, dim=-1, keepdim=True)
        sigma = torch.sqrt(torch.var(z, dim=-1, keepdim=True, unbiased=False) + self.eps)
        ln_out = (z - mu.expand_as(z)) / sigma.expand_as(z)
        ln_out = ln_out * self.a_2.expand_as(ln_out) + self.b_2.expand_as(ln_out)

        return ln_out


class ScaledDotProductAttention(nn.Module):
    """Scaled Dot-Product Attention"""

    def __init__(self, d_k, attn_dropout=0.1):
        super(ScaledDotProductAttention, self).__init__()
        self.temper = np.power(d_k, 0.5)
        self.dropout = nn.Dropout(attn_dropout)
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, q, k, v, attn_mask=None):
        attn = torch.bmm(q, k.transpose(1, 2)) / self.temper

        if attn_mask is not None:
            assert attn_mask.size() == attn.size(), (
                "Attention mask shape {} mismatch with Attention logit tensor shape {}.".format(
                    attn_mask.size(), attn.size()
                )
            )

            attn.data.masked_fill_(attn_mask, -float("inf"))

        attn = self.softmax(attn)
        attn = self.dropout(attn)
        output = torch.bmm(attn, v)

        return output, attn


class MultiHeadAttention(nn.Module):
    """Multi-Head Attention module"""

    def __init__(self, n_head, d_model, d_k, d_v, dropout=0.1):
        super(MultiHeadAttention, self).__init__()

        self.n_head = n_head
        self.d_k = d_k
        self.d_v = d_v

        self.w_qs = nn.Parameter(torch.FloatTensor(n_head, d_model, d_k))
        self.w_ks = nn.Parameter(torch.FloatTensor(n_head, d_model, d_k))
        self.w_vs = nn.Parameter(torch.FloatTensor(n_head, d_model, d_v))

        self.attention = ScaledDotProductAttention(d_k)
        self.layer_norm = LayerNormalization(d_model)
        self.proj = Linear(n_head * d_v, d_model)

        self.dropout = nn.Dropout(dropout)

        init.xavier_normal_(self.w_qs)
        init.xavier_normal_(self.w_ks)
        init.xavier_normal_(self.w_vs)

    def forward(self, q, k, v, attn_mask=None):
        d_k, d_v = self.d_k, self.d_v
        n_head = self.n_head

        residual = q
        q = k = v = self.layer_norm(q)

        mb_size, len_q, d_model = q.size()
        mb_size, len_k, d_model = k.size()
        mb_size, len_v, d_model = v.size()

        # treat as a (n_head) size batch
        q_s = q.repeat(n_head, 1, 1).view(n_head, -1, d_model)  # n_head x (mb_size*len_q) x d_model
        k_s = k.repeat(n_head, 1, 1).view(n_head, -1, d_model)  # n_head x (mb_size*len_k) x d_model
        v_s = v.repeat(n_head, 1, 1).view(n_head, -1, d_model)  # n_head x (mb_size*len_v) x d_model

        # treat the result as a (n_head * mb_size) size batch
        q_s = torch.bmm(q_s, self.w_qs).view(-1, len_q, d_k)  # (n_head*mb_size) x len_q x d_k
        k_s = torch.bmm(k_s, self.w_ks).view(-1, len_k, d_k)  # (n_head*mb_size) x len_k x d_k
        v_s = torch.bmm(v_s, self.w_vs).view(-1, len_v, d_v)  # (n_head*mb_size) x len_v x d_v

        # perform attention, result size = (n_head * mb_size) x len_q x d_v
        outputs, attns = self.attention(q_s, k_s, v_s, attn_mask=attn_mask.repeat(n_head, 1, 1))

        # back to original mb_size batch, result size = mb_size x len_q x (n_head*d_v)
        outputs = torch.cat(torch.split(outputs, mb_size, dim=0), dim=-1)

        # project back to residual size
        outputs = self.proj(outputs.view(-1, outputs.size(2))).view_as(residual)
        outputs = self.dropout(outputs)

        return outputs + residual, attns


class PositionwiseFeedForward(nn.Module):
    """A two-feed-forward-layer module"""

    def __init__(self, d_hid, d_inner_hid, dropout=0.1):
        super(PositionwiseFeedForward, self).__init__()
        self.w_1 = nn.Conv1d(d_hid, d_inner_hid, 1)  # position-wise
        self.w_2 = nn.Conv1d(d_inner_hid, d_hid, 1)  # position-wise
        self.layer_norm = LayerNormalization(d_hid)
        self.dropout = nn.Dropout(dropout)
        self.relu = nn.ReLU()

    def forward(self, x):
        residual = x
        output = self.relu(self.w_1(self.layer_norm(x).transpose(1, 2)))
        output = self.w_2(output).transpose(2, 1)
        output = self.dropout(output)
        return output + residual


def get_attn_subsequent_mask(seq):
    """Get an attention mask to avoid using the subsequent info."""
    assert seq.dim() == 2
    attn_shape = (seq.size(0), seq.size(1), seq.size(1))
    subsequent_mask = np.triu(np.ones(attn_shape), k=1).astype("uint8")
    subsequent_mask = torch.from_numpy(subsequent_mask)
    return subsequent_mask


class DecoderLayer(nn.Module):
    """Compose with three layers (the encoder attention left out)"""

    def __init__(self, d_model, d_inner_hid, n_head, d_k, d_v, dropout=0.1):
        super(DecoderLayer, self).__init__()
        self.slf_attn = MultiHeadAttention(n_head, d_model, d_k, d_v, dropout=dropout)
        self.pos_ffn = PositionwiseFeedForward(d_model, d_inner_hid, dropout=dropout)

    def forward(self, dec_input):
        dec_slf_attn_sub_mask = get_attn_subsequent_mask(dec_input[:, :, 0]).to(dec_input.device)
        dec_slf_attn_mask = torch.gt(dec_slf_attn_sub_mask, 0)
        dec_output, dec_slf_attn = self.slf_attn(dec_input, dec_input, dec_input, attn_mask=dec_slf_attn_mask)
        dec_output = self.pos_ffn(dec_output)

        return dec_output


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "jadore801120/attention-is-all-you-need-pytorch transformer/SubLayers.py @ 144902aa6fc57cfa294db487f796dad600210d5e (+ Modules.py @ 002815545bf743d0bf2b9d172af047b37e20b6e9)"
REFERENCE = {"n_head": 4, "activation": "relu"}
BLOCK = DecoderLayer
ARGS = {"d_model": 32, "d_inner_hid": 128, "n_head": 4, "d_k": 8, "d_v": 8}


def weights(b):
    a, f = b.slf_attn, b.pos_ffn

    def heads(W):  # (nh, C, hs) used as x @ W[h] -> (nh * hs, C) stored (out, in)
        return torch.cat(list(W.transpose(1, 2))), None

    return {
        "ln1": (a.layer_norm.a_2, a.layer_norm.b_2),
        "q": heads(a.w_qs),
        "k": heads(a.w_ks),
        "v": heads(a.w_vs),
        "proj": (a.proj.linear.weight, a.proj.linear.bias),
        "ln2": (f.layer_norm.a_2, f.layer_norm.b_2),
        "fc1": (f.w_1.weight[..., 0], f.w_1.bias),  # Conv1d weight (out, in, 1)
        "fc2": (f.w_2.weight[..., 0], f.w_2.bias),
    }


FILL = 'attn.data.masked_fill_(attn_mask, -float("inf"))'
MISTAKES = {
    "no_scaling": [("attn = torch.bmm(q, k.transpose(1, 2)) / self.temper", "attn = torch.bmm(q, k.transpose(1, 2))")],
    "wrong_scale": [
        ("self.attention = ScaledDotProductAttention(d_k)", "self.attention = ScaledDotProductAttention(d_model)")
    ],  # the source's own
    "wrong_scale:1/hs": [("self.temper = np.power(d_k, 0.5)", "self.temper = d_k")],
    "future_leak": [("attn_mask=dec_slf_attn_mask)", "attn_mask=torch.zeros_like(dec_slf_attn_mask))")],
    "mask_reversed": [
        ("dec_slf_attn_mask = torch.gt(dec_slf_attn_sub_mask, 0)", "dec_slf_attn_mask = dec_slf_attn_sub_mask == 0")
    ],  # as the tutorial's greedy decoder passes it
    "mask_zero": [(FILL, "attn.data.masked_fill_(attn_mask, 0)")],
    "softmax_dim": [("self.softmax = nn.Softmax(dim=-1)", "self.softmax = nn.Softmax(dim=1)")],
    "heads_mixed:merge": [
        (
            "outputs = torch.cat(torch.split(outputs, mb_size, dim=0), dim=-1)",
            "outputs = outputs.view(mb_size, len_q, -1)",
        )
    ],  # this version's own
    "post_norm": [
        ("q = k = v = self.layer_norm(q)\n", "\n"),
        ("return outputs + residual, attns", "return self.layer_norm(outputs + residual), attns"),
        ("self.relu(self.w_1(self.layer_norm(x).transpose(1, 2)))", "self.relu(self.w_1(x.transpose(1, 2)))"),
        ("return output + residual", "return self.layer_norm(output + residual)"),
    ],
    "no_residual:attn": [("return outputs + residual, attns", "return outputs, attns")],
    "no_residual:mlp": [("return output + residual", "return output")],
}
PAIRS = [("wrong_scale", "post_norm"), ("mask_zero", "no_residual:mlp")]
