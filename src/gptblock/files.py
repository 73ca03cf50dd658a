"""Writing files so that a crash never leaves half of one: ``atomic_write_bytes`` and friends
write ``.NAME.XXXXXXXX.tmp`` beside ``NAME``, fsync it, rename it over ``NAME`` and fsync the
directory. A link is written through, a device, a pipe or ``/dev/stdout`` directly
(docs/running.md says why)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import (
    UserFileNotFoundError,
    UserIsADirectoryError,
    UserNotADirectoryError,
    UserValueError,
)

__all__ = ["atomic_write_bytes", "atomic_write_json", "check_destination", "fsync_dir"]
__all__ += ["make_directory", "temporary_name", "temporary_of"]

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
    """Refuse a destination ``atomic_write_bytes`` could not write, before the work is done.

    Example:
        >>> check_destination("/nonexistent/dir/out.json")
        Traceback (most recent call last):
        ...
        gptblock.errors.UserFileNotFoundError: cannot write /nonexistent/dir/out.json: /nonexistent/dir is not an existing directory
    """
    path = Path(path)
    if _descriptor(path) is not None:
        return path  # an open descriptor of this process: written through as it is
    target = _target(path)
    if target.is_dir():
        raise UserIsADirectoryError(f"cannot write {path}: it is a directory")
    if target.exists() and stat.S_ISSOCK(target.stat().st_mode):
        raise UserValueError(f"cannot write {path}: it is a socket, not a file")
    if not target.parent.is_dir():
        where = f"{path} links to {target}, and " if target != path else f"{path}: "
        raise UserFileNotFoundError(
            f"cannot write {where}{target.parent} is not an existing directory"
        )
    return path


def _target(path: Path) -> Path:
    return Path(os.path.realpath(path)) if path.is_symlink() else path


DESCRIPTORS = re.compile(
    r"/dev/(?:std(?P<std>in|out|err)|fd/(?P<fd>\d+))|/proc/self/fd/(?P<pfd>\d+)"
)


def _descriptor(path: Path) -> int | None:
    match = DESCRIPTORS.fullmatch(str(path))
    if match is None:
        return None
    if match["std"]:
        return {"in": 0, "out": 1, "err": 2}[match["std"]]
    return int(match["fd"] or match["pfd"])


def _is_special(path: Path) -> bool:
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode)


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
    path = check_destination(path)
    fd = _descriptor(path)
    if fd is not None:
        # /dev/stdout and the like name a descriptor this process holds, maybe a file a shell
        # redirected to: written through that descriptor, after what was printed, at its offset.
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        return
    path = _target(path)  # a link is written through: the file it names gets the bytes
    if _is_special(path):
        with open(path, "wb") as f:  # a device or a pipe: what it does with bytes is its own
            f.write(data)
        return
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
    """``value`` as UTF-8 JSON (no NaN or infinity; ``default`` as ``json.dumps``'s), atomically.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "x.json"
        >>> atomic_write_json(p, {"loss": 1.5}); json.loads(p.read_text())
        {'loss': 1.5}
    """
    text = json.dumps(value, indent=indent, allow_nan=False, ensure_ascii=False, default=default)
    atomic_write_bytes(path, (text + "\n").encode("utf-8"))


def make_directory(path: str | os.PathLike[str]) -> Path:
    """Create the directory ``path`` (and its parents) if missing; a one-line error if it cannot.

    Example:
        >>> make_directory("/dev/null")
        Traceback (most recent call last):
        ...
        gptblock.errors.UserNotADirectoryError: cannot write into /dev/null: it exists and is not a directory
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UserNotADirectoryError(f"cannot write into {path}: it exists and is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserNotADirectoryError(
            f"cannot write into {path}: no directory can be made there ({e.strerror})"
        ) from None
    return path
