"""Loading the block to check (``load_target``): the one place the user's code is imported.
Every failure, ``sys.exit()`` included, is a ``ValueError`` or ``FileNotFoundError``."""

from __future__ import annotations

import ast
import builtins
import contextlib
import difflib
import functools
import importlib.util
import inspect
import linecache
import pickle
import sys
import types
from pathlib import Path
from typing import Any

from ...errors import UserFileNotFoundError, UserValueError
from ..mistakes.report import CAUGHT, one_line
from ..serve.calls import learner_line
from ..serve.runner import load_module
from ..serve.script import line_of

__all__ = ["check_spec", "load_target", "main_source", "parse_argument", "parse_role"]


def parse_argument(text: str) -> tuple[str, object]:
    """``NAME=VALUE`` (what followed ``--arg``), VALUE read as a Python literal, else as text.

    Example:
        >>> parse_argument("n_head=4"), parse_argument("activation=relu")
        (('n_head', 4), ('activation', 'relu'))
    """
    name, value = _pair(text, "--arg expects NAME=VALUE with NAME an identifier", "", empty=True)
    try:
        return name, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return name, value  # not a literal: the string itself, e.g. activation=relu


def parse_role(text: str) -> tuple[str, str]:
    """``ROLE=NAME`` (what follows ``--map``, e.g. ``q=heads.*.query``)."""
    return _pair(text, "--map expects ROLE=NAME (e.g. q=attn.wq)", "; put TARGET before --map")


def _pair(text: str, expected: str, more: str, empty: bool = False) -> tuple[str, str]:
    left, sep, right = text.partition("=")
    if not sep or not left.isidentifier() or not (right or empty):
        raise UserValueError(f"{expected}, got {text!r}{more}")
    return left, right


def check_spec(spec: str) -> tuple[str, str, bool]:
    """``(where, name, is_file)`` of a well-formed target spec, without importing anything."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise UserValueError(
            f"TARGET must be FILE.py:NAME, FILE.ipynb:NAME or package.module:NAME, got {spec!r}"
        )
    is_file = where.endswith((".py", ".ipynb")) or "/" in where or "\\" in where
    if is_file and not Path(where).is_file():
        raise UserFileNotFoundError(f"no such file: {where}")
    return where, name, is_file


def main_source(target: object) -> str | None:
    """A module's text defining ``target`` of ``__main__`` (a notebook cell's) for another
    process, None for other targets: its source from ``linecache`` (``inspect`` cannot find a
    cell's class in some kernels) after what it uses from ``__main__``, other values pickled
    (running the cells again would also run the training, or this check)."""
    main = sys.modules.get("__main__")
    if getattr(target, "__module__", None) != "__main__" or main is None:
        return None
    done: dict[str, str] = {}  # name -> its line(s), in the order the module needs them
    _define(target, vars(main), done)
    return "import pickle as _pickle\n" + "\n".join(done.values())


def _define(obj: Any, scope: dict[str, Any], done: dict[str, str]) -> None:
    """``obj``'s ``class`` / ``def`` into ``done``, after what it uses from ``scope``."""
    name = obj.__name__
    done[name] = ""  # being defined: a class naming itself (super(Block, self)) is not a need
    kinds = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    members = vars(obj).values() if inspect.isclass(obj) else [obj]
    functions = [f for v in members if inspect.isfunction(f := getattr(v, "__func__", v))]
    codes = [getattr(inspect.unwrap(f), "__code__", None) for f in functions]
    files = dict.fromkeys(c.co_filename for c in codes if c is not None)
    for file in [*files, *reversed(linecache.cache)]:  # its own cell first, else the latest
        lines = linecache.getlines(str(file))
        try:
            tree = ast.parse("".join(lines))
        except (SyntaxError, ValueError):
            continue
        found = [n for n in tree.body if isinstance(n, kinds) and n.name == obj.__name__]
        if found:
            first = min([found[-1].lineno, *(d.lineno for d in found[-1].decorator_list)])
            break
    else:
        raise UserValueError(f"cannot find the source of {obj.__qualname__}, defined in __main__")
    for used in dict.fromkeys(n.id for n in ast.walk(found[-1]) if isinstance(n, ast.Name)):
        if used in done or used not in scope or hasattr(builtins, used):
            continue
        value = scope[used]
        if inspect.ismodule(value):
            done[used] = f"import {value.__name__} as {used}"
        elif isinstance(value, (type, types.FunctionType)) and value.__module__ == "__main__":
            _define(value, scope, done)
            if used != value.__name__:  # an alias: Attention = MultiHeadAttention
                done[used] = f"{used} = {value.__name__}"
        else:  # unpicklable: a NameError there, if the code really uses it
            with contextlib.suppress(*CAUGHT):
                done[used] = f"{used} = _pickle.loads(bytes.fromhex({pickle.dumps(value).hex()!r}))"
    del done[name]
    done[name] = "".join(lines[first - 1 : found[-1].end_lineno])


def _above(e: BaseException, where: str) -> str:
    """Where a module the file imports, not found, is in a folder above the file's (a project
    run from its root: s81 unseen set)."""
    top = (getattr(e, "name", None) or "").partition(".")[0]
    if not isinstance(e, ModuleNotFoundError) or not top:
        return ""
    for folder in list(Path(where).resolve().parents)[1:4]:
        if (folder / f"{top}.py").is_file() or (folder / top / "__init__.py").is_file():
            return f"; {top} is in {folder}: PYTHONPATH={folder} gptblock check ... finds it"
    return ""


def load_target(spec: str) -> Any:
    """The object ``FILE.py:NAME``, ``FILE.ipynb:NAME`` (its code cells) or
    ``package.module:NAME`` names (NAME may be dotted).

    Example:
        >>> load_target("gptblock.lesson:Block")
        <class 'gptblock.lesson.Block'>
        >>> load_target("gptblock.lesson")
        Traceback (most recent call last):
        gptblock.errors.UserValueError: TARGET must be FILE.py:NAME, FILE.ipynb:NAME or package.module:NAME, got 'gptblock.lesson'
    """
    where, name, is_file = check_spec(spec)
    loads = where.endswith(".ipynb") or importlib.util.spec_from_file_location("", where)
    if is_file and not loads:
        raise UserValueError(f"cannot load {Path(where)} as a Python module")
    try:
        module = load_module(where, f"_gptblock_check_{Path(where).stem}" if is_file else "", name)
    except CAUGHT as e:
        what = f"load {Path(where)}" if is_file else f"import {where}"
        wrong = one_line(e)
        if isinstance(e, SyntaxError) and e.lineno and where.endswith(".ipynb"):
            wrong = f"SyntaxError: {e.msg} ({Path(where).name}, {line_of(Path(where), e.lineno)})"
        said = f"cannot {what}: {wrong}{learner_line(e, None)}{_above(e, where)}"
        raise UserValueError(said) from e
    try:
        return functools.reduce(getattr, name.split("."), module)
    except AttributeError as e:
        near = difflib.get_close_matches(name, dir(module), n=1)
        raise UserValueError(
            f"{where} has no {name!r}" + f" (did you mean {near[0]!r}?)" * bool(near)
        ) from e
