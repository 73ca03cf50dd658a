"""The fast block, and the one definition of the pre-norm block's forward: ``block_forward``.

``FusedBlock`` computes ``TransformerBlock``'s function under its parameter names and layouts,
faster: q, k and v from one (C, 3C) matmul, and SDPA never stores the (T, T) weights.
``block_forward`` runs on the block's parts (``BlockParts``): a ``FusedBlock``'s own modules,
generation's cache and weights, the lens's probe, or another form's weights
(``convert.parts_of``). Each variant is a part chosen when the block is built, so no forward
checks an option. ``llama.py`` names this block as Llama's.

Shapes: B batch, T time, C = d_model channels, nh = n_heads heads, hs = C // nh.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn as nn

from ..errors import UserTypeError, UserValueError
from .attention import PACKED, KVStore, SelfAttention
from .checks import check_positions
from .config import ACTIVATION_FUNCTIONS, BlockConfig, check_input
from .mha import BlockForm
from .norms import RMSNorm
from .parts import MLP, Dense, DenseMLP, GatedMLP, LayerNormFn, Norm, dropped
from .probe import Probe
from .qk_heads import ModernHeads
from .rotary import Rotary

__all__ = ["BlockParts", "FusedBlock", "FusedSelfAttention", "block_forward", "stream_norm"]


class BlockParts(NamedTuple):
    """The parts of one pre-norm block, as callables (``gptblock.blocks.parts``)."""

    norm1: Norm  # before attention
    attn: SelfAttention | FusedSelfAttention  # C -> C, with a KV cache and the lens's points
    norm2: Norm | None  # before the MLP; None: parallel residual (the MLP reads norm1's output)
    mlp: MLP  # C -> C, dropout on its hidden layer

    @classmethod
    def of_state(cls, config: BlockConfig, w: dict[str, torch.Tensor]) -> BlockParts:
        """GPT-2's parts on the tensors (not copied) of ``convert.describe``'s layout."""

        def dense(name: str, sep: str = ".") -> Dense:
            return Dense(w[f"{name}{sep}weight"], w.get(f"{name}{sep}bias"))

        def norm(name: str) -> LayerNormFn:
            return LayerNormFn(w[name + ".weight"], w.get(name + ".bias"), config.norm_eps)

        act = ACTIVATION_FUNCTIONS[config.activation]  # a name BlockConfig checked
        return cls(
            norm("norm1"),
            SelfAttention(
                dense("self_attn.in_proj", "_"), dense("self_attn.out_proj"), config.n_head
            ),
            norm("norm2"),
            DenseMLP(dense("linear1"), dense("linear2"), act),
        )


def block_forward(
    parts: BlockParts,
    x: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
    *,
    kv_cache: KVStore | None = None,
    dropout: float = 0.0,
    probe: Probe | None = None,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """The pre-norm block: ``x + attn(norm1(x))``, then ``+ mlp(norm2(x))``, on ``parts``;
    without ``norm2`` (parallel residual), ``x + attn(norm1(x)) + mlp(norm1(x))``.

    No input checks (``FusedBlock.forward`` makes them): this is also generation's inner loop.
    The arguments are ``FusedBlock.forward``'s; ``dropout`` is every dropout's probability.
    """
    # Each point is inlined rather than a function call: generation runs this per token and
    # block, and five calls that do nothing were 2% of a token.
    x = x if probe is None else probe.point("resid_pre", x)  # (B, T, C)
    h = parts.norm1(x)  # (B, T, C)
    a = parts.attn(
        h, attn_mask, key_padding_mask, kv_cache, dropout=dropout, probe=probe, positions=positions
    )
    a = a if probe is None else probe.point("attn_out", a)  # (B, T, C)
    x = x + dropped(a, dropout)
    x = x if probe is None else probe.point("resid_mid", x)
    m = parts.mlp(h if parts.norm2 is None else parts.norm2(x), dropout)  # (B, T, C)
    m = m if probe is None else probe.point("mlp_out", m)
    x = x + dropped(m, dropout)  # (B, T, C)
    return x if probe is None else probe.point("resid_post", x)


class FusedSelfAttention(nn.Module):
    """Causal self-attention of a ``BlockConfig`` with ``nn.MultiheadAttention``'s parameters
    (and the modern heads' parts), computed by ``SelfAttention``: (B, T, C) -> (B, T, C)."""

    def __init__(self, config: BlockConfig) -> None:
        super().__init__()
        C, hs, nkv = config.d_model, config.head_size, config.n_kv_head
        self.n_heads = config.n_head
        self.dropout = config.dropout
        rows = C + 2 * nkv * hs  # 3C, or fewer with grouped key/value heads
        self.in_proj_weight = nn.Parameter(torch.empty(rows, C))  # rows: q; k; v
        self.in_proj_bias = nn.Parameter(torch.zeros(rows)) if config.bias else None
        self.out_proj = nn.Linear(C, C, bias=config.bias)
        # The modern parts: None for GPT-2's attention, whose heads are the packed thirds.
        self.q_norm = RMSNorm(hs, config.norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(hs, config.norm_eps) if config.qk_norm else None
        rope = config.position == "rope"
        self.rotary = (
            Rotary(hs, config.rotary_dim, config.rope_theta, config.rope_pairing) if rope else None
        )
        modern = nkv != config.n_head or config.qk_norm or rope
        self.heads = ModernHeads(nkv, self.rotary, self.q_norm, self.k_norm) if modern else PACKED
        # nn.MultiheadAttention's initialisation, so a fresh FusedBlock starts where a fresh
        # TransformerBlock does.
        nn.init.xavier_uniform_(self.in_proj_weight)
        if self.out_proj.bias is not None:
            nn.init.zeros_(self.out_proj.bias)

    @property
    def in_proj(self) -> Dense:
        """The packed q/k/v projection, C -> 3C."""
        return Dense(self.in_proj_weight, self.in_proj_bias)

    def project(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v of every head at positions 0 .. T-1 (B, nh, T, hs), key/value heads shared."""
        q, k, v = self.heads(self.in_proj(h), self.n_heads, 0, None)
        k, v = self.heads.share(k, v, self.n_heads)
        return q, k, v  # (B, nh, T, hs) each

    def forward(
        self, h: torch.Tensor, *args: Any, dropout: float | None = None, **kw: Any
    ) -> torch.Tensor:
        """``SelfAttention``'s call on this module's parameters and heads."""
        # SDPA applies dropout_p whatever the module's mode: in training only, unless given.
        p = dropout if dropout is not None else self.dropout if self.training else 0.0
        attention = SelfAttention(self.in_proj, self.out_proj, self.n_heads, self.heads)
        return attention(h, *args, dropout=p, **kw)


class FusedBlock(BlockForm):
    """The pre-norm GPT block with packed QKV and ``F.scaled_dot_product_attention``.

    ``TransformerBlock``'s constructor, parameter names, function and masks (bool, ``True`` =
    blocked), and the modern block's options.

    Args:
        d_model, n_heads: C, the width of the residual stream, and nh, its heads (dividing C).
        dropout, activation, bias, norm_eps, **modern: the block's options, as ``BlockConfig``'s
            (``BlockConfig.of`` also takes ``n_kv_heads`` and ``rope=True``). The modern ones
            add ``linear3`` (SwiGLU's up branch; ``linear1`` is its gate) and
            ``self_attn.q_norm`` / ``k_norm``, drop ``norm2`` (``parallel_residual``) and
            make ``self_attn.in_proj_weight`` (C + 2 nkv hs) rows.

    Shape:
        Input (B, T, C); output (B, T, C). Optional ``attn_mask`` bool (T, T) or (B, T, T) and
        ``key_padding_mask`` bool (B, T), not with ``kv_cache`` (a ``gptblock.KVCache``: the
        input is the new positions). With rotary positions, optional ``positions`` (T,) or
        (B, T) ints (default ``kv_cache.length ..``, or ``0 ..``). With ``probe`` (the lens's),
        the activations at its points go through it, and no dropout is applied.

    Example:
        >>> from gptblock import TransformerBlock
        >>> block = FusedBlock(16, 2).eval()
        >>> x = torch.randn(2, 5, 16)
        >>> block(x).shape
        torch.Size([2, 5, 16])
        >>> twin = TransformerBlock(16, 2).eval()
        >>> twin.load_state_dict(block.state_dict())
        <All keys matched successfully>
        >>> torch.allclose(twin(x), block(x), atol=1e-5)
        True
        >>> llama = FusedBlock(16, 4, bias=False, norm="rmsnorm", mlp="swiglu", d_ff=40,
        ...                    n_kv_head=2, position="rope").eval()
        >>> llama(x).shape
        torch.Size([2, 5, 16])
    """

    def build(self, config: BlockConfig) -> None:
        d_model, d_ff, bias = config.d_model, config.d_ff, config.bias
        self.norm1 = stream_norm(config)
        self.self_attn = FusedSelfAttention(config)
        # parallel_residual: both branches read norm1's output; there is no second norm.
        self.norm2 = None if config.parallel_residual else stream_norm(config)
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)
        self.linear3 = nn.Linear(d_model, d_ff, bias=bias) if config.mlp == "swiglu" else None
        # The dropouts are block_forward's functional calls at config.dropout.
        act = ACTIVATION_FUNCTIONS[config.activation]
        self.mlp_part: MLP = DenseMLP(self.linear1, self.linear2, act)
        if self.linear3 is not None:
            self.mlp_part = GatedMLP(self.linear1, self.linear3, self.linear2)

    def parts(self) -> BlockParts:
        """This block's own modules as ``block_forward``'s parts."""
        return BlockParts(self.norm1, self.self_attn, self.norm2, self.mlp_part)

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        *,
        kv_cache: KVStore | None = None,
        probe: Probe | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        B, T, _ = check_input(x, self.config.d_model, like=self.linear1.weight)
        if positions is not None:
            if self.config.position != "rope":
                raise UserValueError(
                    f"positions rotate queries and keys, and this block has no rotary "
                    f"positions (position={self.config.position!r}); leave positions out"
                )
            check_positions(positions, B, T, x.device)
        if kv_cache is not None and (attn_mask is not None or key_padding_mask is not None):
            raise UserValueError("kv_cache cannot be combined with attn_mask or key_padding_mask")
        # A probed pass computes the eval-mode function: what a hook sees and changes is then
        # the model's function, not one random draw of it.
        p = self.config.dropout if self.training and probe is None else 0.0
        try:
            return block_forward(
                self.parts(),
                x,
                attn_mask,
                key_padding_mask,
                kv_cache=kv_cache,
                dropout=p,
                probe=probe,
                positions=positions,
            )
        except RuntimeError as e:
            if "not implemented for" in str(e):
                raise UserTypeError(
                    f"FusedBlock does not support dtype {x.dtype} on device {x.device.type} "
                    f"with torch {torch.__version__} ({e}); use float32 or bfloat16"
                ) from e
            raise

    def decode_step(self, x: torch.Tensor, cache: KVStore) -> torch.Tensor:
        """``forward(x, kv_cache=cache)`` for one new position (B, 1, C), in eval mode."""
        if self.training:
            raise RuntimeError("decode_step is for generation in eval mode; call .eval() first")
        return self(x, kv_cache=cache)

    def qk(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, k, _ = self.self_attn.project(h)
        return q, k


def stream_norm(config: BlockConfig) -> nn.Module:
    """A fresh norm over the stream: GPT-2's LayerNorm or Llama's RMSNorm."""
    if config.norm == "rmsnorm":
        return RMSNorm(config.d_model, config.norm_eps)
    return nn.LayerNorm(config.d_model, eps=config.norm_eps, bias=config.bias)
