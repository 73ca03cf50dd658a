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

Where they come from: the GPT's own forward pass (``GPT._run``), given a probe that every point
goes through (``gptblock.blocks.probe``; without one the points cost nothing). PyTorch's module
hooks could not do it: the blocks' fast paths compute some of these points nowhere (SDPA never
forms the pattern), a module hook sees no point inside a module (``resid_mid``), and a hook on a
block whose forward takes a fused path is the ``nn.TransformerEncoderLayer`` pitfall where hooks
are silently skipped. A ``FusedBlock`` runs its own forward with the probe; a lesson or
``nn.MultiheadAttention`` block, whose forward is the lesson's and has no points, runs the fused
form's forward on its own weights (``convert.parts_of``, not copied), the same function. So every
name exists for every form and a hook can never be bypassed; tests hold these logits to
``GPT.forward``'s for every form (float64, 1e-10).

The (T, T) pattern and the per-head outputs are computed in a block only when that block's
``pattern`` or ``head_out`` is cached or hooked; otherwise attention runs through
``F.scaled_dot_product_attention``, as in training.

The function traced is the eval-mode one: no dropout is applied, whatever ``model.training``
says (the model is not changed). Nothing is registered on the model (the probe is an argument
of the pass), so nothing can be left behind on it, even when a hook raises. Gradients flow as in ``forward`` (wrap the call in
``torch.no_grad()`` when none are needed; the cached tensors otherwise keep the graph alive).

Shapes: B batch, T time, C = n_embd, V = vocab_size, nh heads, hs = C // nh.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from ..blocks.probe import BLOCK_POINTS
from ..model.gpt import GPT
from ..model.trace import ActivationCache, CachedRun, Hook, activation_names

__all__ = [
    "BLOCK_POINTS",
    "ActivationCache",
    "CachedRun",
    "Hook",
    "activation_names",
    "run_with_cache",
    "run_with_hooks",
]


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
    return model.run_with_cache(idx, names, hooks=hooks)  # a GPT: gptblock.lens checks


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
    return model.run_with_hooks(idx, hooks)
