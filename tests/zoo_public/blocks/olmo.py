# Source: allenai/OLMo, olmo/model.py
#   commit 00794908450625854834534ab0332982136736e2: Dropout, LayerNormBase, LayerNorm,
#   Activation / GELU, causal_attention_bias, get_causal_attention_bias, OLMoBlock
#   (_scaled_dot_product_attention, attention) and OLMoSequentialBlock.
# Kept: OLMoSequentialBlock(layer_id, config, cache) with a ModelConfig-like config and a
# BufferCache dict instead of buffers; the non-parametric LayerNorm of OLMo 1
# (layer_norm_with_affine=False: F.layer_norm with weight and bias None, so the norms hold no
# parameters); att_proj fused and split by fused_dims; the additive causal bias (finfo.min above
# the diagonal) cast and sliced in attention(), F.scaled_dot_product_attention given attn_mask
# and is_causal=attention_bias is None; attn_out; the MLP written inline in the block (ff_proj,
# act, ff_out, no MLP module) with its og_x residual; OLMo's Dropout subclass; no biases
# (include_bias=False).
# Reduced: no rotary embedding, flash attention, activation checkpointing, q/k norms or
# clip_qkv; GELU (the config's activation_type "gelu") instead of SwiGLU; the model's causal bias
# fetched by the block.
from __future__ import annotations

import math  # noqa: F401 -- a learner's scale (wrong_scale) calls it
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class ModelConfig:
    d_model: int = 768
    n_heads: int = 12
    n_kv_heads: Optional[int] = None
    mlp_ratio: int = 4
    mlp_hidden_size: Optional[int] = None
    activation_type: str = "gelu"
    include_bias: bool = False
    layer_norm_with_affine: bool = False
    bias_for_layer_norm: Optional[bool] = None
    attention_dropout: float = 0.1
    residual_dropout: float = 0.1
    init_device: Optional[str] = None

    @property
    def effective_n_kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads


class BufferCache(dict):
    """
    Cache for attention biases and other things that would normally be stored as buffers.
    We avoid using buffers because we've run into various issues doing so with FSDP.
    """


class Dropout(nn.Dropout):
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if self.p == 0.0:
            return input
        else:
            return F.dropout(input, self.p, self.training, self.inplace)


class LayerNormBase(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        *,
        size: Optional[int] = None,
        elementwise_affine: Optional[bool] = True,
        eps: float = 1e-05,
    ):
        super().__init__()
        self.config = config
        self.eps = eps
        self.normalized_shape = (size or config.d_model,)
        if elementwise_affine or (elementwise_affine is None and self.config.layer_norm_with_affine):
            self.weight = nn.Parameter(torch.ones(self.normalized_shape, device=config.init_device))
            use_bias = self.config.bias_for_layer_norm
            if use_bias is None:
                use_bias = self.config.include_bias
            if use_bias:
                self.bias = nn.Parameter(torch.zeros(self.normalized_shape, device=config.init_device))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("bias", None)
            self.register_parameter("weight", None)

    @classmethod
    def build(cls, config: ModelConfig, size: Optional[int] = None, **kwargs) -> LayerNormBase:
        return LayerNorm(config, size=size, low_precision=False, **kwargs)


class LayerNorm(LayerNormBase):
    """
    The default :class:`LayerNorm` implementation which can optionally run in low precision.
    """

    def __init__(
        self,
        config: ModelConfig,
        size: Optional[int] = None,
        low_precision: bool = False,
        elementwise_affine: Optional[bool] = None,
        eps: float = 1e-05,
    ):
        super().__init__(config, size=size, elementwise_affine=elementwise_affine, eps=eps)
        self.low_precision = low_precision

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.normalized_shape, weight=self.weight, bias=self.bias, eps=self.eps)


class GELU(nn.GELU):
    @property
    def output_multiplier(self) -> float:
        return 1.0


def causal_attention_bias(seq_len: int, device: torch.device) -> torch.FloatTensor:
    att_bias = torch.triu(torch.ones(seq_len, seq_len, device=device, dtype=torch.float), diagonal=1)
    att_bias.masked_fill_(att_bias == 1, torch.finfo(att_bias.dtype).min)
    return att_bias.view(1, 1, seq_len, seq_len)  # type: ignore


def get_causal_attention_bias(cache: BufferCache, seq_len: int, device: torch.device) -> torch.Tensor:
    if (causal_bias := cache.get("causal_attention_bias")) is not None and causal_bias.shape[-1] >= seq_len:
        if causal_bias.device != device:
            causal_bias = causal_bias.to(device)
            cache["causal_attention_bias"] = causal_bias
        return causal_bias
    causal_bias = causal_attention_bias(seq_len, device)
    cache["causal_attention_bias"] = causal_bias
    return causal_bias


class OLMoSequentialBlock(nn.Module):
    """
    This is a typical transformer block where the output is computed as ``MLP(LN(x + Attention(LN(x))))``
    (plus another skip connection).
    """

    def __init__(self, layer_id: int, config: ModelConfig, cache: BufferCache):
        super().__init__()
        self.layer_id = layer_id
        self.config = config
        self.hidden_size = (
            config.mlp_hidden_size if config.mlp_hidden_size is not None else config.mlp_ratio * config.d_model
        )
        self.__cache = cache
        assert config.d_model % config.n_heads == 0

        # Dropout.
        self.dropout = Dropout(config.residual_dropout)

        # Activation function.
        self.act = GELU(approximate="none")
        assert (self.act.output_multiplier * self.hidden_size) % 1 == 0

        # Attention output projection.
        self.attn_out = nn.Linear(config.d_model, config.d_model, bias=config.include_bias, device=config.init_device)

        # Feed-forward output projection.
        self.ff_out = nn.Linear(
            int(self.act.output_multiplier * self.hidden_size),
            config.d_model,
            bias=config.include_bias,
            device=config.init_device,
        )
        self.ff_out._is_residual = True  # type: ignore

        # Layer norms.
        self.attn_norm = LayerNorm.build(config)
        self.ff_norm = LayerNorm.build(config)

        # Attention input projection. Projects x -> (q, k, v)
        head_dim = config.d_model // config.n_heads
        self.fused_dims = (
            config.d_model,
            config.effective_n_kv_heads * head_dim,
            config.effective_n_kv_heads * head_dim,
        )
        self.att_proj = nn.Linear(
            config.d_model, sum(self.fused_dims), bias=config.include_bias, device=config.init_device
        )

        # Feed-forward input projection.
        self.ff_proj = nn.Linear(config.d_model, self.hidden_size, bias=config.include_bias, device=config.init_device)

    def _scaled_dot_product_attention(
        self, q, k, v, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False
    ) -> torch.Tensor:
        """
        Computes scaled dot product attention on query, key and value tensors, using an optional
        attention mask if passed, and applying dropout if a probability greater than 0.0 is specified.
        """
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal)

    def attention(self, q, k, v, attention_bias: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, None]:
        B, T, C = q.size()  # batch size, sequence length, d_model
        dtype = k.dtype

        # Move head forward to be next to the batch dim.
        # shape: (B, nh, T, hs)
        q = q.view(B, T, self.config.n_heads, C // self.config.n_heads).transpose(1, 2)
        # shape: (B, n_kv_h, T, hs)
        k = k.view(B, T, self.config.effective_n_kv_heads, C // self.config.n_heads).transpose(1, 2)
        # shape: (B, n_kv_h, T, hs)
        v = v.view(B, T, self.config.effective_n_kv_heads, C // self.config.n_heads).transpose(1, 2)

        query_len, key_len = q.shape[-2], k.shape[-2]

        if attention_bias is not None:
            attention_bias = attention_bias[:, :, key_len - query_len : key_len, :key_len].to(dtype)

        # Get the attention scores.
        # shape: (B, nh, T, hs)
        att = self._scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=attention_bias,
            dropout_p=0.0 if not self.training else self.config.attention_dropout,
            is_causal=attention_bias is None,
        )

        # Re-assemble all head outputs side-by-side.
        att = att.transpose(1, 2).contiguous().view(B, T, C)

        # Apply output projection.
        return self.attn_out(att), None

    def forward(self, x: torch.Tensor, attention_bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        if attention_bias is None:  # as OLMo.forward fetches it
            attention_bias = get_causal_attention_bias(self.__cache, x.shape[1], x.device)

        # Get query, key, value projections.
        qkv = self.att_proj(self.attn_norm(x))

        q, k, v = qkv.split(self.fused_dims, dim=-1)

        # Get attention scores.
        att, cache = self.attention(q, k, v, attention_bias)

        # Add attention scores.
        # shape: (B, T, C)
        x = x + self.dropout(att)

        # Add feed-forward projection.
        # shape: (batch_size, seq_len, d_model)
        og_x = x
        x = self.ff_norm(x)
        x = self.ff_proj(x)
        x = self.act(x)
        x = self.ff_out(x)
        x = self.dropout(x)
        x = og_x + x

        return x


# ----- the zoo's data (the checker never sees it) -----

SOURCE = "allenai/OLMo olmo/model.py @ 00794908450625854834534ab0332982136736e2"
REFERENCE = {"n_head": 4, "activation": "gelu"}
BLOCK = OLMoSequentialBlock
ARGS = {"layer_id": 0, "config": ModelConfig(d_model=32, n_heads=4), "cache": BufferCache()}


def weights(b):
    q, k, v = b.att_proj.weight.split(b.fused_dims)
    return {
        "ln1": (None, None),  # non-parametric LayerNorms
        "q": (q, None),
        "k": (k, None),
        "v": (v, None),
        "proj": (b.attn_out.weight, None),
        "ln2": (None, None),
        "fc1": (b.ff_proj.weight, None),
        "fc2": (b.ff_out.weight, None),
    }


SDPA = "return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal)"
MISTAKES = {
    "no_scaling": [(SDPA, SDPA.replace("is_causal=is_causal)", "is_causal=is_causal, scale=1.0)"))],
    "wrong_scale": [
        (
            SDPA,
            SDPA.replace("is_causal=is_causal)", "is_causal=is_causal, scale=1 / math.sqrt(q.size(1) * q.size(-1)))"),
        )
    ],
    "future_leak": [
        (
            "torch.ones(seq_len, seq_len, device=device, dtype=torch.float), diagonal=1)",
            "torch.ones(seq_len, seq_len, device=device, dtype=torch.float), diagonal=seq_len)",
        )
    ],
    "mask_reversed": [
        (
            "torch.triu(torch.ones(seq_len, seq_len, device=device, dtype=torch.float), diagonal=1)",
            "torch.tril(torch.ones(seq_len, seq_len, device=device, dtype=torch.float), diagonal=0)",
        )
    ],
    "heads_mixed:merge": [
        ("att = att.transpose(1, 2).contiguous().view(B, T, C)", "att = att.contiguous().view(B, T, C)")
    ],
    "post_norm": [
        ("qkv = self.att_proj(self.attn_norm(x))", "qkv = self.att_proj(x)"),
        ("x = x + self.dropout(att)", "x = self.attn_norm(x + self.dropout(att))"),
        ("        x = self.ff_norm(x)\n", ""),
        ("x = og_x + x", "x = self.ff_norm(og_x + x)"),
    ],
    "no_residual:attn": [("x = x + self.dropout(att)", "x = self.dropout(att)")],
    "no_residual:mlp": [("x = og_x + x", "x = x")],
    "dropout_in_eval": [
        (
            "return F.dropout(input, self.p, self.training, self.inplace)",
            "return F.dropout(input, self.p, True, self.inplace)",
        )
    ],
}
PAIRS = [("no_scaling", "post_norm"), ("future_leak", "no_residual:mlp")]
