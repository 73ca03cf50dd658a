"""Which files in a run directory a gptblock run wrote: the only ones it may overwrite or delete.

Before a run writes a file it appends the name to ``.gptblock.written``; leftovers are only the
names listed there and their temporaries. A file merely named like ours is the user's (a
user's ``loss.png`` was once overwritten). Not in the lock file: the lock library truncates it.

Example:
    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> record_written(d, "loss.png"); sorted(written(d))
    ['loss.png']
"""

from __future__ import annotations

import os
from pathlib import Path

from ..files import temporary_of

__all__ = ["RECORD_FILE", "is_written", "record_written", "written"]

RECORD_FILE = ".gptblock.written"  # in the run directory: a name per line, appended before writing


def record_written(directory: str | os.PathLike[str], name: str) -> None:
    """Note that a run is about to write ``directory / name`` (a plain file name)."""
    if Path(name).name != name or "\n" in name:
        raise ValueError(f"record_written takes a plain file name, got {name!r}")
    if name in written(directory):
        return
    # O_APPEND: one short write per name, so a crash leaves whole lines (at worst a partial last
    # one, which names nothing of ours and so protects rather than exposes a file).
    fd = os.open(Path(directory) / RECORD_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
    try:
        os.write(fd, (name + "\n").encode("utf-8"))
    finally:
        os.close(fd)


def written(directory: str | os.PathLike[str]) -> set[str]:
    """The names recorded in ``directory``'s record (none if it has no record)."""
    try:
        text = (Path(directory) / RECORD_FILE).read_bytes().decode("utf-8", errors="replace")
    except OSError:
        return set()
    return set(text.splitlines())


def is_written(name: str, recorded: set[str]) -> bool:
    """Whether ``name`` is a recorded file, or a temporary ``atomic_write_bytes`` made for one."""
    of = temporary_of(name)
    return name in recorded or (of is not None and of in recorded)
