"""A GPT's activations by name, and hooks that change them: the probe ``GPT.run_with_cache`` passes.

The names (``lens.trace`` documents them) are ``embed``, ``blocks.{i}.NAME`` and ``ln_final``.

Shapes: B batch, T time, C = n_embd, nh heads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import NamedTuple

import torch

from ..blocks.probe import BLOCK_POINTS
from ..errors import UserTypeError, UserValueError

__all__ = ["ActivationCache", "CachedRun", "Hook", "Tracer", "activation_names"]

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
    """The activations one ``run_with_cache`` call kept, by name, in forward order (read-only):
    (B, T, C) for the stream, (B, nh, T, T) for ``pattern``, (B, T, nh, C) for ``head_out``."""

    def __init__(self, tensors: dict[str, torch.Tensor], n_layer: int) -> None:
        self._tensors = tensors
        self.n_layer = n_layer

    def __getitem__(self, name: str) -> torch.Tensor:
        if name in self._tensors:
            return self._tensors[name]
        if name in activation_names(self.n_layer):
            why = "pass it in names=[...] (or names=None for all)"
            raise KeyError(f"{name!r} was not cached: {why}")
        raise KeyError(unknown_name(name, self.n_layer))

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


class Tracer:
    """Applies the ``hooks`` (``{name: fn}``) and keeps the activations ``names`` (None: all),
    both checked against the names of a GPT of ``n_layer`` blocks."""

    def __init__(self, names: Iterable[str] | None, hooks: Mapping[str, Hook], n_layer: int):
        self.n_layer = n_layer
        every = set(activation_names(n_layer))
        self.keep = every if names is None else _check_names(names, n_layer)
        self.hooks = _check_hooks(hooks, n_layer)
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

    def block(self, i: int) -> _BlockTracer:
        """The probe for block ``i``: its points are ``blocks.{i}.NAME``."""
        return _BlockTracer(self, f"blocks.{i}.")

    def result(self, logits: torch.Tensor) -> CachedRun:
        """The run's logits and what it kept, in forward order."""
        ordered = {n: self.cache[n] for n in activation_names(self.n_layer) if n in self.cache}
        return CachedRun(logits, ActivationCache(ordered, self.n_layer))


class _BlockTracer:
    """A ``Tracer`` seen from one block, which names its points without the block's prefix."""

    def __init__(self, tracer: Tracer, prefix: str) -> None:
        self.tracer, self.prefix = tracer, prefix

    def wants(self, name: str) -> bool:
        return self.tracer.wants(self.prefix + name)

    def point(self, name: str, x: torch.Tensor) -> torch.Tensor:
        return self.tracer.point(self.prefix + name, x)


def _check_names(names: Iterable[str], n_layer: int) -> set[str]:
    if isinstance(names, str):  # a lone name would iterate as its characters
        raise UserTypeError(f"names must be a list of names, got the string {names!r}")
    wanted = list(names)
    for name in wanted:
        if not isinstance(name, str):
            raise UserTypeError(f"names must be strings, got {name!r} ({type(name).__name__})")
    valid = set(activation_names(n_layer))
    for name in wanted:
        if name not in valid:
            raise UserValueError(unknown_name(name, n_layer))
    return set(wanted)


def _check_hooks(hooks: Mapping[str, Hook], n_layer: int) -> dict[str, Hook]:
    if not isinstance(hooks, Mapping):
        raise UserTypeError(f"hooks must be a dict {{name: fn}}, got {type(hooks).__name__}")
    valid = set(activation_names(n_layer))
    for name, fn in hooks.items():
        if name not in valid:
            raise UserValueError(unknown_name(name, n_layer))
        if not callable(fn):
            raise UserTypeError(f"the hook at {name!r} is a {type(fn).__name__}, not a function")
    return dict(hooks)


def unknown_name(name: object, n_layer: int) -> str:
    """The error message for a name that is not an activation of an ``n_layer`` GPT."""
    return (
        f"unknown activation name {name!r}; the names are 'embed', 'ln_final' and "
        f"'blocks.{{i}}.NAME' for i in 0..{n_layer - 1} and NAME one of {', '.join(BLOCK_POINTS)}"
    )
