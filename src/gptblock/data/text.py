"""Where a run's text comes from: the built-in corpora, and UTF-8 files read with care (no hang
on a FIFO nobody writes, no reading ``/dev/zero`` until memory runs out).
"""

from __future__ import annotations

import os
import select
import stat
from pathlib import Path

from ..blocks.config import check_positive_int
from ..errors import UserFileNotFoundError, UserIsADirectoryError, UserValueError

__all__ = [
    "BUILTIN_CORPORA",
    "DEFAULT_CORPUS",
    "MAX_TEXT_BYTES",
    "default_corpus",
    "load_corpus",
    "pydoc_topics",
    "read_text",
    "shakespeare",
]

CORPORA_DIR = Path(__file__).parent / "corpora"


def shakespeare() -> str:
    """Tiny Shakespeare (char-rnn's, nanoGPT's ``shakespeare_char``), shipped with gptblock.

    Example:
        >>> text = shakespeare()
        >>> len(text), text[:14]
        (1115394, 'First Citizen:')
    """
    return (CORPORA_DIR / "tinyshakespeare.txt").read_text(encoding="utf-8")


def pydoc_topics() -> str:
    """Python's help topics (``pydoc_data.topics``, what ``help("if")`` prints), in key order.

    Example:
        >>> text = pydoc_topics()
        >>> len(text) > 100_000 and "the" in text
        True
    """
    try:
        from pydoc_data.topics import topics
    except ImportError as e:  # pragma: no cover - every full CPython install has it
        raise OSError(
            "this Python has no pydoc_data module for the pydoc corpus; "
            "pass a UTF-8 text file with --data"
        ) from e
    return "".join(topics[key] for key in sorted(topics))


# The corpora gptblock ships or finds in Python itself: name -> (what it is, how to get it).
BUILTIN_CORPORA = {
    "shakespeare": ("Tiny Shakespeare (built in)", shakespeare),
    "pydoc": ("pydoc_data.topics (Python's help pages)", pydoc_topics),
}
DEFAULT_CORPUS = "shakespeare"


def default_corpus() -> str:
    """The text ``gptblock train`` uses when given no ``--data``: Tiny Shakespeare.

    Example:
        >>> default_corpus() == shakespeare()
        True
    """
    return BUILTIN_CORPORA[DEFAULT_CORPUS][1]()


def load_corpus(data: str | os.PathLike[str] | None) -> tuple[str, str]:
    """``(text, source)`` for ``--data``: a built-in corpus's name, a file's path, or None.

    Example:
        >>> text, source = load_corpus("pydoc")
        >>> source
        "pydoc_data.topics (Python's help pages)"
    """
    name = DEFAULT_CORPUS if data is None else os.fspath(data)
    if name in BUILTIN_CORPORA:
        source, read = BUILTIN_CORPORA[name]
        return read(), source
    return read_text(name), name


MAX_TEXT_BYTES = 256 * 2**20  # read_text reads at most this much (256 MiB)
PIPE_WAIT = 5.0  # seconds read_text waits for a FIFO's writer to appear


def read_text(path: str | os.PathLike[str], max_bytes: int | None = None) -> str:
    """Read a UTF-8 text file (or pipe), with errors that say what is wrong with it.

    A FIFO no writer opens within ``PIPE_WAIT`` seconds reads as empty; more than ``max_bytes``
    (``MAX_TEXT_BYTES``) is refused, since a device such as ``/dev/zero`` never ends.

    Example:
        >>> read_text("/nonexistent/input.txt")
        Traceback (most recent call last):
        ...
        gptblock.errors.UserFileNotFoundError: no such file: /nonexistent/input.txt
    """
    limit = MAX_TEXT_BYTES if max_bytes is None else check_positive_int("max_bytes", max_bytes)
    p = Path(path)
    if p.is_dir():
        raise UserIsADirectoryError(f"{p} is a directory; expected a UTF-8 text file")
    if not p.exists():
        raise UserFileNotFoundError(f"no such file: {p}")
    raw = _read_at_most(p, limit + 1)
    if len(raw) > limit:
        raise UserValueError(
            f"{p} holds more than {limit:,} bytes, the most gptblock reads as a text "
            f"(a device such as /dev/zero never ends); use a smaller file"
        )
    if not raw:
        nothing = f"a pipe that nobody wrote to (in {PIPE_WAIT:g} s)" if p.is_fifo() else "empty"
        raise UserValueError(f"{p} is {nothing}; expected a UTF-8 text file")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserValueError(
            f"{p} is not UTF-8 text: byte {raw[e.start]:#04x} at offset {e.start} ({e.reason})"
        ) from None


def _read_at_most(path: Path, n: int) -> bytes:
    # A FIFO is opened without blocking (a blocking open waits forever for a writer).
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode) and not _writer_appears(fd, PIPE_WAIT):
            return b""
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        chunks, size = [], 0
        while size < n:
            chunk = os.read(fd, min(n - size, 1 << 24))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _writer_appears(fd: int, seconds: float) -> bool:
    # Data to read, or a writer come and gone (POLLHUP), within the time; never, if none opens.
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(seconds * 1000))
