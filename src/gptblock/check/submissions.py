"""A class's submissions, and the block class in each (``find_block``), found with ``ast``
only: without running a line of them."""

from __future__ import annotations

import ast
import os
import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserFileNotFoundError, UserValueError
from .serve import script

__all__ = [
    "CODE", "Found", "NotGraded", "Submission", "code_of", "find_block", "named", "submissions",
]  # fmt: skip

CODE = (".py", ".ipynb")
LESSON_NAME = "Block"  # the lessons' name for the block
HIDDEN = (".", "__")  # the names of files and folders that are no code of the student's
# CPython 3.11 keeps one depth counter for all threads while it builds an ``ast`` tree: two of
# grade's threads parsing at once can fail with "SystemError: AST constructor recursion depth
# mismatch" when a thread switch (a finaliser run by the collector) falls inside a parse.
_PARSING = threading.Lock()


@dataclass(frozen=True)
class Submission:
    """One student's work."""

    student: str  # the file's or folder's name without its suffix
    path: Path  # as given
    files: tuple[Path, ...]  # its .py and .ipynb files, sorted


@dataclass(frozen=True)
class Found:
    """The block of a submission."""

    name: str  # the class's
    file: Path  # the file defining it
    found: tuple[str, ...]  # the classes that could be the block


class NotGraded(Exception):
    """Why a submission has no block to check: the reason its row gives, and what was found."""

    def __init__(self, reason: str, found: Sequence[str] = ()) -> None:
        super().__init__(reason)
        self.found = tuple(found)


def submissions(paths: Iterable[str | os.PathLike[str]], *, one: bool = False) -> list[Submission]:
    """The submissions ``paths`` (files and folders) hold, in the order given, each folder's
    sorted by name; with ``one``, each folder is one student's submission (as Gradescope's
    ``/autograder/submission``).

    Raises:
        UserFileNotFoundError: a path does not exist.
        UserValueError: a file that is not ``.py`` or ``.ipynb``, or a folder with none."""
    found: list[Submission] = []
    for path in map(Path, paths):
        if not path.exists():
            raise UserFileNotFoundError(f"no such file or folder: {path}")
        if path.is_file() and path.suffix not in CODE:
            raise UserValueError(f"{path}: a submission is a .py or .ipynb file, or a folder")
        entries = [] if path.is_file() else sorted(path.iterdir())
        entries = [e for e in entries if not e.name.startswith(HIDDEN) and _files(e)]
        if not path.is_file() and not entries:
            raise UserValueError(f"{path}: no .py or .ipynb file in it")
        if path.is_file() or one or (all(e.is_file() for e in entries) and _one_program(entries)):
            entries = [path]  # one submission
        found += [Submission(e.stem if e.is_file() else e.name, e, _files(e)) for e in entries]
    return found


def _files(path: Path) -> tuple[Path, ...]:
    found = [path] if path.is_file() else sorted(path.rglob("*"))
    shown = [f for f in found if not any(p.startswith(HIDDEN) for p in f.relative_to(path).parts)]
    return tuple(f for f in shown if f.is_file() and f.suffix in CODE)


def _one_program(files: Sequence[Path]) -> bool:
    """Whether one of ``files`` imports another: one student's, not several."""
    stems = {f.stem for f in files}
    for f in files:
        try:
            tree = _parse(code_of(f), str(f))
        except (SyntaxError, ValueError, OSError):
            continue
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            if {n.split(".")[0] for n in names} & (stems - {f.stem}):
                return True
    return False


def _parse(code: str, filename: str) -> ast.Module:
    with _PARSING:
        return ast.parse(code, filename)


def code_of(path: Path) -> str:
    """A file's code, a notebook's code cells (``serve.script.code_of``)."""
    code = script.code_of(path)[0]
    return code if isinstance(code, str) else code.decode("utf-8", errors="replace")


def find_block(submission: Submission, name: str | None = None) -> Found:
    """The class to check in ``submission``: ``name`` if given (a class, a factory or an
    instance), else by the lessons' name (``Block``, then a name with "block" in it), then one no
    other class uses, then the one that builds on the most others. A class that embeds tokens is
    a model, not a block. Raises ``NotGraded`` when none or several could be the block."""
    trees: dict[Path, ast.Module] = {}
    broken: list[str] = []
    for f in submission.files:
        try:
            trees[f] = _parse(code_of(f), str(f))
        except SyntaxError as e:
            broken.append(f"{f.name}: SyntaxError at {script.line_of(f, e.lineno or 0)}: {e.msg}")
        except (ValueError, OSError) as e:
            broken.append(f"{f.name}: cannot read it: {e}")
    tops = [(f, x) for f, tree in trees.items() for x in tree.body]
    # the last definition of a name wins, as when the file runs
    classes = {c.name: (f, c) for f, c in tops if isinstance(c, ast.ClassDef)}
    modules: set[str] = set()  # a base is ``Module``, from ``nn``, or one of them
    bases = {n: [ast.unparse(b) for b in c.bases] for n, (_, c) in classes.items()}
    while more := {n for n, bs in bases.items() if n not in modules and any(
        b.rsplit(".", 1)[-1] in {"Module", *modules} or b.startswith(("nn.", "torch.nn."))
        for b in bs
    )}:  # fmt: skip
        modules |= more
    names = {  # every name and attribute a class's code mentions (its bases included)
        n: {str(getattr(x, "id", "") or getattr(x, "attr", "")) for x in ast.walk(c)}
        for n, (_, c) in classes.items()
    }
    # nn.Embedding, or a class of another file named so; a rotary one embeds no tokens
    embeds = {n for n in classes if any(x == "Embedding" or (
        x.endswith("Embedding") and x not in classes and not re.search("(?i)rotary|rope", x)
    ) for x in names[n])}  # fmt: skip
    while more := {n for n in classes if n not in embeds and names[n] & embeds}:
        embeds |= more  # a model whose own class embeds the tokens
    blocks = [n for n in classes if n in modules and n not in embeds]
    why = "; ".join(broken)
    if name is not None:  # a factory function or an instance may be checked too
        defined = {  # a top-level class, function or assignment's name
            n: f for f, x in tops for n in (
                [x.name] if isinstance(x, (ast.ClassDef, ast.FunctionDef))
                else [t.id for t in x.targets if isinstance(t, ast.Name)]
                if isinstance(x, ast.Assign) else []
            )
        }  # fmt: skip
        if (top := name.partition(".")[0]) not in defined:  # GPT.Block: a class's own class
            raise NotGraded(why or f"no class or function {top!r} in it", blocks)
        return Found(name, defined[top], tuple(blocks))
    if not blocks:
        models = [n for n in classes if n in modules]  # each embeds tokens
        said = f" ({', '.join(models)}: a model, embedding tokens); name the block with --class"
        raise NotGraded(
            why or "no nn.Module subclass in it that could be a block" + said * bool(models)
        )
    uses = {m: {n for n in blocks if n != m and n in names[m]} for m in blocks}
    used = set().union(*uses.values())
    rank = {n: 0 if n == LESSON_NAME else 1 if "block" in n.lower() else 2 for n in blocks}
    reach = uses  # the classes each builds on, directly or through others
    while (grown := {m: r.union(*(reach[n] for n in r)) for m, r in reach.items()}) != reach:
        reach = grown
    key = {n: (rank[n], n in used, -len(reach[n])) for n in blocks}
    chosen = [n for n in blocks if key[n] == min(key.values())]
    if len(chosen) > 1:
        raise NotGraded(
            f"several classes could be the block: {', '.join(chosen)}; pick one with --class",
            blocks,
        )
    f = classes[chosen[0]][0]
    return Found(chosen[0], f, tuple(blocks))


def named(target: str) -> str:
    """``FILE.py`` or ``FILE.ipynb`` without ``:NAME``: with the block ``find_block`` finds in it;
    any other target as it is."""
    if not target.endswith(CODE):
        return target
    path = Path(target)
    if not path.is_file():
        raise UserFileNotFoundError(f"no such file: {target}")
    try:
        return f"{target}:{find_block(Submission(path.stem, path, (path,))).name}"
    except NotGraded as e:
        raise UserValueError(f"{target}: {e}".replace("with --class", f"as {target}:NAME")) from e
