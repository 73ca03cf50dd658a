"""What of a learner's file runs when its block is loaded (``definitions``): its definitions and
settings, and whatever binds or changes a name they read (imports too), however indirectly; not
the script around them (the lecture's gpt.py trains when it is imported). docs/checker.md,
"Loading the file"."""

from __future__ import annotations

import ast
import builtins
import importlib.abc
import itertools
import json
import linecache
import re
import symtable
import sys
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "SKIPPED", "Cells", "as_script", "cell_of", "code_of", "definitions", "line_of", "package_of",
    "set_settings",
]  # fmt: skip

SKIPPED: dict[str, str] = {}  # a file -> what of its top level did not run: "lines 13, 21-43"
DEFINES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
PLAIN = (ast.Constant, ast.Name, ast.BinOp, ast.UnaryOp, ast.Tuple, ast.List, ast.Dict,
         ast.expr_context, ast.operator, ast.unaryop)  # fmt: skip


def code_of(path: Path) -> tuple[str | bytes, list[tuple[int, int]]]:
    """A file's code (a ``.py`` file's bytes, which may declare their encoding) and, for a
    notebook, (its first line, the cell's number counting every cell) of each code cell in it:
    its code cells in order, outputs ignored, ``%`` magics and ``!`` shell lines made ``pass`` (so
    an indented one leaves its block valid), a cell that starts with a ``%%`` cell magic (its
    body is the magic's, not Python) left out.

    Raises:
        ValueError: a ``.ipynb`` file that is not a notebook (JSON with a list of cells)."""
    if path.suffix != ".ipynb":
        return path.read_bytes(), []
    try:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        sources = {
            n: "".join(c["source"]) for n, c in enumerate(cells, 1) if c.get("cell_type") == "code"
        }
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{path}: not a notebook ({type(e).__name__}: {e})") from e
    magic = re.compile(r"^([^\S\n]*)[%!].*$", re.MULTILINE)  # its indent kept
    code = {
        n: magic.sub(r"\1pass", "\n".join(s.splitlines())) + "\n"
        for n, s in sources.items()
        if not s.lstrip().startswith("%%")
    }
    # a cell's ``from __future__`` import, first in the file as it must be (it was in its cell)
    future = re.compile(r"^from __future__ import .*\n", re.MULTILINE)
    head = "".join(f for c in code.values() for f in future.findall(c))
    code = {n: future.sub("pass\n", c) for n, c in code.items()}
    starts = itertools.accumulate(
        (c.count("\n") for c in code.values()), initial=1 + head.count("\n")
    )
    return head + "".join(code.values()), list(zip(starts, code, strict=False))


def cell_of(cells: list[tuple[int, int]], line: int) -> tuple[int, int]:
    """The number of the cell (``code_of``'s ``cells``) that holds the notebook code's ``line``,
    and the line's number in it."""
    first, n = next(((first, n) for first, n in reversed(cells) if first <= line), (1, 0))
    return n, line - first + 1


def line_of(path: Path, line: int) -> str:
    """The code's ``line`` as its reader numbers it: "line 7", in a notebook "cell 3, line 2"
    (the joined cells' numbers are no one's, s93)."""
    if path.suffix != ".ipynb":
        return f"line {line}"
    cell, line = cell_of(code_of(path)[1], line)
    return f"cell {cell}, line {line}"


def package_of(path: Path) -> list[Path]:
    """The folders of the package a ``.py`` file is in, innermost first: those with an
    ``__init__.py``, else its own where the file imports relatively (a namespace package)."""
    folder = path.resolve().parent
    chain = [folder, *folder.parents]  # the root's name, "", ends it
    package = chain[: next(i for i, f in enumerate(chain) if not _package_folder(f))]
    relative = re.compile(rb"^[^\S\n]*from[^\S\n]+\.", re.MULTILINE)
    if not package and path.suffix == ".py" and folder.name.isidentifier():
        return [folder] if relative.search(path.read_bytes()) else []
    return package


def _package_folder(folder: Path) -> bool:
    return (folder / "__init__.py").is_file() and folder.name.isidentifier()


class Cells(importlib.abc.Loader):
    """A notebook's loader: its code cells run as one module, their text put in ``linecache``
    where ``inspect`` and tracebacks read it (the file itself is JSON)."""

    def __init__(self, path: Path) -> None:
        self.code = code_of(path)[0]
        file = str(path.absolute())
        linecache.cache[file] = (len(self.code), None, str(self.code).splitlines(True), file)

    def exec_module(self, module: types.ModuleType) -> None:
        exec(compile(self.code, str(module.__file__), "exec", dont_inherit=True), vars(module))


def as_script(target: str | bytes) -> None:
    """``sys.argv`` as ``python FILE.py`` has it, not the supervisor's script's arguments: a
    module the file imports may parse it when imported (``argparse``: s81 unseen set)."""
    if isinstance(target, str) and (where := target.rpartition(":")[0]).endswith((".py", ".ipynb")):
        sys.argv[:] = [where]


def set_settings(own: dict[str, Any], settings: Mapping[str, object]) -> Callable[[], None]:
    """A module's variables ``own`` given ``settings`` (``"hyperparameters.n_embd"``: in that
    module, as every file importing it reads it); the undo."""
    before = {n: own[n] for n in settings if "." not in n}
    dotted = [(n, *n.partition(".")[::2]) for n in settings if "." in n]
    inside = [(sys.modules[m], a, getattr(sys.modules[m], a)) for _, m, a in dotted]
    # a class of values changed stays a class: the learner's code may call it, Config() (s90)
    own.update({
        n: type(v.__name__, (v,), vars(new)) if isinstance(v, type) and
        isinstance(new := settings[n], types.SimpleNamespace) else settings[n]
        for n, v in before.items()
    })  # fmt: skip
    for (n, _, _), (m, a, _) in zip(dotted, inside, strict=True):
        setattr(m, a, settings[n])

    def undo() -> None:
        own.update(before)
        for m, a, old in inside:
            setattr(m, a, old)

    return undo


def definitions(path: Path, needs: str) -> types.CodeType | None:
    """The file less the top-level statements that neither bind nor change a name ``needs`` (the
    block) or the definitions read; None where every statement runs, or where a name read is
    bound in a way this cannot follow (a function's ``global``, a star import)."""
    SKIPPED.pop(str(path.absolute()), None)  # an earlier load's, of another target
    try:
        code, cells = code_of(path)
        body = ast.parse(code, str(path)).body
        # each statement read under the file's ``__future__`` imports: a postponed annotation
        # (``-> List[int]`` with ``List`` never imported) is not read
        lifted = [s for s in body if isinstance(s, ast.ImportFrom) and s.module == "__future__"]
        future = {a.name for s in lifted for a in s.names}
        head = f"from __future__ import {', '.join(future)}\n" * bool(future)
        tables = [symtable.symtable(head + ast.unparse(s), str(path), "exec") for s in body]
    except (SyntaxError, ValueError):  # the whole file's run says where
        return None
    binds = [
        {n.get_name() for n in t.get_symbols() if n.is_assigned() or n.is_imported()} - future
        for t in tables
    ]
    imports = (ast.Import, ast.ImportFrom)
    own = set().union(*(b for b, s in zip(binds, body, strict=True) if not isinstance(s, imports)))
    settings: set[str] = set()  # ``n_embd = 64``: sizes the file implies, whoever reads them
    plain = set()  # those statements (not ``vocab_size = len(chars)`` after them: as any other)
    for i, s in enumerate(body):
        targets = getattr(s, "targets", [getattr(s, "target", None)])
        value = getattr(s, "value", None) if isinstance(s, (ast.Assign, ast.AnnAssign)) else None
        if value is None or not all(isinstance(t, ast.Name) for t in targets):
            continue
        if all(  # of constants and earlier settings
            isinstance(n, PLAIN) and (not isinstance(n, ast.Name) or n.id in settings)
            for n in ast.walk(value)
        ):
            settings |= binds[i]
            plain.add(i)
    defines = {i for i, s in enumerate(body) if isinstance(s, DEFINES)}
    kept = defines | plain | {i for i in range(len(body)) if _inert(body[i])}
    wanted = {needs.split(".")[0]}.union(*(_uses(tables[i], whole=False) for i in defines))
    changes = [set() if i in defines else _changes(s) & own for i, s in enumerate(body)]
    done: set[int] = set()  # an import too only where needed: a missing ``wandb`` is no matter
    while grow := {i for i in range(len(body)) if (binds[i] | changes[i]) & wanted} - done:
        done |= grow
        kept |= grow
        wanted = wanted.union(*(_uses(tables[i], whole=True) for i in grow))
    if {n for n in wanted - set().union(*binds) - set(dir(builtins)) if n[:2] != "__"}:
        return None
    if len(kept) == len(body):
        return None
    runs = itertools.groupby(enumerate(body), key=lambda pair: pair[0] in kept)
    spans = [(g[0][1].lineno, g[-1][1].end_lineno) for ran, run in runs if not ran for g in [list(run)]]  # fmt: skip
    said = "lines " + ", ".join(f"{a}-{b}" if b != a else str(a) for a, b in spans)
    if cells:  # a notebook's line numbers mean nothing to its reader: its cells
        at = [cell_of(cells, s.lineno)[0] for s in body]
        touched = {at[i] for i in kept}  # a cell of which some ran: in part
        gone = sorted({at[i] for i in range(len(body)) if i not in kept})
        said = "cells " + ", ".join(f"{n}{' in part' * (n in touched)}" for n in gone)
    SKIPPED[str(path.absolute())] = said
    part = ast.Module([s for i, s in enumerate(body) if i in kept], [])
    # the file's name as exec_module gives it; none of this module's ``__future__`` imports
    return compile(part, str(path.absolute()), "exec", dont_inherit=True)


def _uses(table: symtable.SymbolTable, whole: bool) -> set[str]:
    """The module's names a statement reads as it runs and (``whole``) when its functions run."""
    used, todo = set[str](), [table]
    while todo:
        t = todo.pop()
        read = {n.get_name() for n in t.get_symbols() if n.is_referenced()}
        used |= read if t is table else {n for n in read if t.lookup(n).is_global()}
        todo += [c for c in t.get_children() if whole or c.get_type() == "class"]  # runs now
    return used


def _changes(node: ast.stmt) -> set[str]:
    """The names whose objects ``node`` may change: ``X.a = ..``, ``X[k] = ..``, ``X.f(..)``."""
    found = set()
    for n in ast.walk(node):
        changed = not isinstance(getattr(n, "ctx", ast.Load()), ast.Load)
        at = n.func if isinstance(n, ast.Call) else n if changed else None
        while isinstance(at, (ast.Attribute, ast.Subscript)):
            at = at.value
        found |= {at.id} if isinstance(at, ast.Name) else set()
    return found


def _inert(node: ast.stmt) -> bool:
    """A docstring, ``pass``, a ``__future__`` or star import (what it binds is not known), an
    import of loaded modules (``import torch``: nothing to tell), or the ``if __name__ ==
    "__main__":`` that an import never runs."""
    if isinstance(node, ast.ImportFrom):
        there = sys.modules.get(node.module or "") if node.level == 0 else None
        loaded = there is not None and all(hasattr(there, a.name) for a in node.names)
        return node.module == "__future__" or node.names[0].name == "*" or loaded
    if isinstance(node, ast.Import):
        return all(alias.name in sys.modules for alias in node.names)
    if isinstance(node, ast.If) and isinstance(test := node.test, ast.Compare):
        sides = [ast.unparse(test.left), *map(ast.unparse, test.comparators)]
        return isinstance(test.ops[0], ast.Eq) and sorted(sides) == ["'__main__'", "__name__"]
    return isinstance(node, ast.Pass) or (
        isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    )
