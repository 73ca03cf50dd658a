"""How the block is called (what its ``forward`` needs besides the input), alike in the builder
and the runner, and where what it raised comes from: an error not of sizes (a typo) is said at
the learner's line; a size error is the shape probe's.
"""

from __future__ import annotations

import functools
import inspect
import os
import traceback
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from .loop import UserValueError

__all__ = ["forward_arguments", "learner_line", "size_error", "source"]

_FILLS = {  # what a required parameter of these names is given
    "input": ("key", "value", "keys", "values", "k", "v", "kv"),  # not memory: cross-attention
    "positions": ("position_ids", "positions", "pos", "input_pos", "pos_ids"),
    "causal": ("is_causal", "causal"),
}
_SAID = {"input": "the input", "positions": "torch.arange(T) as (1, T)", "none": "None",
         "causal": "True"}  # fmt: skip
_SIZE_WORDS = ("size", "shape", "dimension", "mat1", "must match", "broadcast", "divisible",
               "out of range", "unpack", "normalized_shape", "expected input")  # fmt: skip


def _optional(annotation: object) -> bool:  # Optional[Tensor], Tensor | None, as text too
    if isinstance(annotation, str):
        words = annotation.strip("'\"").split("|")  # quoted under `from __future__ import ...`
        return "Optional[" in annotation or "None" in (w.strip() for w in words)
    return type(None) in typing.get_args(annotation)


def forward_arguments(module: nn.Module) -> list[str]:
    """Fill what the block's ``forward`` requires besides its input, where the parameter's name
    or annotation says what it holds (``_FILLS``, None where it admits None); the note saying
    so. A mask is never made: a guess could turn a reversed mask into a passing one.

    Raises:
        UserValueError: a required parameter the checker cannot fill (a mask).

    Example:
        >>> class Layer(nn.Module):
        ...     def forward(self, query, key, value, cache: "dict | None"):
        ...         return query + key + value
        >>> layer = Layer()
        >>> forward_arguments(layer)
        ['forward(query, key, value, cache) called with key = value = the input, cache=None']
        >>> layer(torch.ones(1, 2, 3)).sum().item()
        18.0
    """
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    if not params or params[0].kind not in (*kinds, inspect.Parameter.POSITIONAL_ONLY):
        return []
    fill: dict[str, str] = {}
    for p in params[1:]:
        if p.default is not inspect.Parameter.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        how = next((how for how, names in _FILLS.items() if p.name.lower() in names), None)
        how = how or ("none" if _optional(p.annotation) else None)
        if how is None or p.kind not in kinds:
            what = "a mask's convention (kept or hidden, bool or added) is the block's own" if (
                "mask" in p.name.lower()) else "the checker cannot tell what it holds"  # fmt: skip
            raise UserValueError(
                f"cannot check {type(module).__name__}: its forward needs {p.name} besides the "
                f"input and {what}; check a module whose forward(x) calls it with the {p.name} "
                "your model passes"
            )
        fill[p.name] = how
    if not fill:
        return []
    module.register_forward_pre_hook(functools.partial(_filled, fill), with_kwargs=True)
    same = [n for n, how in fill.items() if how == "input"]
    parts = [f"{' = '.join(same)} = the input"] if same else []
    parts += [f"{n}={_SAID[how]}" for n, how in fill.items() if how != "input"]
    return [f"forward({', '.join(p.name for p in params)}) called with {', '.join(parts)}"]


def _filled(
    fill: Mapping[str, str], module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    x = args[0] if args else next(iter(kwargs.values()))
    for n, how in list(fill.items())[max(len(args) - 1, 0) :]:
        if n not in kwargs and how == "positions":
            kwargs[n] = torch.arange(x.shape[-2], device=x.device).unsqueeze(0)  # (1, T)
        elif n not in kwargs:
            kwargs[n] = x if how == "input" else (how == "causal" or None)
    return args, kwargs


def size_error(e: BaseException) -> bool:
    said = str(e).lower()
    return isinstance(e, AssertionError) or (
        isinstance(e, (RuntimeError, ValueError, IndexError))
        and any(w in said for w in _SIZE_WORDS)
    )


def learner_line(e: BaseException, file: str) -> str:
    """`` (at gpt.py:31: k = self.kee(x))``: the last frame of ``e``'s traceback in ``file``,
    else the last outside torch, gptblock and the standard library."""
    frames = traceback.extract_tb(e.__traceback__)
    ours = [f for f in frames if file and os.path.abspath(f.filename) == os.path.abspath(file)]
    if not ours:
        # gptblock's folder (check/serve/ is two below it), or the folder of the runner's copy
        up = 2 if (__package__ or "").startswith("gptblock.") else 1
        mine = str(Path(os.path.abspath(__file__)).parents[up])
        skip = (os.path.dirname(torch.__file__), mine, os.path.dirname(os.__file__))
        ours = [f for f in frames if not f.filename.startswith(skip) and "<" not in f.filename]
    if not ours:
        return ""
    f, near = ours[-1], os.path.relpath(ours[-1].filename)
    where = f.filename if near.startswith("..") else near
    return f" (at {where}:{f.lineno}: {(f.line or '').strip()})"


def source(target: object) -> str:
    """The file ``target`` (a class or function) is written in, else ``""``."""
    try:
        return inspect.getsourcefile(target) or ""  # type: ignore[arg-type]
    except (TypeError, OSError):
        return ""
