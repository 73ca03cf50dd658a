"""A block's KV cache driven as its forward's arguments say (``forward(x, start_pos)``,
``input_pos``, or a ``past_key_value``-style cache passed back): the whole sequence's last
position, one cached step after the prefix, and the same step without it, in the block's
process; ``compare.modern.judge_cache`` judges them. docs/checker.md, "The modern block"."""

from __future__ import annotations

import contextlib
import copy
import inspect

import torch
import torch.nn as nn

from .loop import Message, NoDropout, one_line, signature
from .subject import items_of

__all__ = ["CACHE_APIS", "cache_api", "cached_last", "drive_cache"]

Tensor = torch.Tensor
_PAST = ("past_key_value", "past_key_values", "layer_past", "kv_cache", "past_kv")
CACHE_APIS = (*_PAST, "start_pos", "input_pos")  # in this order: a cache passed back first (s92)


def _output(out: object) -> object:  # of (output, cache, ...), a dict or a dataclass: the output
    return next((v for _, v in items_of(out) if isinstance(v, Tensor)), out)


def _cache(out: object) -> object:
    """The cache in what a prefix's call returned: a tuple's last item that is not None after
    the output (``(y, attention weights, cache)``: s103), a field named for it in a dict or
    dataclass."""
    if isinstance(out, (tuple, list)):
        return next((v for v in reversed(out[1:]) if v is not None), None)
    words = ("past", "present", "cache")
    return next((v for k, v in items_of(out) if any(w in str(k).lower() for w in words)), None)


def cache_api(module: nn.Module) -> str | None:
    return next((name for name in CACHE_APIS if name in signature(module.forward)), None)


def _cache_arguments(params: dict[str, inspect.Parameter], at: int) -> dict[str, object]:
    """A past-key-value forward's flags that make it return its cache (``use_cache``,
    ``return_cache``: True) and the position its tokens start at (``position_offset``: ``at``)."""
    said: dict[str, object] = {}
    for name, p in params.items():
        low = name.lower()
        asks = low.startswith(("use_", "return_")) and "cache" in low  # (never clear_cache)
        if low == "use_cache" or (p.default is False and asks):
            said[name] = True
        elif type(p.default) is int and ("offset" in low or low.startswith(("start", "past_len"))):
            said[name] = at
    return said


def cached_last(module: nn.Module, x: Tensor, api: str, prefix: bool = True) -> Tensor:
    """The last position's output (B, 1, C) as one cached step after the prefix ``x[:, :T-1]``
    (not ``prefix``: the step alone, no prefix run or passed, as a block keeping none gives)."""
    B, P = x.shape[0], x.shape[1] - 1  # the prefix's length
    params = signature(module.forward)
    flags = {k: v for k, v in _cache_arguments(params, 0).items() if v is True}  # use_cache=True
    if api in ("start_pos", "input_pos"):  # (s85: a cache written and read only with use_cache)
        pos = torch.arange(P + 1, device=x.device)
        first, at = (0, P) if api == "start_pos" else (pos[:P], pos[P:])
        if prefix:
            module(x[:, :P], **{api: first}, **flags)
        y = module(x[:, P:], **{api: at}, **flags)
    else:
        extra = _cache_arguments(params, 0)
        held = copy.deepcopy(module) if "start_pos" in params else None
        cache = _cache(module(x[:, :P], **extra))
        if cache is None:
            if held is not None:  # a cache it holds, its argument never used
                return cached_last(held, x, "start_pos", prefix)
            raise ValueError(f"forward(x, {', '.join(extra)}) returned no (y, cache) pair")
        extra = _cache_arguments(params, P) | ({api: cache} if prefix else {})
        if "position_ids" in params:
            extra["position_ids"] = torch.full((B, 1), P, device=x.device)
        y = module(x[:, P:], **extra)
    y = _output(y)
    if not isinstance(y, Tensor) or y.shape != (B, 1, x.shape[-1]):
        raise ValueError("the cached step does not return the step's (B, 1, C) output")
    return y


def drive_cache(module: nn.Module, x: Tensor, *, no_dropout: bool = False) -> Message:
    """The last position's output (``whole``), the cached step's (``step``), and ``alone``."""
    api = cache_api(module)
    if api is None:
        return {"api": None}, {}
    off = NoDropout() if no_dropout else contextlib.nullcontext()
    try:
        with torch.no_grad(), off:
            unused = copy.deepcopy(module)  # (before a whole call fills a cache it holds)
            whole = _output(module(x))
            if not isinstance(whole, Tensor):
                raise TypeError(f"forward(x) returned a {type(whole).__name__}")
            step = cached_last(copy.deepcopy(unused), x, api)
    except Exception as e:
        return {"api": api, "raised": one_line(e)}, {}
    found = {"whole": whole[:, -1:], "step": step}
    with contextlib.suppress(Exception), torch.no_grad(), off:  # (without: not counted)
        found["alone"] = cached_last(unused, x, api, prefix=False)
    given = _cache_arguments(signature(module.forward), x.shape[1] - 1)
    given = given if api in _PAST else {k: v for k, v in given.items() if v is True}
    said = ", ".join(f"{k}={v}" for k, v in given.items())
    return {"api": api, "with": said}, found
