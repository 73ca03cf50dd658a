"""What the learner's code raised while being built or first called, and where.

A block that cannot be built, or raises on its first call for a reason other than sizes that do
not fit (a typo, ``self.kee(x)``; a missing argument), is not a catalogued mistake: the checker
says what was raised and the learner's line (``gpt.py:31: k = self.kee(x)``). A size error
(tensors whose shapes do not fit) stays the shape probe's to report. It uses nothing of
gptblock but ``loop``: the runner's process (``gptblock.check.serve.runner``) holds it too.
"""

from __future__ import annotations

import inspect
import os
import traceback

import torch

from .loop import one_line

__all__ = ["call_error", "learner_line", "size_error", "source"]

_SIZE_WORDS = ("size", "shape", "dimension", "mat1", "must match", "broadcast", "divisible",
               "out of range", "unpack", "normalized_shape", "expected input")  # fmt: skip


def size_error(e: BaseException) -> bool:
    """Whether ``e`` reads like tensors of sizes that do not fit together."""
    if not isinstance(e, (RuntimeError, ValueError, IndexError, AssertionError)):
        return False
    said = str(e).lower()
    return isinstance(e, AssertionError) or any(w in said for w in _SIZE_WORDS)


def call_error(e: BaseException, file: str) -> str:
    """What the first call's exception is, when it is not a size mistake (``""`` when it is:
    the shape probe reports that): its class, message and the learner's line.

    Example:
        >>> call_error(AttributeError("'Head' object has no attribute 'kee'"), "")
        "AttributeError: 'Head' object has no attribute 'kee'"
    """
    if size_error(e):
        return ""
    return f"{one_line(e)}{learner_line(e, file)}"


def learner_line(e: BaseException, file: str) -> str:
    """`` at gpt.py:31: k = self.kee(x)``: the last frame of ``e``'s traceback in ``file`` (else
    the last outside torch, gptblock and the standard library), ``""`` without one."""
    frames = traceback.extract_tb(e.__traceback__)
    ours = [f for f in frames if file and os.path.abspath(f.filename) == os.path.abspath(file)]
    if not ours:
        # gptblock's folder (check/serve/ is two below it), or the folder of the runner's copy
        up = 3 if (__package__ or "").startswith("gptblock.") else 2
        ours_dir = os.path.abspath(__file__)
        for _ in range(up):
            ours_dir = os.path.dirname(ours_dir)
        skip = (os.path.dirname(torch.__file__), ours_dir, os.path.dirname(os.__file__))
        ours = [f for f in frames if not f.filename.startswith(skip) and "<" not in f.filename]
    if not ours:
        return ""
    f = ours[-1]
    where = (
        os.path.relpath(f.filename)
        if not os.path.relpath(f.filename).startswith("..")
        else f.filename
    )
    return f" (at {where}:{f.lineno}: {(f.line or '').strip()})"


def source(target: object) -> str:
    """The file ``target`` (a class or function) is written in, ``""`` when it has none."""
    try:
        return inspect.getsourcefile(target) or ""  # type: ignore[arg-type]
    except (TypeError, OSError):
        return ""
