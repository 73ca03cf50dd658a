"""How the block is called: what its ``forward`` requires besides the input, filled where its
name or annotation says what it holds (``forward_arguments``), and what a call that raised says
(``size_error``: sizes that do not fit, the shape probe's to tell; ``learner_line``: the
learner's line). Shared by the builder and the runner."""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any, get_args

import torch
import torch.nn as nn

from .loop import UserValueError, signature
from .script import cell_of, code_of

__all__ = ["forward_arguments", "learner_line", "size_error"]

_FILLS = {  # what a required parameter of these names is given
    "input": ("key", "value", "keys", "values", "k", "v", "kv"),  # not memory: cross-attention
    "positions": ("position_ids", "positions", "pos", "input_pos", "pos_ids"),
    "causal": ("is_causal", "causal"),
    "start": ("start_pos", "start_position"),  # Meta's Llama: a whole sequence starts at 0
}
_SAID = {"input": "the input", "positions": "torch.arange(T) as (1, T)", "none": "None",
         "causal": "True", "start": "0"}  # fmt: skip
_SIZE_WORDS = ("size", "shape", "dimension", "mat1", "must match", "broadcast", "divisible",
               "out of range", "unpack", "normalized_shape", "expected input")  # fmt: skip


def _optional(annotation: object) -> bool:  # Optional[Tensor], Tensor | None, as text too
    if isinstance(annotation, str):
        words = annotation.strip("'\"").split("|")  # quoted under `from __future__ import ...`
        return "Optional[" in annotation or "None" in (w.strip() for w in words)
    return type(None) in get_args(annotation)


def forward_arguments(module: nn.Module) -> list[str]:
    """Fill what ``forward`` requires besides its input where the name or annotation says what
    it holds, and say so. A mask is never made: a guess could turn a reversed mask into a pass."""
    params = list(signature(module.forward).values())
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    if not params or params[0].kind not in (*kinds, inspect.Parameter.POSITIONAL_ONLY):
        return []
    fill: dict[str, str] = {}
    missing: list[str] = []  # each named at once: a learner fixes them in one go
    for p in params[1:]:
        if p.default is not inspect.Parameter.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        how = next((how for how, names in _FILLS.items() if p.name.lower() in names), None)
        how = how or ("none" if _optional(p.annotation) else None)
        if how is None or p.kind not in kinds:
            missing.append(p.name)
        else:
            fill[p.name] = how
    if missing:
        names, one = ", ".join(missing), len(missing) == 1
        why = "a mask keeps or hides positions by the block's own convention, bool or added" if any(
            "mask" in n.lower() for n in missing
        ) else f"it cannot tell what {'it holds' if one else 'they hold'}"  # fmt: skip
        raise UserValueError(
            f"cannot check {type(module).__name__}: its forward needs {names} besides the input, "
            f"which the checker cannot make up ({why}); check a module whose forward(x) calls it "
            f"with the {names} your model passes"
        )
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
            kwargs[n] = x if how == "input" else 0 if how == "start" else (how == "causal" or None)
    return args, kwargs


def size_error(e: BaseException) -> bool:  # (a view of non-contiguous memory is no size's: s101)
    said = str(e).lower()
    sized = isinstance(e, (RuntimeError, ValueError, IndexError)) and "stride" not in said
    return isinstance(e, AssertionError) or (sized and any(w in said for w in _SIZE_WORDS))


def learner_line(e: BaseException, target: object) -> str:
    """`` (at gpt.py:31: k = self.kee(x))``: the last frame in the target's file, else ours."""
    file = ""
    with contextlib.suppress(TypeError, OSError):
        file = inspect.getsourcefile(target) or ""  # type: ignore[arg-type]
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
    if where.endswith(".ipynb") and f.lineno:  # a notebook's line numbers are no one's: its cell
        where += f", cell {cell_of(code_of(Path(f.filename))[1], f.lineno)[0]}"
    else:
        where += f":{f.lineno}"
    return f" (at {where}: {(f.line or '').strip()})"
