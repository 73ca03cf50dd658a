# Source: pytorch/tutorials, beginner_source/transformer_tutorial.py
#   commit 00109f5abe4d664833ae7cde8b694b41356adb2b ("Language Modeling with nn.Transformer"):
#   TransformerModel's nn.TransformerEncoder(nn.TransformerEncoderLayer(d_model, nhead, d_hid,
#   dropout), nlayers), run sequence-first on [seq_len, batch_size, d_model].
# Kept: PyTorch's own encoder layer and encoder (nn.MultiheadAttention inside, batch_first=False,
# ReLU MLP linear1 / linear2, norm1 / norm2), the sequence-first layout, the float causal mask
# nn.Transformer.generate_square_subsequent_mask (as the tutorial's earlier versions pass it).
# Reduced: norm_first=True (the tutorial's layer is post-norm: this zoo's post_norm), d_hid =
# 4 * d_model, nlayers = 1, no embedding / positional encoding / output linear; this version of
# the tutorial passes src_mask=None (this zoo's future_leak): the mask is passed here.
import torch  # noqa: F401 -- a learner's mask line (mask_reversed) calls it
from torch import Tensor, nn
from torch.nn import TransformerEncoder, TransformerEncoderLayer


class TransformerModel(nn.Module):
    def __init__(self, d_model: int, nhead: int, d_hid: int, nlayers: int, dropout: float = 0.5):
        super().__init__()
        self.model_type = "Transformer"
        encoder_layers = TransformerEncoderLayer(d_model, nhead, d_hid, dropout, norm_first=True)
        self.transformer_encoder = TransformerEncoder(encoder_layers, nlayers, enable_nested_tensor=False)
        self.d_model = d_model

    def forward(self, src: Tensor) -> Tensor:
        """
        Arguments:
            src: Tensor, shape ``[batch_size, seq_len, d_model]`` (the zoo's blocks take (B, T, C))

        Returns:
            output Tensor of shape ``[batch_size, seq_len, d_model]``
        """
        src = src.transpose(0, 1)  # ``[seq_len, batch_size, d_model]``, as the tutorial batches
        src_mask = nn.Transformer.generate_square_subsequent_mask(len(src)).to(src)
        output = self.transformer_encoder(src, src_mask)
        return output.transpose(0, 1)


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "pytorch/tutorials beginner_source/transformer_tutorial.py @ 00109f5abe4d664833ae7cde8b694b41356adb2b"
REFERENCE = {"n_head": 4, "activation": "relu"}
BLOCK = TransformerModel
ARGS = {"d_model": 32, "nhead": 4, "d_hid": 128, "nlayers": 1, "dropout": 0.2}


def weights(b):
    layer = b.transformer_encoder.layers[0]
    a = layer.self_attn
    q, k, v = a.in_proj_weight.chunk(3)
    bq, bk, bv = a.in_proj_bias.chunk(3)
    return {
        "ln1": (layer.norm1.weight, layer.norm1.bias),
        "q": (q, bq),
        "k": (k, bk),
        "v": (v, bv),
        "proj": (a.out_proj.weight, a.out_proj.bias),
        "ln2": (layer.norm2.weight, layer.norm2.bias),
        "fc1": (layer.linear1.weight, layer.linear1.bias),
        "fc2": (layer.linear2.weight, layer.linear2.bias),
    }


MASK = "src_mask = nn.Transformer.generate_square_subsequent_mask(len(src)).to(src)"
MISTAKES = {
    "future_leak": [
        ("output = self.transformer_encoder(src, src_mask)", "output = self.transformer_encoder(src)")
    ],  # this version's own
    "mask_reversed": [(MASK, "src_mask = torch.tril(torch.ones(len(src), len(src), dtype=torch.bool))")],
    "post_norm": [
        (
            "TransformerEncoderLayer(d_model, nhead, d_hid, dropout, norm_first=True)",
            "TransformerEncoderLayer(d_model, nhead, d_hid, dropout)",
        )
    ],  # the tutorial's own
    "batch_mixing": [
        ("src = src.transpose(0, 1)  # ``[seq_len, batch_size, d_model]``, as the tutorial batches\n", "\n"),
        ("return output.transpose(0, 1)", "return output"),
    ],
}
PAIRS = [("post_norm", "future_leak"), ("batch_mixing", "post_norm")]
