"""A GPT's activations by name, and hooks that change them: one instrumented forward pass.

The names are the ones interpretability work already uses (TransformerLens's), in the order the
forward pass reaches them:

* ``embed`` (B, T, C): token plus position embedding, the stream before the first block.
* per block ``i``, ``blocks.{i}.NAME``:
  ``resid_pre`` (B, T, C), the stream entering the block;
  ``pattern`` (B, nh, T, T), the post-softmax attention weights (row t: what position t reads);
  ``head_out`` (B, T, nh, C), each head's write into the stream: its weighted values through its
  own ``hs`` columns of the output projection (they sum, with the output bias, to ``attn_out``);
  ``attn_out`` (B, T, C); ``resid_mid`` = resid_pre + attn_out; ``mlp_out`` (B, T, C);
  ``resid_post`` = resid_mid + mlp_out, which is the next block's ``resid_pre``.
* ``ln_final`` (B, T, C): the final LayerNorm's output, which the unembedding reads.

Why a forward pass of its own rather than PyTorch forward hooks on the blocks: the blocks' fast
paths compute some of these points nowhere (SDPA never forms the pattern, no form forms
``head_out``), and a module hook on a block whose forward takes a fused path is exactly the
``nn.TransformerEncoderLayer`` pitfall where hooks are silently skipped. Here every block, of
whatever form, is read through ``convert.describe`` (one canonical layout of its weights) and
computed by the one function below, so every name exists for every form, and a hook can never
be bypassed. The block files stay as they are; tests hold this pass's logits to ``GPT.forward``'s
for every form (float64, 1e-10).

The (T, T) pattern and the per-head outputs are computed in a block only when that block's
``pattern`` or ``head_out`` is cached or hooked; otherwise attention runs through
``F.scaled_dot_product_attention``, as ``FusedBlock`` does.

The function traced is the eval-mode one: no dropout is applied, whatever ``model.training``
says (the model is not changed). Nothing is registered on the model, so nothing can be left
behind on it, even when a hook raises. Gradients flow as in ``forward`` (wrap the call in
``torch.no_grad()`` when none are needed; the cached tensors otherwise keep the graph alive).

Shapes: B batch, T time, C = n_embd, V = vocab_size, nh heads, hs = C // nh.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, NamedTuple, cast

import torch
import torch.nn as nn
from torch.nn import functional as F

from ..blocks.config import GPTConfig, activation_function
from ..blocks.convert import describe
from ..blocks.masks import blocked_positions, masked_softmax
from ..errors import UserTypeError, UserValueError

if TYPE_CHECKING:
    from ..model.gpt import GPT

__all__ = [
    "BLOCK_POINTS",
    "ActivationCache",
    "CachedRun",
    "Hook",
    "activation_names",
    "run_with_cache",
    "run_with_hooks",
]

# The points inside each block, in the order the forward pass reaches them.
BLOCK_POINTS = (
    "resid_pre",
    "pattern",
    "head_out",
    "attn_out",
    "resid_mid",
    "mlp_out",
    "resid_post",
)

Hook = Callable[[torch.Tensor], torch.Tensor]


def activation_names(n_layer: int) -> list[str]:
    """Every activation name of a GPT with ``n_layer`` blocks, in forward order.

    Example:
        >>> activation_names(1)
        ['embed', 'blocks.0.resid_pre', 'blocks.0.pattern', 'blocks.0.head_out',
         'blocks.0.attn_out', 'blocks.0.resid_mid', 'blocks.0.mlp_out', 'blocks.0.resid_post',
         'ln_final']
    """
    inner = [f"blocks.{i}.{point}" for i in range(n_layer) for point in BLOCK_POINTS]
    return ["embed", *inner, "ln_final"]


class ActivationCache(Mapping[str, torch.Tensor]):
    """The activations one ``run_with_cache`` call kept, by name, in forward order.

    A read-only mapping; a name that exists but was not asked for says how to ask for it.

    Shape:
        See the module docstring: (B, T, C) for the stream, (B, nh, T, T) for ``pattern``,
        (B, T, nh, C) for ``head_out``.
    """

    def __init__(self, tensors: dict[str, torch.Tensor], n_layer: int) -> None:
        self._tensors = tensors
        self.n_layer = n_layer

    def __getitem__(self, name: str) -> torch.Tensor:
        try:
            return self._tensors[name]
        except KeyError:
            if name in activation_names(self.n_layer):
                raise KeyError(
                    f"{name!r} was not cached: pass it in names=[...] (or names=None for all)"
                ) from None
            raise KeyError(_unknown(name, self.n_layer)) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}: {tuple(v.shape)}" for k, v in self._tensors.items())
        return f"ActivationCache({shapes})"


class CachedRun(NamedTuple):
    """What ``run_with_cache`` returns; unpacks as ``logits, cache = ...``."""

    logits: torch.Tensor  # (B, T, V), as GPT.forward's
    cache: ActivationCache  # the activations asked for


def run_with_cache(
    model: GPT,
    idx: torch.Tensor,
    names: Iterable[str] | None = None,
    *,
    hooks: Mapping[str, Hook] | None = None,
) -> CachedRun:
    """The logits of ``model`` on ``idx`` and the activations called ``names``.

    Args:
        model: a ``GPT`` of any block form, in either mode (the eval-mode function is traced).
        idx: (B, T) token ids, T <= block_size, on the model's device.
        names: the activations to keep (``activation_names`` lists them); None keeps all.
        hooks: ``{name: fn}``, applied as in ``run_with_hooks``; the cache holds what the hooks
            returned.

    Returns:
        ``CachedRun(logits, cache)``; logits (B, T, V) equal ``model(idx).logits``.

    Raises:
        UserValueError: an unknown name (the valid ones are listed), bad ids, a hook's result
            of the wrong shape.

    Example:
        >>> from gptblock import GPT, GPTConfig
        >>> model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16))
        >>> logits, cache = run_with_cache(model, torch.tensor([[1, 2, 3]]), ["blocks.1.pattern"])
        >>> tuple(cache["blocks.1.pattern"].shape)  # (B, nh, T, T)
        (1, 2, 3, 3)
        >>> torch.allclose(logits, model(torch.tensor([[1, 2, 3]])).logits, atol=1e-6)
        True
    """
    n_layer = _check_model(model)
    valid = activation_names(n_layer)
    keep = set(valid) if names is None else _check_names(names, n_layer)
    tracer = _Tracer(keep, _check_hooks(hooks or {}, n_layer))
    logits = _forward(model, idx, tracer)
    cached = {name: tracer.cache[name] for name in valid if name in tracer.cache}
    return CachedRun(logits, ActivationCache(cached, n_layer))


def run_with_hooks(model: GPT, idx: torch.Tensor, hooks: Mapping[str, Hook]) -> torch.Tensor:
    """The logits of ``model`` on ``idx`` with ``fn(activation) -> activation`` at named points.

    Each hook gets the activation computed there and returns the one to continue with, of the
    same shape, dtype and device (e.g. ``lambda x: x * 0`` to ablate, or another prompt's cached
    activation to patch). It sees the activation after any earlier point's hook took effect.

    Args:
        model: a ``GPT`` of any block form; it is not changed.
        idx: (B, T) token ids.
        hooks: ``{name: fn}`` with names from ``activation_names``.

    Returns:
        logits (B, T, V).

    Example:
        >>> from gptblock import GPT, GPTConfig
        >>> model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16))
        >>> idx = torch.tensor([[1, 2, 3]])
        >>> same = run_with_hooks(model, idx, {"blocks.0.resid_mid": lambda x: x})
        >>> torch.allclose(same, model(idx).logits, atol=1e-6)
        True
    """
    n_layer = _check_model(model)
    return _forward(model, idx, _Tracer(set(), _check_hooks(hooks, n_layer)))


class _Tracer:
    """Applies the hooks and keeps the asked-for activations, point by point."""

    def __init__(self, keep: set[str], hooks: dict[str, Hook]) -> None:
        self.keep, self.hooks = keep, hooks
        self.cache: dict[str, torch.Tensor] = {}

    def wants(self, name: str) -> bool:
        """Whether the point ``name`` must exist (it is cached or hooked)."""
        return name in self.keep or name in self.hooks

    def point(self, name: str, x: torch.Tensor) -> torch.Tensor:
        hook = self.hooks.get(name)
        if hook is not None:
            y = hook(x)
            if not isinstance(y, torch.Tensor):
                raise UserTypeError(
                    f"the hook at {name!r} returned {type(y).__name__}; a hook returns the "
                    f"activation to continue with, a tensor of shape {tuple(x.shape)}"
                )
            if y.shape != x.shape or y.dtype != x.dtype or y.device != x.device:
                raise UserValueError(
                    f"the hook at {name!r} returned a {y.dtype} tensor of shape "
                    f"{tuple(y.shape)} on {y.device}; expected {x.dtype}, {tuple(x.shape)} on "
                    f"{x.device}, like its input"
                )
            x = y
        if name in self.keep:
            self.cache[name] = x
        return x


def _forward(model: GPT, idx: torch.Tensor, tracer: _Tracer) -> torch.Tensor:
    T = _check_idx(model, idx)
    pos = torch.arange(T, device=idx.device)  # (T,)
    x = tracer.point("embed", model.wte(idx) + model.wpe(pos))  # (B, T, C)
    for i, block in enumerate(model.blocks):
        x = _block(block, x, tracer, f"blocks.{i}.")  # (B, T, C)
    ln_f = cast(nn.LayerNorm, model.transformer["ln_f"])
    x = tracer.point("ln_final", ln_f(x))  # (B, T, C)
    return model.lm_head(x)  # (B, T, C) @ (C, V) -> (B, T, V)


def _block(block: nn.Module, x: torch.Tensor, tracer: _Tracer, at: str) -> torch.Tensor:
    """One pre-norm block, from its canonical weights, with every named point on the way."""
    config, w = describe(block)  # TransformerBlock's layout, whatever the form
    C, eps = config.d_model, config.norm_eps
    x = tracer.point(at + "resid_pre", x)  # (B, T, C)
    h = F.layer_norm(x, (C,), w["norm1.weight"], w.get("norm1.bias"), eps)
    a = tracer.point(at + "attn_out", _attention(h, w, config.n_heads, tracer, at))  # (B, T, C)
    x = tracer.point(at + "resid_mid", x + a)
    h = F.layer_norm(x, (C,), w["norm2.weight"], w.get("norm2.bias"), eps)
    act = activation_function(config.activation)
    u = act(F.linear(h, w["linear1.weight"], w.get("linear1.bias")))  # (B, T, 4C)
    m = tracer.point(at + "mlp_out", F.linear(u, w["linear2.weight"], w.get("linear2.bias")))
    return tracer.point(at + "resid_post", x + m)  # (B, T, C)


def _attention(
    h: torch.Tensor, w: Mapping[str, torch.Tensor], nh: int, tracer: _Tracer, at: str
) -> torch.Tensor:
    """Causal self-attention of the normalised stream ``h``: (B, T, C) -> (B, T, C)."""
    B, T, C = h.shape
    hs = C // nh
    qkv = F.linear(h, w["self_attn.in_proj_weight"], w.get("self_attn.in_proj_bias"))  # (B, T, 3C)
    q, k, v = qkv.view(B, T, 3, nh, hs).transpose(1, 3).unbind(2)  # 3 x (B, nh, T, hs)
    w_o, b_o = w["self_attn.out_proj.weight"], w.get("self_attn.out_proj.bias")  # (C, C), (C,)
    if not (tracer.wants(at + "pattern") or tracer.wants(at + "head_out")):
        # The fast path, as FusedBlock's: no (T, T) matrix is formed.
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
        return F.linear(y.transpose(1, 2).reshape(B, T, C), w_o, b_o)  # (B, T, C)
    scores = q @ k.transpose(-2, -1) * hs**-0.5  # (B, nh, T, hs) @ (B, nh, hs, T) -> (B, nh, T, T)
    blocked = blocked_positions(B, T, None, None, h.device)  # (B, T, T): the causal mask
    pattern = tracer.point(at + "pattern", masked_softmax(scores, blocked))  # (B, nh, T, T)
    y = pattern @ v  # (B, nh, T, T) @ (B, nh, T, hs) -> (B, nh, T, hs)
    if not tracer.wants(at + "head_out"):
        return F.linear(y.transpose(1, 2).reshape(B, T, C), w_o, b_o)  # (B, T, C)
    # Column block n of the output projection reads head n: W_O (C, C) -> (C, nh, hs).
    per_head = torch.einsum("bnti,cni->btnc", y, w_o.view(C, nh, hs))  # (B, T, nh, C)
    per_head = tracer.point(at + "head_out", per_head)
    out = per_head.sum(dim=2)  # (B, T, C)
    return out if b_o is None else out + b_o


def _check_model(model: object) -> int:
    """The model's number of blocks; a clear error for anything but a GPT."""
    if not isinstance(model, nn.Module) or not isinstance(
        getattr(model, "config", None), GPTConfig
    ):
        raise UserTypeError(f"expected a gptblock GPT, got {type(model).__name__}")
    return cast(GPTConfig, model.config).n_layer


def _check_idx(model: GPT, idx: torch.Tensor) -> int:
    """T of ids the model can read: GPT.forward's checks, and the model's device."""
    B, T = model._check_ids(idx, "idx")
    model._check_range(idx, "idx")
    block_size = model.config.block_size
    if T > block_size:
        raise UserValueError(
            f"sequence length T={T} exceeds block_size={block_size}; "
            f"crop the context to the last {block_size} tokens"
        )
    device = model.wte.weight.device
    if idx.device != device:
        raise UserValueError(f"idx is on {idx.device} and the model on {device}: move one")
    return T


def _check_names(names: Iterable[str], n_layer: int) -> set[str]:
    if isinstance(names, str):  # a lone name would iterate as its characters
        raise UserTypeError(f"names must be a list of names, got the string {names!r}")
    wanted = list(names)
    for name in wanted:
        if not isinstance(name, str):
            raise UserTypeError(f"names must be strings, got {name!r} ({type(name).__name__})")
    valid = set(activation_names(n_layer))
    unknown = [name for name in wanted if name not in valid]
    if unknown:
        raise UserValueError(_unknown(unknown[0], n_layer))
    return set(wanted)


def _check_hooks(hooks: Mapping[str, Hook], n_layer: int) -> dict[str, Hook]:
    if not isinstance(hooks, Mapping):
        raise UserTypeError(f"hooks must be a dict {{name: fn}}, got {type(hooks).__name__}")
    valid = set(activation_names(n_layer))
    for name, fn in hooks.items():
        if name not in valid:
            raise UserValueError(_unknown(name, n_layer))
        if not callable(fn):
            raise UserTypeError(f"the hook at {name!r} is a {type(fn).__name__}, not a function")
    return dict(hooks)


def _unknown(name: object, n_layer: int) -> str:
    return (
        f"unknown activation name {name!r}; the names are 'embed', 'ln_final' and "
        f"'blocks.{{i}}.NAME' for i in 0..{n_layer - 1} and NAME one of {', '.join(BLOCK_POINTS)}"
    )
