# Source: google-deepmind/dm-haiku, examples/transformer/model.py
#   commit 1166c05f2ce5f26cd90cfe3920fe232bed2dd90d: _layer_norm, Transformer (with haiku's
#   hk.MultiHeadAttention, hk.Linear, hk.Sequential that it calls).
# Ported from Haiku (JAX) to torch, keeping its shape: Transformer(num_heads, num_layers,
# attn_size, dropout_rate, widening_factor) whose __call__ loops over layers; the causal mask
# made in __call__ as np.tril(np.ones((1, 1, T, T))) times the padding mask [B, T] (mask[:, None,
# None, :]); hk.MultiHeadAttention(num_heads, key_size, model_size) as query / key / value
# linears reshaped to [..., T, H, K], einsum "...thd,...Thd->...htT", division by np.sqrt(key_size),
# jnp.where(mask, logits, -1e30), softmax, einsum "...htT,...Thd->...thd", reshape and the final
# linear; the two residual additions; the dense block Sequential([Linear(widening_factor *
# model_size), jax.nn.gelu (tanh approximation, haiku's default), Linear(model_size)]);
# LayerNorm(create_scale, create_offset), epsilon 1e-5.
# (The logits are divided by np.sqrt(key_size) as a NumPy float64 scalar; Haiku casts it to key.dtype.)
# Reduced: model_size is a constructor argument (Haiku reads it from the input); num_layers=1 and
# the stack's final _layer_norm(h) left out (it belongs to the model, not to a block); dropout not
# applied (evaluation); the padding mask defaults to all ones.
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class MultiHeadAttention(nn.Module):
    """Multi-headed attention (MHA) module (haiku's hk.MultiHeadAttention)."""

    def __init__(self, num_heads, key_size, model_size):
        super().__init__()
        self.num_heads = num_heads
        self.key_size = key_size
        self.value_size = key_size
        self.model_size = model_size
        self.query = nn.Linear(model_size, num_heads * key_size)
        self.key = nn.Linear(model_size, num_heads * key_size)
        self.value = nn.Linear(model_size, num_heads * self.value_size)
        self.linear = nn.Linear(num_heads * self.value_size, model_size)

    def _linear_projection(self, x, head_size, linear):
        y = linear(x)
        *leading_dims, _ = x.shape
        return y.reshape((*leading_dims, self.num_heads, head_size))

    def forward(self, query, key, value, mask=None):
        *leading_dims, sequence_length, _ = query.shape

        query_heads = self._linear_projection(query, self.key_size, self.query)  # [T', H, Q=K]
        key_heads = self._linear_projection(key, self.key_size, self.key)  # [T, H, K]
        value_heads = self._linear_projection(value, self.value_size, self.value)  # [T, H, V]

        # Compute attention weights.
        attn_logits = torch.einsum("...thd,...Thd->...htT", query_heads, key_heads)
        attn_logits = attn_logits / np.sqrt(self.key_size)
        if mask is not None:
            if mask.ndim != attn_logits.ndim:
                raise ValueError(
                    f"Mask dimensionality {mask.ndim} must match logits dimensionality "
                    f"{attn_logits.ndim}."
                )
            attn_logits = torch.where(mask.bool(), attn_logits, -1e30)
        attn_weights = F.softmax(attn_logits, dim=-1)  # [H, T', T]

        # Weight the values by the attention and flatten the head vectors.
        attn = torch.einsum("...htT,...Thd->...thd", attn_weights, value_heads)
        attn = torch.reshape(attn, (*leading_dims, sequence_length, -1))  # [T', H*V]

        # Apply another projection to get the final embeddings.
        return self.linear(attn)  # [T', D']


class Transformer(nn.Module):
    """A transformer stack."""

    def __init__(self, num_heads, num_layers, attn_size, dropout_rate, model_size, widening_factor=4):
        super().__init__()
        self.num_heads = num_heads  # Number of attention heads.
        self.num_layers = num_layers  # Number of transformer (attention + MLP) layers to stack.
        self.attn_size = attn_size  # Size of the attention (key, query, value) vectors.
        self.dropout_rate = dropout_rate  # Probability with which to apply dropout.
        self.widening_factor = widening_factor  # Factor by which the MLP hidden layer widens.
        self.layers = nn.ModuleList()
        for _ in range(num_layers):
            self.layers.append(nn.ModuleDict(dict(
                layer_norm=nn.LayerNorm(model_size, eps=1e-5),
                multi_head_attention=MultiHeadAttention(num_heads, attn_size, model_size),
                layer_norm_1=nn.LayerNorm(model_size, eps=1e-5),
                sequential=nn.Sequential(
                    nn.Linear(model_size, widening_factor * model_size),
                    nn.GELU(approximate="tanh"),
                    nn.Linear(widening_factor * model_size, model_size),
                ),
            )))

    def forward(self, embeddings, mask=None):
        """Transforms input embedding sequences to output embedding sequences."""
        _, seq_len, model_size = embeddings.shape
        if mask is None:
            mask = torch.ones(embeddings.shape[:2], dtype=embeddings.dtype)

        # Compute causal mask for autoregressive sequence modelling.
        mask = mask[:, None, None, :]  # [B, H=1, T'=1, T]
        causal_mask = torch.from_numpy(np.tril(np.ones((1, 1, seq_len, seq_len))))  # [B=1, H=1, T, T]
        mask = mask * causal_mask  # [B, H=1, T, T]

        h = embeddings
        for layer in self.layers:
            # First the attention block.
            attn_block = layer["multi_head_attention"]
            h_norm = layer["layer_norm"](h)
            h_attn = attn_block(h_norm, h_norm, h_norm, mask=mask)
            h = h + h_attn

            # Then the dense block.
            dense_block = layer["sequential"]
            h_norm = layer["layer_norm_1"](h)
            h_dense = dense_block(h_norm)
            h = h + h_dense

        return h


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "google-deepmind/dm-haiku examples/transformer/model.py @ 1166c05f2ce5f26cd90cfe3920fe232bed2dd90d"
REFERENCE = {"n_head": 4, "activation": "gelu_tanh", "norm_eps": 1e-5}
BLOCK = Transformer
ARGS = {"num_heads": 4, "num_layers": 1, "attn_size": 8, "dropout_rate": 0.1, "model_size": 32, "widening_factor": 4}


def weights(b):
    L = b.layers[0]
    a, f = L["multi_head_attention"], L["sequential"]
    return {
        "ln1": (L["layer_norm"].weight, L["layer_norm"].bias),
        "q": (a.query.weight, a.query.bias),
        "k": (a.key.weight, a.key.bias),
        "v": (a.value.weight, a.value.bias),
        "proj": (a.linear.weight, a.linear.bias),
        "ln2": (L["layer_norm_1"].weight, L["layer_norm_1"].bias),
        "fc1": (f[0].weight, f[0].bias),
        "fc2": (f[2].weight, f[2].bias),
    }


SCALE = "attn_logits = attn_logits / np.sqrt(self.key_size)"
WHERE = "attn_logits = torch.where(mask.bool(), attn_logits, -1e30)"
SOFTMAX = "attn_weights = F.softmax(attn_logits, dim=-1)"
CAUSAL = "causal_mask = torch.from_numpy(np.tril(np.ones((1, 1, seq_len, seq_len))))"
MISTAKES = {
    "no_scaling": [(SCALE, "attn_logits = attn_logits")],
    "wrong_scale": [(SCALE, "attn_logits = attn_logits / np.sqrt(self.model_size)")],
    "wrong_scale:1/hs": [(SCALE, "attn_logits = attn_logits / self.key_size")],
    "future_leak": [("mask = mask * causal_mask", "mask = mask * torch.ones_like(causal_mask)")],
    "mask_reversed": [(CAUSAL, "causal_mask = torch.from_numpy(np.triu(np.ones((1, 1, seq_len, seq_len)), 1))")],
    "mask_zero": [(WHERE, "attn_logits = torch.where(mask.bool(), attn_logits, 0.0)")],
    "softmax_dim": [(SOFTMAX, "attn_weights = F.softmax(attn_logits, dim=-2)")],
    "heads_mixed:split": [("return y.reshape((*leading_dims, self.num_heads, head_size))",
                           "return y.reshape((*leading_dims[:-1], self.num_heads, leading_dims[-1], head_size)).transpose(-2, -3)")],
    "no_residual:attn": [("h = h + h_attn", "h = h_attn")],
    "no_residual:mlp": [("h = h + h_dense", "h = h_dense")],
    "shared_norm": [('h_norm = layer["layer_norm_1"](h)', 'h_norm = layer["layer_norm"](h)')],
    "inplace": [("h = h + h_attn", "h += h_attn"), ("h = h + h_dense", "h += h_dense")],
}
PAIRS = [("wrong_scale:1/hs", "no_residual:mlp")]
