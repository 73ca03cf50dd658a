# Source: huggingface/transformers, src/transformers/models/ctrl/modeling_ctrl.py
#   commit 00b676f8f0489b88652a31d70751cc540dd06305: scaled_dot_product_attention,
#   MultiHeadAttention, point_wise_feed_forward_network, EncoderLayer.
# Kept: EncoderLayer(d_model_size, num_heads, dff, rate) with layernorm1 / layernorm2 (eps 1e-6),
# dropout1 / dropout2; MultiHeadAttention taking (v, k, q, mask) in that order, Wq / Wk / Wv /
# dense, split_into_heads with reshape(batch, -1, nh, depth) and permute([0, 2, 1, 3]); the
# module-level scaled_dot_product_attention with k.permute(0, 1, 3, 2), division by np.sqrt(dk),
# the additive mask (the triu of ones, 1 where blocked, times -1e4, added in place to the
# logits); torch.softmax; the attention returning (output, attn) and the layer
# reading attn_outputs[0]; the FFN as an nn.Sequential(Linear, ReLU, Linear) made by a function.
# Reduced: CTRLModel builds the triu mask and passes it in: here the layer builds it when given
# none; no cache, no head mask, no attention_mask; the layer returns out2 (the source returns the
# tuple (out2,) + attn_outputs[1:]).
import numpy as np
import torch
from torch import nn


def scaled_dot_product_attention(q, k, v, mask, attention_mask=None, head_mask=None):
    # calculate attention
    matmul_qk = torch.matmul(q, k.permute(0, 1, 3, 2))

    dk = k.shape[-1]
    scaled_attention_logits = matmul_qk / np.sqrt(dk)

    if mask is not None:
        nd, ns = scaled_attention_logits.size(-2), scaled_attention_logits.size(-1)
        scaled_attention_logits += mask[ns - nd : ns, :ns] * -1e4

    if attention_mask is not None:
        # Apply the attention mask
        scaled_attention_logits = scaled_attention_logits + attention_mask

    attention_weights = torch.softmax(scaled_attention_logits, dim=-1)

    # Mask heads if we want to
    if head_mask is not None:
        attention_weights = attention_weights * head_mask

    output = torch.matmul(attention_weights, v)

    return output, attention_weights


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model_size, num_heads, layer_idx=None):
        super().__init__()
        self.num_heads = num_heads
        self.d_model_size = d_model_size
        self.layer_idx = layer_idx

        self.depth = int(d_model_size / self.num_heads)

        self.Wq = nn.Linear(d_model_size, d_model_size)
        self.Wk = nn.Linear(d_model_size, d_model_size)
        self.Wv = nn.Linear(d_model_size, d_model_size)

        self.dense = nn.Linear(d_model_size, d_model_size)

    def split_into_heads(self, x, batch_size):
        x = x.reshape(batch_size, -1, self.num_heads, self.depth)
        return x.permute([0, 2, 1, 3])

    def forward(self, v, k, q, mask, attention_mask=None, head_mask=None):
        batch_size = q.shape[0]

        q = self.Wq(q)
        k = self.Wk(k)
        v = self.Wv(v)

        q = self.split_into_heads(q, batch_size)
        k = self.split_into_heads(k, batch_size)
        v = self.split_into_heads(v, batch_size)

        output = scaled_dot_product_attention(q, k, v, mask, attention_mask, head_mask)
        scaled_attention = output[0].permute([0, 2, 1, 3])
        attn = output[1]
        original_size_attention = scaled_attention.reshape(batch_size, -1, self.d_model_size)
        output = self.dense(original_size_attention)
        return output, attn


def point_wise_feed_forward_network(d_model_size, dff):
    return nn.Sequential(nn.Linear(d_model_size, dff), nn.ReLU(), nn.Linear(dff, d_model_size))


class EncoderLayer(nn.Module):
    def __init__(self, d_model_size, num_heads, dff, rate=0.1, layer_idx=None):
        super().__init__()

        self.multi_head_attention = MultiHeadAttention(d_model_size, num_heads, layer_idx=layer_idx)
        self.ffn = point_wise_feed_forward_network(d_model_size, dff)

        self.layernorm1 = nn.LayerNorm(d_model_size, eps=1e-6)
        self.layernorm2 = nn.LayerNorm(d_model_size, eps=1e-6)

        self.dropout1 = nn.Dropout(rate)
        self.dropout2 = nn.Dropout(rate)

    def forward(self, x, mask=None, attention_mask=None, head_mask=None):
        if mask is None:
            seq_len = x.shape[1]
            mask = torch.triu(torch.ones(seq_len, seq_len), 1).to(x.device, x.dtype)
        normed = self.layernorm1(x)
        attn_outputs = self.multi_head_attention(
            normed,
            normed,
            normed,
            mask,
            attention_mask=attention_mask,
            head_mask=head_mask,
        )
        attn_output = attn_outputs[0]
        attn_output = self.dropout1(attn_output)
        out1 = x + attn_output

        out2 = self.layernorm2(out1)
        ffn_output = self.ffn(out2)
        ffn_output = self.dropout2(ffn_output)
        out2 = out1 + ffn_output

        return out2


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "huggingface/transformers src/transformers/models/ctrl/modeling_ctrl.py @ 00b676f8f0489b88652a31d70751cc540dd06305"
REFERENCE = {"n_head": 4, "activation": "relu", "norm_eps": 1e-6}
BLOCK = EncoderLayer
ARGS = {"d_model_size": 32, "num_heads": 4, "dff": 128, "rate": 0.1}


def weights(b):
    a = b.multi_head_attention
    return {
        "ln1": (b.layernorm1.weight, b.layernorm1.bias),
        "q": (a.Wq.weight, a.Wq.bias),
        "k": (a.Wk.weight, a.Wk.bias),
        "v": (a.Wv.weight, a.Wv.bias),
        "proj": (a.dense.weight, a.dense.bias),
        "ln2": (b.layernorm2.weight, b.layernorm2.bias),
        "fc1": (b.ffn[0].weight, b.ffn[0].bias),
        "fc2": (b.ffn[2].weight, b.ffn[2].bias),
    }


SCALE = "scaled_attention_logits = matmul_qk / np.sqrt(dk)"
MASK = "scaled_attention_logits += mask[ns - nd : ns, :ns] * -1e4"
SOFTMAX = "attention_weights = torch.softmax(scaled_attention_logits, dim=-1)"
R1 = "out1 = x + attn_output"
R2 = "out2 = out1 + ffn_output"
MISTAKES = {
    "no_scaling": [(SCALE, "scaled_attention_logits = matmul_qk")],
    "wrong_scale": [(SCALE, "scaled_attention_logits = matmul_qk / np.sqrt(k.shape[1] * dk)")],
    "wrong_scale:1/hs": [(SCALE, "scaled_attention_logits = matmul_qk / dk")],
    "future_leak": [(MASK, "pass  # " + MASK)],
    "mask_reversed": [("mask = torch.triu(torch.ones(seq_len, seq_len), 1)", "mask = torch.tril(torch.ones(seq_len, seq_len))")],
    "softmax_dim": [(SOFTMAX, "attention_weights = torch.softmax(scaled_attention_logits, dim=-2)")],
    "heads_mixed:split": [("x = x.reshape(batch_size, -1, self.num_heads, self.depth)\n        return x.permute([0, 2, 1, 3])",
                           "return x.reshape(batch_size, self.num_heads, -1, self.depth)")],
    "heads_mixed:merge": [("scaled_attention = output[0].permute([0, 2, 1, 3])", "scaled_attention = output[0]")],
    "no_residual:attn": [(R1, "out1 = attn_output")],
    "no_residual:mlp": [(R2, "out2 = ffn_output")],
    "shared_norm": [("out2 = self.layernorm2(out1)", "out2 = self.layernorm1(out1)")],
    "inplace": [(R1, "out1 = x\n        out1 += attn_output")],
}
PAIRS = [("no_scaling", "shared_norm")]
