# Source: graykode/nlp-tutorial, 5-1.Transformer/Transformer-Torch.py
#   commit 0e67ef8d1f55ab8ae6acbde709e23c32ff63115d: ScaledDotProductAttention,
#   MultiHeadAttention, PoswiseFeedForwardNet, DecoderLayer, the subsequent mask.
# Kept: module-level hyperparameters (d_model, d_ff, d_k = d_v, n_heads) read by argument-less
# constructors, W_Q / W_K / W_V with view(batch_size, -1, n_heads, d_k).transpose(1, 2), the
# bool mask (True = blocked) repeated per head and filled in place with -1e9, np.sqrt(d_k), the
# norm and residual inside each sub-layer, nn.LayerNorm(d_model) built inside forward (so it has
# no weights of the block's own), the MLP as two nn.Conv1d(kernel_size=1) channels-first.
# Reduced: the sub-layers are post-norm (LayerNorm(output + residual)): here they normalise their
# input; the output projection is built once in __init__ (this version builds a fresh random
# nn.Linear in every forward); the mask from np.triu(..., 1) (the greedy decoder's `== 0` passes
# the reversed one); no encoder-decoder attention.
import numpy as np
import torch
import torch.nn as nn

d_model = 32  # Embedding Size
d_ff = 128  # FeedForward dimension
d_k = d_v = 8  # dimension of K(=Q), V
n_heads = 4  # number of heads in Multi-Head Attention


def get_attn_subsequent_mask(seq):
    attn_shape = [seq.size(0), seq.size(1), seq.size(1)]
    subsequent_mask = np.triu(np.ones(attn_shape), k=1)
    subsequent_mask = torch.from_numpy(subsequent_mask).byte()
    return subsequent_mask


class ScaledDotProductAttention(nn.Module):
    def __init__(self):
        super(ScaledDotProductAttention, self).__init__()

    def forward(self, Q, K, V, attn_mask=None):
        # scores : [batch_size x n_heads x len_q(=len_k) x len_k(=len_q)]
        scores = torch.matmul(Q, K.transpose(-1, -2)) / np.sqrt(d_k)
        if attn_mask is not None:
            scores.masked_fill_(attn_mask, -1e9)
        attn = nn.Softmax(dim=-1)(scores)
        context = torch.matmul(attn, V)
        return context, attn


class MultiHeadAttention(nn.Module):
    def __init__(self):
        super(MultiHeadAttention, self).__init__()
        self.W_Q = nn.Linear(d_model, d_k * n_heads)
        self.W_K = nn.Linear(d_model, d_k * n_heads)
        self.W_V = nn.Linear(d_model, d_v * n_heads)
        self.linear = nn.Linear(n_heads * d_v, d_model)

    def forward(self, Q, K, V, attn_mask=None):
        # q: [batch_size x len_q x d_model], k: [batch_size x len_k x d_model], v: [batch_size x len_k x d_model]
        residual, batch_size = Q, Q.size(0)
        Q = K = V = nn.LayerNorm(d_model).to(Q)(Q)
        # (B, S, D) -proj-> (B, S, D) -split-> (B, S, H, W) -trans-> (B, H, S, W)
        # q_s: [batch_size x n_heads x len_q x d_k], k_s and v_s: [batch_size x n_heads x len_k x d_k]
        q_s = self.W_Q(Q).view(batch_size, -1, n_heads, d_k).transpose(1, 2)
        k_s = self.W_K(K).view(batch_size, -1, n_heads, d_k).transpose(1, 2)
        v_s = self.W_V(V).view(batch_size, -1, n_heads, d_v).transpose(1, 2)

        if attn_mask is not None:  # attn_mask : [batch_size x len_q x len_k]
            # attn_mask : [batch_size x n_heads x len_q x len_k]
            attn_mask = attn_mask.unsqueeze(1).repeat(1, n_heads, 1, 1)
        # context: [batch_size x n_heads x len_q x d_v], attn: [batch_size x n_heads x len_q(=len_k) x len_k(=len_q)]
        context, attn = ScaledDotProductAttention()(q_s, k_s, v_s, attn_mask=attn_mask)
        # context: [batch_size x len_q x n_heads * d_v]
        context = context.transpose(1, 2).contiguous().view(batch_size, -1, n_heads * d_v)
        output = self.linear(context)
        return output + residual, attn  # output: [batch_size x len_q x d_model]


class PoswiseFeedForwardNet(nn.Module):
    def __init__(self):
        super(PoswiseFeedForwardNet, self).__init__()
        self.conv1 = nn.Conv1d(in_channels=d_model, out_channels=d_ff, kernel_size=1)
        self.conv2 = nn.Conv1d(in_channels=d_ff, out_channels=d_model, kernel_size=1)

    def forward(self, inputs):
        residual = inputs  # inputs : [batch_size, len_q, d_model]
        output = nn.ReLU()(self.conv1(nn.LayerNorm(d_model).to(inputs)(inputs).transpose(1, 2)))
        output = self.conv2(output).transpose(1, 2)
        return output + residual


class DecoderLayer(nn.Module):
    def __init__(self):
        super(DecoderLayer, self).__init__()
        self.dec_self_attn = MultiHeadAttention()
        self.pos_ffn = PoswiseFeedForwardNet()

    def forward(self, dec_inputs):
        dec_self_attn_mask = get_attn_subsequent_mask(dec_inputs[:, :, 0]).bool().to(dec_inputs.device)
        dec_outputs, dec_self_attn = self.dec_self_attn(dec_inputs, dec_inputs, dec_inputs, dec_self_attn_mask)
        dec_outputs = self.pos_ffn(dec_outputs)
        return dec_outputs


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "graykode/nlp-tutorial 5-1.Transformer/Transformer-Torch.py @ 0e67ef8d1f55ab8ae6acbde709e23c32ff63115d"
REFERENCE = {"n_head": n_heads, "activation": "relu"}
BLOCK = DecoderLayer
ARGS = {}


def weights(b):
    a, f = b.dec_self_attn, b.pos_ffn
    return {
        "ln1": (None, None),  # nn.LayerNorm(d_model) made afresh in forward: gain 1, bias 0
        "q": (a.W_Q.weight, a.W_Q.bias),
        "k": (a.W_K.weight, a.W_K.bias),
        "v": (a.W_V.weight, a.W_V.bias),
        "proj": (a.linear.weight, a.linear.bias),
        "ln2": (None, None),
        "fc1": (f.conv1.weight[..., 0], f.conv1.bias),  # Conv1d weight (out, in, 1)
        "fc2": (f.conv2.weight[..., 0], f.conv2.bias),
    }


SCORES = "scores = torch.matmul(Q, K.transpose(-1, -2)) / np.sqrt(d_k)"
MISTAKES = {
    "no_scaling": [(SCORES, "scores = torch.matmul(Q, K.transpose(-1, -2))")],
    "wrong_scale": [(SCORES, "scores = torch.matmul(Q, K.transpose(-1, -2)) / np.sqrt(d_model)")],
    "wrong_scale:sqrt": [(SCORES, "scores = torch.matmul(Q, K.transpose(-1, -2)) * np.sqrt(d_k)")],
    "future_leak": [
        ("dec_inputs, dec_inputs, dec_inputs, dec_self_attn_mask)", "dec_inputs, dec_inputs, dec_inputs)")
    ],
    "mask_reversed": [
        (".bool().to(dec_inputs.device)", ".bool().to(dec_inputs.device) == 0")
    ],  # as its greedy decoder does
    "mask_zero": [("scores.masked_fill_(attn_mask, -1e9)", "scores.masked_fill_(attn_mask, 0)")],
    "softmax_dim": [("attn = nn.Softmax(dim=-1)(scores)", "attn = nn.Softmax(dim=-2)(scores)")],
    "heads_mixed:merge": [
        ("context = context.transpose(1, 2).contiguous().view(", "context = context.contiguous().view(")
    ],
    "post_norm": [
        ("Q = K = V = nn.LayerNorm(d_model).to(Q)(Q)\n", "\n"),
        ("return output + residual, attn", "return nn.LayerNorm(d_model).to(output)(output + residual), attn"),
        ("self.conv1(nn.LayerNorm(d_model).to(inputs)(inputs).transpose(1, 2))", "self.conv1(inputs.transpose(1, 2))"),
        ("return output + residual\n", "return nn.LayerNorm(d_model).to(output)(output + residual)\n"),
    ],
    "no_residual:attn": [("return output + residual, attn", "return output, attn")],
    "no_residual:mlp": [("return output + residual\n", "return output\n")],
}
PAIRS = [("no_scaling", "no_residual:attn"), ("mask_zero", "post_norm")]
