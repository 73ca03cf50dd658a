"""Writing files so that a crash never leaves half of one: ``atomic_write_bytes`` and friends.

Every file gptblock writes (checkpoints, the loss plot, ``bench --json``) goes through here, so
there is one rule for temporary files. The bytes go to ``.NAME.XXXXXXXX.tmp`` in the target's
own directory (``os.replace`` is atomic only within one file system), are flushed and fsynced,
and the file is renamed over ``NAME``; then the directory is fsynced so the rename itself
survives a power cut. A reader therefore sees the old content or the new, never a mix. A process
killed mid-write leaves at most its ``.NAME.*.tmp`` file, which nothing ever reads.

The temporary file is created with ``O_EXCL`` and mode 0o666 filtered by the umask, as any new
file is (``tempfile.mkstemp`` would make it private to the user, and the renamed file with it).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import UserFileNotFoundError, UserIsADirectoryError

__all__ = [
    "atomic_write_bytes",
    "atomic_write_json",
    "check_destination",
    "fsync_dir",
    "temporary_name",
    "temporary_of",
]

TEMPORARY = re.compile(r"\.(?P<of>.+)\.[0-9a-f]{8}\.tmp")


def temporary_name(path: Path) -> Path:
    """Where ``atomic_write_bytes`` stages ``path``: a fresh hidden name beside it."""
    return path.parent / f".{path.name}.{uuid.uuid4().hex[:8]}.tmp"


def temporary_of(name: str) -> str | None:
    """The file name that ``name`` is a ``temporary_name`` of, or None if it is none.

    Example:
        >>> temporary_of(temporary_name(Path("out/last.json")).name), temporary_of("x.tmp")
        ('last.json', None)
    """
    match = TEMPORARY.fullmatch(name)
    return match.group("of") if match else None


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Make a rename in ``directory`` durable (skipped where a directory cannot be opened)."""
    with contextlib.suppress(OSError):  # Windows cannot open a directory
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def check_destination(path: str | os.PathLike[str]) -> Path:
    """Refuse a file destination that ``atomic_write_bytes`` could not write, before the work
    whose result it is (a benchmark's minutes) is done.

    Example:
        >>> check_destination("/nonexistent/dir/out.json")
        Traceback (most recent call last):
        ...
        gptblock.errors.UserFileNotFoundError: cannot write /nonexistent/dir/out.json: /nonexistent/dir is not an existing directory
    """
    path = Path(path)
    if path.is_dir():
        raise UserIsADirectoryError(f"cannot write {path}: it is a directory")
    if not path.parent.is_dir():
        raise UserFileNotFoundError(
            f"cannot write {path}: {path.parent} is not an existing directory"
        )
    return path


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` so that ``path`` holds either the old or the new content.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "x.txt"
        >>> atomic_write_bytes(p, b"hello"); p.read_bytes()
        b'hello'
        >>> sorted(q.name for q in p.parent.iterdir())  # no temporary file left behind
        ['x.txt']
    """
    path = Path(path)
    tmp = temporary_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def atomic_write_json(
    path: str | os.PathLike[str],
    value: Any,
    *,
    indent: int = 1,
    default: Callable[[Any], Any] | None = None,
) -> None:
    """``value`` as UTF-8 JSON, atomically. NaN and infinity are refused: they are not JSON.

    ``default`` turns objects JSON has no type for into ones it has, as in ``json.dumps``.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "x.json"
        >>> atomic_write_json(p, {"loss": 1.5}); json.loads(p.read_text())
        {'loss': 1.5}
    """
    text = json.dumps(value, indent=indent, allow_nan=False, ensure_ascii=False, default=default)
    atomic_write_bytes(path, (text + "\n").encode("utf-8"))
