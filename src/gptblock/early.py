"""The checker's child processes, started as early as the command line says they are needed.

``gptblock check`` spends about 3 s importing gptblock and torch, and its supervisor
(``check.isolation.reaper``) about 2 s importing torch before it forks the builder and the
runner. So ``gptblock.cli.main`` calls ``start(argv)`` before it imports torch, and the
supervisor's import runs beside this process's; ``check.isolation.child.Child`` ``take``s it. A
command that never takes it ``drop``s it. This file uses nothing but the standard library.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RUNNER", "Spawned", "environment", "neutral_scripts", "spawn", "start", "take"]

CHECK = Path(__file__).with_name("check")
# The runner's files: none imports gptblock.
RUNNER = ("calls", "frames", "loop", "runner", "subject")
_KEPT = ("PATH", "HOME", "LD_LIBRARY_PATH", "PYTHONHOME", "VIRTUAL_ENV", "TMPDIR")  # torch needs


@dataclass
class Spawned:
    """The supervisor just started: its process, its folder, the pipes of the block's stdout and
    stderr (read ends), and each job's (``builder``, ``runner``: to it, from it)."""

    proc: subprocess.Popen[bytes]
    folder: tempfile.TemporaryDirectory[str]
    out_r: int
    err_r: int
    pipes: dict[str, tuple[int, int]]


_started: Spawned | None = None


def start(argv: Sequence[str]) -> None:
    """Spawn the supervisor now when ``argv`` (the words after ``gptblock``) runs a check (not
    ``--help``): ``gptblock.cli.main`` calls this before it imports torch."""
    global _started
    words = [a for a in argv if not a.startswith("-")]
    if _started is None and words[:1] == ["check"] and not {"-h", "--help"} & set(argv):
        try:
            _started = spawn()
        except OSError:  # then Child spawns it, or says why it cannot
            _started = None


def drop() -> None:
    """End the supervisor ``start`` spawned if no check took it (the command failed first)."""
    global _started
    spawned, _started = _started, None
    if spawned is None:
        return
    # Nothing of the block ran: kill the supervisor (its first process is not reaped yet, so the
    # group's number is still ours) rather than let it import torch and fork jobs for nothing.
    with contextlib.suppress(OSError):
        os.killpg(spawned.proc.pid, signal.SIGKILL)
    if spawned.proc.stdin is not None:
        spawned.proc.stdin.close()
    for fd in (spawned.out_r, spawned.err_r, *(fd for p in spawned.pipes.values() for fd in p)):
        os.close(fd)
    spawned.proc.wait()
    spawned.folder.cleanup()


def take() -> Spawned:
    """The supervisor ``start`` spawned (once), else a new one."""
    global _started
    spawned, _started = _started, None
    return spawned if spawned is not None else spawn()


def spawn() -> Spawned:
    """Start the supervisor; it imports torch and forks the builder and the runner."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    jobs, passed, pipes = [], [out_w, err_w], {}
    for name, module in (
        ("builder", "gptblock.check.isolation.worker"),
        ("runner", "serve.runner"),
    ):
        to_child, to_fd = os.pipe()
        from_fd, from_child = os.pipe()
        pipes[name] = (to_fd, from_fd)
        jobs.append([name, module, to_child, from_child])
        passed += [to_child, from_child]
    folder = tempfile.TemporaryDirectory()
    supervisor = neutral_scripts(Path(folder.name))
    proc = subprocess.Popen(
        [sys.executable, str(supervisor), str(out_w), str(err_w)], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=err_w, pass_fds=passed, env=environment(),
        start_new_session=True,  # its own process group, spared the terminal's ^C
    )  # fmt: skip
    for fd in passed:
        os.close(fd)
    if proc.stdin is not None:  # the jobs: in a pipe, not in a command line the block can read
        try:
            proc.stdin.write((json.dumps(jobs) + "\n").encode())
            proc.stdin.flush()
        except BrokenPipeError:
            pass  # it died: asking it says how
    return Spawned(proc, folder, out_r, err_r, pipes)


def neutral_scripts(folder: Path) -> Path:
    """Copies of the supervisor (``check/isolation/reaper.py``) and the runner's package (the
    files ``RUNNER``) under names that say nothing of the checker, in what the block can see."""
    supervisor, package = folder / "supervise.py", folder / "serve"
    supervisor.write_bytes((CHECK / "isolation" / "reaper.py").read_bytes())
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in RUNNER:
        (package / f"{name}.py").write_bytes((CHECK / "serve" / f"{name}.py").read_bytes())
    return supervisor


def environment() -> dict[str, str]:
    """The caller's environment without what names the checker (``GPTBLOCK_*``, ``_``,
    ``PYTEST_*``, a value naming gptblock); ``PYTHONPATH`` this process's path."""
    env = {
        k: v for k, v in os.environ.items()
        if not k.upper().startswith(("GPTBLOCK", "PYTEST_")) and k != "_"
        and (k in _KEPT or "gptblock" not in v.lower())
    }  # fmt: skip
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    return env
