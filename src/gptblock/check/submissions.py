"""A class's submissions, and the block class in each, found without running a line of them.

``submissions``: a ``.py`` file or an ``.ipynb`` notebook is one, and so is a student's folder
of them (or a flat folder whose files import each other); a folder of such entries holds one per
entry (``one=True``: the folder is one student's, as Gradescope's ``/autograder/submission``).

``find_block`` reads the code with ``ast`` only (running it is the isolated check's job). The
block is the ``nn.Module`` subclass the others do not build on: by the lessons' name first
(``Block``, then a name with "block" in it), then one no other class uses (``FeedForward`` is a
part of the block that uses it), then the one that builds on the most others. A class that
embeds tokens is a model, not a block. When several remain, the submission says which and
``--class`` picks.
"""

from __future__ import annotations

import ast
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserFileNotFoundError, UserValueError

__all__ = ["CODE", "Found", "NotGraded", "Submission", "find_block", "notebook_code", "submissions"]

CODE = (".py", ".ipynb")
LESSON_NAME = "Block"  # the lessons' name for the block


@dataclass(frozen=True)
class Submission:
    """One student's work: ``student`` (the file's or folder's name without its suffix), the
    ``path`` given, and its code ``files`` (``.py`` and ``.ipynb``, sorted)."""

    student: str
    path: Path
    files: tuple[Path, ...]


@dataclass(frozen=True)
class Found:
    """The block of a submission: its class ``name``, the ``file`` defining it and that file's
    ``code`` (a notebook's as Python), and the classes that could be the block (``found``)."""

    name: str
    file: Path
    code: str
    found: tuple[str, ...]


class NotGraded(Exception):
    """Why a submission has no block to check: the reason its row gives, and what was found."""

    def __init__(self, reason: str, found: Sequence[str] = ()) -> None:
        super().__init__(reason)
        self.found = tuple(found)


def submissions(paths: Iterable[str | os.PathLike[str]], *, one: bool = False) -> list[Submission]:
    """The submissions ``paths`` (files and folders) hold, in the order given, each folder's
    sorted by name; with ``one``, each folder is one student's submission.

    Raises:
        UserFileNotFoundError: a path does not exist.
        UserValueError: a file that is not ``.py`` or ``.ipynb``, or a folder with none.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> _ = (d / "alice.py").write_text(""); (d / "bob").mkdir()
        >>> _ = (d / "bob" / "block.ipynb").write_text("{}")
        >>> [(s.student, [f.name for f in s.files]) for s in submissions([d])]
        [('alice', ['alice.py']), ('bob', ['block.ipynb'])]
    """
    found: list[Submission] = []
    for given in paths:
        path = Path(given)
        if not path.exists():
            raise UserFileNotFoundError(f"no such file or folder: {path}")
        if path.is_file():
            if path.suffix not in CODE:
                raise UserValueError(f"{path}: a submission is a .py or .ipynb file, or a folder")
            found.append(Submission(path.stem, path, (path,)))
            continue
        entries = [e for e in sorted(path.iterdir()) if _code(e)]
        if not entries:
            raise UserValueError(f"{path}: no .py or .ipynb file in it")
        flat = all(e.is_file() for e in entries)
        if one or (flat and _one_program(entries)):
            found.append(Submission(path.name, path, _files(path)))
        else:
            found += [Submission(e.stem if e.is_file() else e.name, e, _files(e)) for e in entries]
    return found


def _code(entry: Path) -> bool:
    """Whether ``entry`` is a code file or a folder holding one (hidden ones and caches aside)."""
    if entry.name.startswith((".", "__")):
        return False
    return entry.suffix in CODE if entry.is_file() else bool(_files(entry))


def _files(path: Path) -> tuple[Path, ...]:
    if path.is_file():
        return (path,)
    return tuple(
        f for f in sorted(path.rglob("*"))
        if f.is_file() and f.suffix in CODE
        and not any(p.startswith((".", "__")) for p in f.relative_to(path).parts)
    )  # fmt: skip


def _one_program(files: Sequence[Path]) -> bool:
    """Whether one of ``files`` imports another: then they are one student's, not several."""
    stems = {f.stem for f in files}
    for f in files:
        try:
            tree = ast.parse(code_of(f))
        except (SyntaxError, ValueError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module.split(".")[0]]
            else:
                continue
            if (set(names) & stems) - {f.stem}:
                return True
    return False


def notebook_code(path: str | Path) -> str:
    """A notebook's code cells, in order, as one Python file: outputs ignored, ``%`` magics and
    ``!`` shell lines replaced by ``pass`` (so an indented one leaves its block valid), a cell
    that starts with a ``%%`` cell magic (its body is the magic's, not Python) left out.

    Raises:
        ValueError: the file is not a notebook (JSON with a list of cells).

    Example:
        >>> import tempfile
        >>> p = Path(tempfile.mkdtemp()) / "n.ipynb"
        >>> cells = [{"cell_type": "code", "source": ["!pip install torch\\n", "x = 1"]},
        ...          {"cell_type": "markdown", "source": "# notes"},
        ...          {"cell_type": "code", "source": "%%bash\\nls"}]
        >>> _ = p.write_text(json.dumps({"cells": cells}))
        >>> print(notebook_code(p))
        pass
        x = 1
        <BLANKLINE>
    """
    try:
        cells = json.loads(Path(path).read_text(encoding="utf-8"))["cells"]
        sources = [
            c["source"] if isinstance(c["source"], str) else "".join(c["source"])
            for c in cells
            if c.get("cell_type") == "code"
        ]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a notebook ({type(e).__name__}: {e})") from e
    kept = []
    for source in sources:
        if source.lstrip().startswith("%%"):
            continue
        lines = source.splitlines()
        for i, line in enumerate(lines):
            if line.lstrip().startswith(("%", "!")):
                lines[i] = line[: len(line) - len(line.lstrip())] + "pass"
        kept.append("\n".join(lines) + "\n")
    return "\n".join(kept)


def code_of(path: Path) -> str:
    """A file's Python source (a notebook's through ``notebook_code``)."""
    if path.suffix == ".ipynb":
        return notebook_code(path)
    return path.read_text(encoding="utf-8", errors="replace")


def find_block(submission: Submission, name: str | None = None) -> Found:
    """The class to check in ``submission``: ``name`` if given, else the one the module
    docstring says.

    Raises:
        NotGraded: a file does not parse and no block was found elsewhere, no class could be the
            block, several could (their names in ``found``), or no class ``name``.
    """
    codes: dict[Path, str] = {}
    trees: dict[Path, ast.Module] = {}
    broken: list[str] = []
    for f in submission.files:
        try:
            codes[f] = code_of(f)
            trees[f] = ast.parse(codes[f], filename=str(f))
        except SyntaxError as e:
            broken.append(f"{f.name}: SyntaxError at line {e.lineno}: {e.msg}")
        except (ValueError, OSError) as e:
            broken.append(f"{f.name}: cannot read it: {e}")
    classes = {  # the last definition of a name wins, as when the file runs
        c.name: (f, c)
        for f, tree in trees.items()
        for c in tree.body
        if isinstance(c, ast.ClassDef)
    }
    modules = _modules(classes)
    embeds = {n for n in modules if any(x.endswith("Embedding") for x in _names(classes[n][1]))}
    blocks = [n for n in modules if n not in embeds]  # one that embeds token ids is a model
    why = "; ".join(broken)
    if name is not None:
        defined = {
            n: f for f, tree in trees.items() for n in _top_level(tree)
        }  # a factory function or an instance may be checked too
        if name not in defined:
            raise NotGraded(why or f"no class or function {name!r} in it", blocks)
        return Found(name, defined[name], codes[defined[name]], tuple(blocks))
    if not blocks:
        raise NotGraded(why or "no nn.Module subclass in it that could be a block")
    uses = {m: {n for n in blocks if n != m and n in _names(classes[m][1])} for m in blocks}
    used = set().union(*uses.values())
    key = {n: (_name_rank(n), n in used, -len(_reach(uses, n))) for n in blocks}
    best = min(key.values())
    chosen = [n for n in blocks if key[n] == best]
    if len(chosen) > 1:
        raise NotGraded(
            f"several classes could be the block: {', '.join(chosen)}; pick one with --class",
            blocks,
        )
    f = classes[chosen[0]][0]
    return Found(chosen[0], f, codes[f], tuple(blocks))


def _modules(classes: dict[str, tuple[Path, ast.ClassDef]]) -> list[str]:
    """The classes that are ``nn.Module``\\ s: a base is ``Module``, from ``nn``, or one of them."""
    found: set[str] = set()
    while True:
        more = {
            n for n, (_, c) in classes.items()
            if n not in found and any(_is_module(ast.unparse(b), found) for b in c.bases)
        }  # fmt: skip
        if not more:
            return [n for n in classes if n in found]
        found |= more


def _is_module(base: str, modules: set[str]) -> bool:
    last = base.rsplit(".", 1)[-1]
    return last in modules or last == "Module" or base.startswith(("nn.", "torch.nn."))


def _names(c: ast.ClassDef) -> set[str]:
    """Every name and attribute a class's code mentions (its bases included)."""
    return {
        n.id if isinstance(n, ast.Name) else n.attr
        for n in ast.walk(c)
        if isinstance(n, (ast.Name, ast.Attribute))
    }


def _reach(uses: dict[str, set[str]], start: str) -> set[str]:
    """The classes ``start`` builds on, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for n in uses[todo.pop()] - seen:
            seen.add(n)
            todo.append(n)
    return seen


def _name_rank(name: str) -> int:
    return 0 if name == LESSON_NAME else 1 if "block" in name.lower() else 2


def _top_level(tree: ast.Module) -> list[str]:
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
    return names
