"""Finding the block to check from text: ``FILE.py:NAME`` or ``package.module:NAME``.

``load_target`` turns a target spec into the object it names (a class, a factory or a module
instance) and ``parse_argument`` turns ``NAME=VALUE`` into a constructor argument; both are what
``gptblock check TARGET --arg NAME=VALUE`` does before it calls ``check_block``.

This module is the one place where the user's code is imported and executed, kept apart from the
checking (it imports only the standard library and ``report``), so that ``gptblock check`` can
load it in the child process that checks it (``worker``). Every failure, ``sys.exit()`` at
import included, is a ``ValueError`` (or ``FileNotFoundError``) with a one-line message, which
the CLI prints before exiting with code 2.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from ...errors import UserFileNotFoundError, UserValueError
from ..mistakes.report import CAUGHT, one_line

__all__ = ["check_spec", "load_target", "parse_argument", "parse_role"]


def parse_argument(text: str) -> tuple[str, object]:
    """``NAME=VALUE`` as a constructor argument, VALUE read as a Python literal, else as text.

    Args:
        text: what followed ``--arg``.

    Raises:
        ValueError: no ``=``, or NAME is not an identifier.

    Example:
        >>> parse_argument("n_head=4"), parse_argument("activation=relu")
        (('n_head', 4), ('activation', 'relu'))
    """
    name, sep, value = text.partition("=")
    if not sep or not name.isidentifier():
        raise UserValueError(f"--arg expects NAME=VALUE with NAME an identifier, got {text!r}")
    try:
        return name, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return name, value  # not a literal: the string itself, e.g. activation=relu


def parse_role(text: str) -> tuple[str, str]:
    """``ROLE=NAME`` (what follows ``--map``): a part of the block named for a role.

    Args:
        text: e.g. ``q=attn.wq`` or ``q=heads.*.query``.

    Raises:
        ValueError: not ``ROLE=NAME``.

    Example:
        >>> parse_role("ln1=norm_a")
        ('ln1', 'norm_a')
    """
    role, sep, name = text.partition("=")
    if not sep or not role.isidentifier() or not name:
        raise UserValueError(
            f"--map expects ROLE=NAME (e.g. q=attn.wq), got {text!r}; put TARGET before --map"
        )
    return role, name


def check_spec(spec: str) -> tuple[str, str, bool]:
    """``(where, name, is_file)`` of a well-formed target spec, without importing anything.

    Raises:
        ValueError: a malformed spec.
        FileNotFoundError: a file spec whose file does not exist.

    Example:
        >>> check_spec("gptblock.lesson:Block")
        ('gptblock.lesson', 'Block', False)
    """
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise UserValueError(f"TARGET must be FILE.py:NAME or package.module:NAME, got {spec!r}")
    is_file = where.endswith(".py") or "/" in where or "\\" in where
    if is_file and not Path(where).is_file():
        raise UserFileNotFoundError(f"no such file: {where}")
    return where, name, is_file


def load_target(spec: str) -> Any:
    """The object ``FILE.py:NAME`` or ``package.module:NAME`` names (NAME may be dotted).

    A file is executed as a module of its own (its folder on ``sys.path`` while it loads, so it
    can import its neighbours); a package module is imported as usual.

    Args:
        spec: ``FILE.py:NAME`` (any ``where`` ending in ``.py`` or holding a path separator is a
            file) or ``package.module:NAME``.

    Raises:
        ValueError: a malformed spec, a module that fails to import or load, or no such NAME.
        FileNotFoundError: the file does not exist.

    Example:
        >>> load_target("gptblock.lesson:Block")
        <class 'gptblock.lesson.Block'>
        >>> load_target("gptblock.lesson")
        Traceback (most recent call last):
        gptblock.errors.UserValueError: TARGET must be FILE.py:NAME or package.module:NAME, got 'gptblock.lesson'
    """
    where, name, is_file = check_spec(spec)
    if is_file:
        module = _load_file(Path(where))
    else:
        try:
            module = importlib.import_module(where)
        except CAUGHT as e:
            raise UserValueError(f"cannot import {where}: {one_line(e)}") from e
    obj: Any = module
    for part in name.split("."):
        if not hasattr(obj, part):
            raise UserValueError(f"{where} has no {name!r}")
        obj = getattr(obj, part)
    return obj


def _load_file(path: Path) -> ModuleType:
    if not path.is_file():
        raise UserFileNotFoundError(f"no such file: {path}")
    name = f"_gptblock_check_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UserValueError(f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up here
    sys.path.insert(0, str(path.resolve().parent))  # so the file can import its neighbours
    try:
        spec.loader.exec_module(module)
    except CAUGHT as e:
        del sys.modules[name]
        raise UserValueError(f"cannot load {path}: {one_line(e)}") from e
    finally:
        sys.path.remove(str(path.resolve().parent))
    return module
