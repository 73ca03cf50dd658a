# Source: bentrevett/pytorch-seq2seq, "6 - Attention is All You Need.ipynb"
#   commit 7faa64a895fe4b76cb87409d66a0ba349a78298e: MultiHeadAttentionLayer,
#   PositionwiseFeedforwardLayer, DecoderLayer and Seq2Seq.make_trg_mask.
# Kept: layers built with a `device` argument, fc_q / fc_k / fc_v / fc_o, the scale as a float32
# tensor (torch.sqrt(torch.FloatTensor([head_dim])).to(device), not a buffer), view then
# permute(0, 2, 1, 3), K.permute(0, 1, 3, 2) for the product, energy / self.scale,
# masked_fill(mask == 0, -1e10), dropout on the attention before the product with V, the merge
# permute(0, 2, 1, 3).contiguous().view(batch_size, -1, hid_dim), fc_1 / ReLU / fc_2, the
# DecoderLayer's self_attn_layer_norm / ff_layer_norm and dropout, the target mask from tril.
# Reduced: the tutorial's layers are post-norm (trg = norm(trg + dropout(_trg))): here pre-norm;
# no encoder attention (a decoder-only layer) and no padding mask.
import torch
import torch.nn as nn


class MultiHeadAttentionLayer(nn.Module):
    def __init__(self, hid_dim, n_heads, dropout, device):
        super().__init__()

        assert hid_dim % n_heads == 0

        self.hid_dim = hid_dim
        self.n_heads = n_heads
        self.head_dim = hid_dim // n_heads

        self.fc_q = nn.Linear(hid_dim, hid_dim)
        self.fc_k = nn.Linear(hid_dim, hid_dim)
        self.fc_v = nn.Linear(hid_dim, hid_dim)

        self.fc_o = nn.Linear(hid_dim, hid_dim)

        self.dropout = nn.Dropout(dropout)

        self.scale = torch.sqrt(torch.FloatTensor([self.head_dim])).to(device)

    def forward(self, query, key, value, mask=None):
        batch_size = query.shape[0]

        # query = [batch size, query len, hid dim]
        # key = [batch size, key len, hid dim]
        # value = [batch size, value len, hid dim]

        Q = self.fc_q(query)
        K = self.fc_k(key)
        V = self.fc_v(value)

        # Q = [batch size, query len, hid dim]

        Q = Q.view(batch_size, -1, self.n_heads, self.head_dim).permute(0, 2, 1, 3)
        K = K.view(batch_size, -1, self.n_heads, self.head_dim).permute(0, 2, 1, 3)
        V = V.view(batch_size, -1, self.n_heads, self.head_dim).permute(0, 2, 1, 3)

        # Q = [batch size, n heads, query len, head dim]

        energy = torch.matmul(Q, K.permute(0, 1, 3, 2)) / self.scale

        # energy = [batch size, n heads, query len, key len]

        if mask is not None:
            energy = energy.masked_fill(mask == 0, -1e10)

        attention = torch.softmax(energy, dim=-1)

        # attention = [batch size, n heads, query len, key len]

        x = torch.matmul(self.dropout(attention), V)

        # x = [batch size, n heads, query len, head dim]

        x = x.permute(0, 2, 1, 3).contiguous()

        # x = [batch size, query len, n heads, head dim]

        x = x.view(batch_size, -1, self.hid_dim)

        # x = [batch size, query len, hid dim]

        x = self.fc_o(x)

        return x, attention


class PositionwiseFeedforwardLayer(nn.Module):
    def __init__(self, hid_dim, pf_dim, dropout):
        super().__init__()

        self.fc_1 = nn.Linear(hid_dim, pf_dim)
        self.fc_2 = nn.Linear(pf_dim, hid_dim)

        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        # x = [batch size, seq len, hid dim]

        x = self.dropout(torch.relu(self.fc_1(x)))

        # x = [batch size, seq len, pf dim]

        x = self.fc_2(x)

        return x


class DecoderLayer(nn.Module):
    def __init__(self, hid_dim, n_heads, pf_dim, dropout, device):
        super().__init__()

        self.self_attn_layer_norm = nn.LayerNorm(hid_dim)
        self.ff_layer_norm = nn.LayerNorm(hid_dim)
        self.self_attention = MultiHeadAttentionLayer(hid_dim, n_heads, dropout, device)
        self.positionwise_feedforward = PositionwiseFeedforwardLayer(hid_dim, pf_dim, dropout)
        self.dropout = nn.Dropout(dropout)
        self.device = device

    def make_trg_mask(self, trg):
        # trg = [batch size, trg len, hid dim]
        trg_len = trg.shape[1]
        trg_sub_mask = torch.tril(torch.ones((trg_len, trg_len), device=self.device)).bool()
        # trg_sub_mask = [trg len, trg len]
        return trg_sub_mask

    def forward(self, trg, trg_mask=None):
        if trg_mask is None:
            trg_mask = self.make_trg_mask(trg)

        # self attention
        _trg = self.self_attn_layer_norm(trg)
        _trg, _ = self.self_attention(_trg, _trg, _trg, trg_mask)

        # dropout, residual connection
        trg = trg + self.dropout(_trg)

        # positionwise feedforward
        _trg = self.positionwise_feedforward(self.ff_layer_norm(trg))

        # dropout, residual
        trg = trg + self.dropout(_trg)

        # trg = [batch size, trg len, hid dim]

        return trg


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "bentrevett/pytorch-seq2seq 6 - Attention is All You Need.ipynb @ 7faa64a895fe4b76cb87409d66a0ba349a78298e"
REFERENCE = {"n_head": 4, "activation": "relu"}
BLOCK = DecoderLayer
ARGS = {"hid_dim": 32, "n_heads": 4, "pf_dim": 128, "dropout": 0.1, "device": "cpu"}
TOLERANCE = 1e-6  # the scale is a float32 tensor, as in the tutorial


def weights(b):
    a, f = b.self_attention, b.positionwise_feedforward
    return {
        "ln1": (b.self_attn_layer_norm.weight, b.self_attn_layer_norm.bias),
        "q": (a.fc_q.weight, a.fc_q.bias),
        "k": (a.fc_k.weight, a.fc_k.bias),
        "v": (a.fc_v.weight, a.fc_v.bias),
        "proj": (a.fc_o.weight, a.fc_o.bias),
        "ln2": (b.ff_layer_norm.weight, b.ff_layer_norm.bias),
        "fc1": (f.fc_1.weight, f.fc_1.bias),
        "fc2": (f.fc_2.weight, f.fc_2.bias),
    }


ENERGY = "energy = torch.matmul(Q, K.permute(0, 1, 3, 2)) / self.scale"
FILL = "energy = energy.masked_fill(mask == 0, -1e10)"
MISTAKES = {
    "no_scaling": [(ENERGY, "energy = torch.matmul(Q, K.permute(0, 1, 3, 2))")],
    "wrong_scale": [("torch.FloatTensor([self.head_dim])", "torch.FloatTensor([hid_dim])")],
    "wrong_scale:1/hs": [
        (
            "self.scale = torch.sqrt(torch.FloatTensor([self.head_dim])).to(device)",
            "self.scale = torch.FloatTensor([self.head_dim]).to(device)",
        )
    ],
    "future_leak": [("            trg_mask = self.make_trg_mask(trg)\n", "            pass\n")],
    "mask_zero": [(FILL, "energy = energy.masked_fill(mask == 0, 0)")],
    "mask_reversed": [(FILL, "energy = energy.masked_fill(mask == 1, -1e10)")],
    "softmax_dim": [("attention = torch.softmax(energy, dim=-1)", "attention = torch.softmax(energy, dim=2)")],
    "heads_mixed:split": [
        (
            "Q = Q.view(batch_size, -1, self.n_heads, self.head_dim).permute(0, 2, 1, 3)",
            "Q = Q.view(batch_size, self.n_heads, -1, self.head_dim)",
        ),
        (
            "K = K.view(batch_size, -1, self.n_heads, self.head_dim).permute(0, 2, 1, 3)",
            "K = K.view(batch_size, self.n_heads, -1, self.head_dim)",
        ),
        (
            "V = V.view(batch_size, -1, self.n_heads, self.head_dim).permute(0, 2, 1, 3)",
            "V = V.view(batch_size, self.n_heads, -1, self.head_dim)",
        ),
    ],
    "heads_mixed:merge": [("x = x.permute(0, 2, 1, 3).contiguous()", "x = x.contiguous()")],
    "post_norm": [  # the tutorial's own
        (
            "_trg = self.self_attn_layer_norm(trg)\n        _trg, _ = self.self_attention(_trg, _trg, _trg, trg_mask)",
            "_trg, _ = self.self_attention(trg, trg, trg, trg_mask)",
        ),
        (
            "trg = trg + self.dropout(_trg)\n\n        # positionwise",
            "trg = self.self_attn_layer_norm(trg + self.dropout(_trg))\n\n        # positionwise",
        ),
        ("_trg = self.positionwise_feedforward(self.ff_layer_norm(trg))", "_trg = self.positionwise_feedforward(trg)"),
        (
            "trg = trg + self.dropout(_trg)\n\n        # trg =",
            "trg = self.ff_layer_norm(trg + self.dropout(_trg))\n\n        # trg =",
        ),
    ],
    "no_residual:attn": [
        (
            "trg = trg + self.dropout(_trg)\n\n        # positionwise",
            "trg = self.dropout(_trg)\n\n        # positionwise",
        )
    ],
    "no_residual:mlp": [
        ("trg = trg + self.dropout(_trg)\n\n        # trg =", "trg = self.dropout(_trg)\n\n        # trg =")
    ],
    "shared_norm": [
        (
            "_trg = self.positionwise_feedforward(self.ff_layer_norm(trg))",
            "_trg = self.positionwise_feedforward(self.self_attn_layer_norm(trg))",
        )
    ],
}
PAIRS = [("no_scaling", "post_norm"), ("heads_mixed:merge", "shared_norm")]
