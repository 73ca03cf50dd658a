"""A modern block's KV cache, where its ``forward`` has one the checker knows: driven and compared.

The checker calls ``forward(x)`` on whole sequences, where the positions are 0 ... T-1, so a
block whose *cached* decoding step is rotated as position 0 (the catalogue's
``rope_cache_offset``: ``freqs_cis[:seqlen]`` where ``freqs_cis[start_pos : start_pos +
seqlen]`` was meant) passes that comparison. When the block's ``forward`` takes a cache API
recognised by its signature (``CACHE_APIS``), ``probe_cache`` runs the prefix ``x[:, :T-1]``
and then the last token at its offset through the cache, on a copy of the block, and compares
the step's output with the whole sequence's last position:

* ``start_pos`` (Meta's Llama: ``forward(x, start_pos, ...)``, the cache held by the block);
* ``input_pos`` (gpt-fast: a tensor of the positions the tokens go to);
* ``past_key_value(s)`` / ``layer_past`` / ``kv_cache`` (Hugging Face's older layers, nanoGPT
  forks): the prefix's call (with ``use_cache=True`` where it is an argument) returns
  ``(y, cache)``, and the cache is passed back with the step (``position_ids`` set to the
  offset where it is an argument).

A step that differs from the whole sequence is named ``rope_cache_offset`` when it is the
modern block's output with the step's q and k rotated as position 0 (computed by the caller's
``shifted``, the block rebuilt from the parts read); otherwise the report says so in a note.
A block with none of these arguments is "not probed: no cache API recognised".

Shapes: B batch, T time, C channels.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn

from .report import CAUGHT, one_line

__all__ = ["CACHE_APIS", "CacheProbe", "cache_api", "cached_last", "probe_cache"]

Tensor = torch.Tensor
PAST = ("past_key_value", "past_key_values", "layer_past", "kv_cache")
CACHE_APIS = ("start_pos", "input_pos", *PAST)
"""The cache arguments recognised in a block's ``forward``, in the order they are looked for."""


class NotCached(ValueError):
    """The block's cache API did not answer as the recognised one does."""


def cache_api(module: nn.Module) -> str | None:
    """The cache argument of ``module.forward`` the checker knows how to drive, or None.

    Example:
        >>> class Meta(nn.Module):
        ...     def forward(self, x, start_pos=None): ...
        >>> cache_api(Meta()), cache_api(nn.Identity())
        ('start_pos', None)
    """
    try:
        params = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return None
    return next((name for name in CACHE_APIS if name in params), None)


def cached_last(module: nn.Module, x: Tensor, api: str) -> Tensor:
    """The output at the last position of ``x`` (B, T, C), computed as one decoding step at
    position T-1 through the cache ``api`` after the prefix ``x[:, :T-1]``: (B, 1, C).

    Raises:
        NotCached: the prefix's call does not return a cache to pass back.
    """
    B, T, _ = x.shape
    P = T - 1
    params = inspect.signature(module.forward).parameters
    if api == "start_pos":
        module(x[:, :P], start_pos=0)
        y = module(x[:, P:], start_pos=P)
    elif api == "input_pos":
        module(x[:, :P], input_pos=torch.arange(P, device=x.device))
        y = module(x[:, P:], input_pos=torch.tensor([P], device=x.device))
    else:
        extra: dict[str, object] = {"use_cache": True} if "use_cache" in params else {}
        out = module(x[:, :P], **extra)
        if not isinstance(out, tuple) or len(out) < 2 or out[1] is None:
            raise NotCached(f"forward(x, {', '.join(extra)}) returned no (y, cache) pair")
        if "position_ids" in params:
            extra["position_ids"] = torch.full((B, 1), P, device=x.device)
        y = module(x[:, P:], **{api: out[1]}, **extra)
    y = y[0] if isinstance(y, tuple) else y
    if not isinstance(y, Tensor) or y.shape != (B, 1, x.shape[-1]):
        raise NotCached("the cached step does not return the step's (B, 1, C) output")
    return y


@dataclass(frozen=True)
class CacheProbe:
    """What ``probe_cache`` found: a note for the report, and the label of
    ``rope_cache_offset`` when the cached step is rotated as position 0 (else ``""``)."""

    note: str
    offset: str = ""


def probe_cache(
    module: nn.Module,
    x: Tensor,
    error: Callable[[Tensor, Tensor], float],
    tolerance: float,
    shifted: Callable[[Tensor], Tensor] | None,
) -> CacheProbe:
    """Drive ``module``'s cache (on a copy) on ``x`` (B, T, C) and compare the last step.

    Args:
        module: the block, whose whole-sequence ``forward(x)`` the comparison found right.
        x: the traced input.
        error: how far a block's output is from a reference's, relative to the reference.
        tolerance: the largest ``error`` that is a match.
        shifted: the rebuilt block on ``x`` with its tokens rotated at the given positions
            (T,) (None when nothing is rotated).
    """
    api = cache_api(module)
    if api is None:
        return CacheProbe("cache: not probed: no cache API recognised (" + ", ".join(CACHE_APIS) + ")")  # fmt: skip
    T = x.shape[1]
    how = {"start_pos": f"start_pos={T - 1}", "input_pos": f"input_pos=[{T - 1}]"}.get(
        api, f"{api} from the prefix's call"
    )
    said = f"cache ({api}): one step at position {T - 1} ({how}) after the prefix"
    try:
        with torch.no_grad():
            whole = module(x)[:, -1:]  # (B, 1, C)
            step = cached_last(copy.deepcopy(module), x, api)
    except CAUGHT as e:
        return CacheProbe(f"cache: not probed: driving {api} raised {one_line(e)}")
    far = error(step, whole)
    if far <= tolerance:
        return CacheProbe(f"{said} equals the whole sequence's last position")
    if shifted is not None:
        at = torch.cat((torch.arange(T - 1), torch.zeros(1, dtype=torch.long)))  # step at 0
        if error(step, shifted(at.to(x.device))[:, -1:]) <= tolerance:
            label = (
                f"a cached decoding step at position {T - 1} ({how}) is rotated as position 0: "
                "its q and k are turned by the angles of the first position, not by those of "
                "its offset in the sequence (whole sequences, at positions 0 ... T-1, are right)"
            )
            return CacheProbe(f"{said} is rotated as position 0", label)
    return CacheProbe(
        f"{said} differs from the whole sequence's last position (by {far:.2g} of its scale) "
        "in a way not identified (not counted in the verdict)"
    )
