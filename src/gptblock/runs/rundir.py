"""A run directory belongs to one run: what may be written where, and the lock that says whose.

Checked before anything is built and again under the lock: ``--out`` is a directory or can be
made one; a fresh run writes only into a new or empty directory, or one holding only what a run
killed early recorded writing (``gptblock.runs.owned``); a run already there is continued with
``resume`` only. While a run trains it holds an ``flock`` on ``.gptblock.lock`` (``filelock``),
released by the OS however the process ends. docs/running.md gives the reasons.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import torch
from filelock import FileLock, Timeout

from ..distributed import all_reduce_sum
from ..errors import (
    UserError,
    UserFileExistsError,
    UserFileNotFoundError,
    UserNotADirectoryError,
    UserPermissionError,
    UserValueError,
)
from .checkpoint import BEST, LAST, checkpoint_path, holds_run, run_exists_error
from .owned import RECORD_FILE, is_written, written

__all__ = [
    "LOCK_FILE",
    "LOSS_PLOT",
    "RunInUseError",
    "check_run_dir",
    "locked_run_dir",
    "make_run_dir",
    "run_dir_of_processes",
]

LOCK_FILE = ".gptblock.lock"  # inside the run directory; held while a run trains
# How long a run waits for the lock: check_run_dir holds it for an instant to see whether a run
# is training, and a run starting in that instant must not take that for a run.
PROBE_WAIT = 2.0  # seconds
LOSS_PLOT = "loss.png"  # the picture of the losses, beside the checkpoints in a run directory


class RunInUseError(UserError, BlockingIOError):
    """Another process holds the run directory's lock: a run is training there now."""


def check_run_dir(out_dir: str | os.PathLike[str], *, resume: bool, try_lock: bool = True) -> None:
    """Refuse ``out_dir`` if a run (fresh, or resumed with ``resume``) may not write there.

    Creates nothing. With ``try_lock``, takes the directory's lock for an instant to see whether
    a run is training there (``RunInUseError``).

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> check_run_dir(d, resume=False)          # empty: a fresh run may start here
        >>> _ = (d / "notes.txt").write_text("mine")
        >>> check_run_dir(d, resume=False)
        Traceback (most recent call last):
        ...
        gptblock.errors.UserFileExistsError: ... is not empty and holds no gptblock run (it holds notes.txt); a fresh run writes only into a new or empty directory: choose another --out (out_dir)
    """
    path = Path(out_dir)
    _check_kind(path)
    if try_lock and (path / LOCK_FILE).is_file():
        # A run training there now is the first thing to say: "pass --resume" would not help.
        with _locked(path, wait=0):
            pass
    _check_contents(path, resume, marked=(path / LOCK_FILE).exists())


def _check_kind(path: Path) -> None:
    if path.is_symlink() and not path.exists():
        raise UserFileNotFoundError(f"--out (out_dir) {path} is a symbolic link to nothing")
    if path.exists() and not path.is_dir():
        raise UserNotADirectoryError(f"--out (out_dir) {path} is {_kind(path)}, not a directory")


def _check_contents(path: Path, resume: bool, marked: bool) -> None:
    if resume:
        if not holds_run(path):
            raise UserFileNotFoundError(
                f"{path} holds no run to resume ({checkpoint_path(path, LAST)} not found); "
                f"leave out --resume (resume=True) to start one"
            )
        return
    if holds_run(path):
        raise run_exists_error(path)
    foreign = _foreign_entries(path, marked) if path.exists() else []
    if foreign:
        shown = ", ".join(foreign[:5]) + (
            f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
        )
        raise UserFileExistsError(
            f"{path} is not empty and holds no gptblock run (it holds {shown}); a fresh run "
            f"writes only into a new or empty directory: choose another --out (out_dir)"
        )


def _kind(path: Path) -> str:
    mode = path.stat().st_mode
    if stat.S_ISREG(mode):
        return "a file"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a pipe (FIFO)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a directory"  # pragma: no cover - nothing else exists on POSIX


def _foreign_entries(path: Path, marked: bool) -> list[str]:
    # Everything, unless the lock file marks the directory a run's: then all but what a run
    # killed early recorded writing, its JSON checkpoints aside.
    names = sorted(name for name in os.listdir(path) if name not in (LOCK_FILE, RECORD_FILE))
    recorded = written(path) if marked else set()
    checkpoints = (f"{LAST}.json", f"{BEST}.json")  # a best.json alone is still a checkpoint
    return [n for n in names if n in checkpoints or not is_written(n, recorded)]


def make_run_dir(out_dir: str | os.PathLike[str]) -> Path:
    """Create ``out_dir`` (and its parents) if needed; a one-line error where it cannot be."""
    path = Path(out_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UserNotADirectoryError(
            f"--out (out_dir) {path} is {_kind(path)}, not a directory"
        ) from None
    except OSError as e:
        kind = {
            FileNotFoundError: UserFileNotFoundError,
            PermissionError: UserPermissionError,
            NotADirectoryError: UserNotADirectoryError,
        }.get(type(e))
        if kind is None:
            raise  # another refusal of the operating system: its own message says it
        raise kind(
            f"--out (out_dir) {path}: cannot create a directory there ({e.strerror})"
        ) from None
    return path


@contextlib.contextmanager
def locked_run_dir(out_dir: str | os.PathLike[str], *, resume: bool) -> Iterator[Path]:
    """Hold ``out_dir``'s lock (made if needed) inside the block, after ``check_run_dir`` passes
    under it: a run that finished since the early check has left a checkpoint, refused here.

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> with locked_run_dir(d, resume=False):
        ...     with locked_run_dir(d, resume=False):
        ...         pass
        Traceback (most recent call last):
        ...
        gptblock.runs.rundir.RunInUseError: ... is in use by another gptblock run (it holds ...); wait for that run to end, or choose another --out (out_dir)
    """
    check_run_dir(out_dir, resume=resume)  # before anything is made
    path = make_run_dir(out_dir)
    lock_file = path / LOCK_FILE
    marked = lock_file.exists()  # before taking the lock creates it
    with _locked(path, wait=PROBE_WAIT):
        try:
            _check_contents(path, resume, marked)
        except UserError:
            if not marked:  # leave no lock file, and so no mark, where no run may be
                with contextlib.suppress(OSError):
                    lock_file.unlink()
            raise
        yield path


@contextlib.contextmanager
def _locked(path: Path, wait: float) -> Iterator[None]:
    lock = FileLock(path / LOCK_FILE, timeout=wait)
    try:
        lock.acquire()
    except Timeout:
        raise RunInUseError(
            f"{path} is in use by another gptblock run (it holds {path / LOCK_FILE}); wait "
            f"for that run to end, or choose another --out (out_dir)"
        ) from None
    try:
        yield
    finally:
        lock.release()


@contextlib.contextmanager
def run_dir_of_processes(
    out_dir: str | os.PathLike[str], *, resume: bool, is_main: bool, comm: torch.device
) -> Iterator[None]:
    """``locked_run_dir`` for torchrun's processes: the first (``is_main``) takes the lock, the
    others check without it, and all agree in one collective on ``comm`` before any goes on."""
    problem: Exception | None = None
    with contextlib.ExitStack() as held:
        try:
            if is_main:
                held.enter_context(locked_run_dir(out_dir, resume=resume))
            else:
                check_run_dir(out_dir, resume=resume, try_lock=False)
        except (UserError, OSError) as e:
            problem = e
        if all_reduce_sum(torch.tensor([float(problem is not None)], device=comm)).item() > 0:
            raise problem or UserValueError(
                f"another process of this run refused {out_dir} (see its error)"
            )
        yield
