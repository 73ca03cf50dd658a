"""The checker's child processes, started as early as the command line says they are needed.

``gptblock check`` spends about 3 s importing gptblock and torch, and its supervisor
(``check.isolation.reaper``) about 2 s importing torch before it forks the builder and the
runner. So ``gptblock.cli.main`` calls ``start(argv)`` before it imports torch, and the
supervisor's import runs beside this process's; ``check.isolation.child.Child`` ``take``s it. A
command that never takes it ``drop``s it. Supervisors are forked from one fork server per
checking process (``reaper.serve_forks``), which pays the import once: a class graded, or a
test suite, starts each check in milliseconds. This file uses nothing but the standard library.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

__all__ = ["RUNNER", "Spawned", "environment", "neutral_scripts", "spawn", "start", "take"]

CHECK = Path(__file__).with_name("check")
# The runner's files: none imports gptblock.
RUNNER = ("cache", "calls", "loop", "runner", "script", "subject")
JOBS = (("builder", "gptblock.check.isolation.worker"), ("runner", "serve.runner"))
_KEPT = ("PATH", "HOME", "LD_LIBRARY_PATH", "PYTHONHOME", "VIRTUAL_ENV", "TMPDIR")  # torch needs


class _Server:
    """This process's fork server (``reaper.serve_forks``): it imports torch once, and each
    supervisor forked from it starts as if it were a new interpreter that had just done so."""

    def __init__(self) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.folder = tempfile.mkdtemp()  # removed by the process that made it, not by a fork
        weakref.finalize(self, _remove, self.folder, os.getpid())
        script = neutral_scripts(Path(self.folder))
        self.proc = subprocess.Popen(
            [sys.executable, str(script), str(theirs.fileno())], stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=[theirs.fileno()],
            env=environment(), start_new_session=True,  # its own group, spared the terminal's ^C
        )  # fmt: skip
        theirs.close()
        self.sock, self.owner, self.asked, self.pids = mine, os.getpid(), 0, list[int]()

    def fork(self, fds: list[int], jobs: list[list[object]]) -> int:
        """Ask for a supervisor of ``jobs`` (their pipes: indices in ``fds``) given ``fds``
        (stdin, stdout, the block's stdout and stderr, the jobs'); its index in the order of
        asking."""
        ask = {"env": environment(), "cwd": os.getcwd(), "jobs": jobs}
        socket.send_fds(self.sock, [json.dumps(ask).encode()], fds)
        self.asked += 1
        self.replies(0)
        return self.asked - 1

    def replies(self, wait: float) -> list[int]:
        """The pids forked so far, read as they come (unread, they would fill the socket), after
        waiting at most ``wait`` seconds for the next."""
        while select.select([self.sock], [], [], wait)[0] and (data := self.sock.recv(8)):
            self.pids.append(int.from_bytes(data, "little"))
            wait = 0
        return self.pids

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.sock.close()
        _remove(self.folder, os.getpid())


def _remove(folder: str, owner: int) -> None:
    if os.getpid() == owner:
        shutil.rmtree(folder, ignore_errors=True)


@dataclass
class Spawned:
    """The supervisor just asked for: its first process's stdin (closed, it stops) and stdout
    (what it says; the fork server reaps it), the pipes of the block's stdout and stderr (read
    ends), each job's (``builder``, ``runner``: to it, from it), and where it was asked."""

    stdin: IO[bytes]
    stdout: IO[bytes]
    out_r: int
    err_r: int
    pipes: dict[str, tuple[int, int]]
    server: _Server
    index: int


_started: Spawned | None = None
_server: _Server | None = None
_lock = threading.Lock()


def start(argv: Sequence[str]) -> None:
    """Spawn the supervisor now when ``argv`` (the words after ``gptblock``) runs a check (not
    ``--help``): ``gptblock.cli.main`` calls this before it imports torch."""
    global _started
    words = [a for a in argv if not a.startswith("-")]
    if _started is None and words[:1] == ["check"] and not {"-h", "--help"} & set(argv):
        with contextlib.suppress(OSError):  # then Child spawns it, or says why it cannot
            _started = spawn()


def drop() -> None:
    """End the supervisor ``start`` spawned if no check took it (the command failed first)."""
    global _started, _server
    spawned, _started = _started, None
    if spawned is None:
        return
    with _lock:  # nothing of the block ran: no need to let it import torch and fork for nothing
        pids = spawned.server.replies(0.05)
        if spawned.index < len(pids):
            for kill in (os.killpg, os.kill):
                with contextlib.suppress(OSError):
                    kill(pids[spawned.index], signal.SIGKILL)
        elif spawned.server is _server:  # it imports torch still: a command that failed at once
            _server = None
            spawned.server.close()
    spawned.stdin.close()
    spawned.stdout.close()
    for fd in (spawned.out_r, spawned.err_r, *(fd for p in spawned.pipes.values() for fd in p)):
        os.close(fd)


def take() -> Spawned:
    """The supervisor ``start`` spawned (once), else a new one."""
    global _started
    spawned, _started = _started, None
    return spawned if spawned is not None else spawn()


def spawn() -> Spawned:
    """Ask the fork server (started on first use) for a supervisor; it forks the builder and the
    runner."""
    global _server
    (out_r, out_w), (err_r, err_w), (in_r, in_w), (st_r, st_w) = (os.pipe() for _ in range(4))
    jobs: list[list[object]] = []
    passed, pipes = [in_r, st_w, out_w, err_w], {}
    for name, module in JOBS:
        (to_child, to_fd), (from_fd, from_child) = os.pipe(), os.pipe()
        pipes[name] = (to_fd, from_fd)
        jobs.append([name, module, len(passed), len(passed) + 1])
        passed += [to_child, from_child]
    with _lock:  # grading checks in threads
        if _server is None or _server.owner != os.getpid() or _server.proc.poll() is not None:
            _server = _Server()  # (the block may have killed it, where it could see it)
        server, index = _server, _server.fork(passed, jobs)
    for fd in passed:
        os.close(fd)
    return Spawned(os.fdopen(in_w, "wb"), os.fdopen(st_r, "rb"), out_r, err_r, pipes, server, index)


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
    ``PYTEST_*``, a value naming gptblock) or keeps the supervisor from its ``serve`` beside it
    (``PYTHONSAFEPATH``); ``PYTHONPATH`` this process's path."""
    env = {
        k: v for k, v in os.environ.items()
        if not k.upper().startswith(("GPTBLOCK", "PYTEST_")) and k not in ("_", "PYTHONSAFEPATH")
        and (k in _KEPT or "gptblock" not in v.lower())
    }  # fmt: skip
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    return env
