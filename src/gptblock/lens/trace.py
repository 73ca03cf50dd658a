"""A GPT's activations by name, and hooks that change them: one instrumented forward pass.

The names (TransformerLens's) and their shapes are listed in docs/look-inside.md. They come
from the GPT's own forward pass with a probe every point goes through (``gptblock.blocks.probe``),
not module hooks, which fused paths skip; so every name exists for every block form and no hook
is bypassed. The eval-mode function is traced (no dropout); nothing is registered on the model.

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
    """``CachedRun(logits, cache)``: ``model(idx).logits`` (B, T, V) and the activations called
    ``names`` (None: all), after ``hooks`` as in ``run_with_hooks``.

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

    A hook returns the activation to continue with, of the same shape, dtype and device (e.g.
    ``lambda x: x * 0`` to ablate, or another prompt's cached activation to patch).

    Example:
        >>> from gptblock import GPT, GPTConfig
        >>> model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16))
        >>> idx = torch.tensor([[1, 2, 3]])
        >>> same = run_with_hooks(model, idx, {"blocks.0.resid_mid": lambda x: x})
        >>> torch.allclose(same, model(idx).logits, atol=1e-6)
        True
    """
    return model.run_with_hooks(idx, hooks)
