"""Run one command and, when it ends or when told to stop, kill every process it started.

``python -I -S reaper.py OUT_FD ERR_FD KEEP_FDS -- COMMAND...`` is started by
``gptblock.check.isolation`` between the checker and the child that runs the user's block. It
uses nothing but the standard library (and never imports gptblock or torch, so it starts in
milliseconds), and never runs the user's code. It

* forks once and lets its parent end, so that it is re-parented away from the checker (to init,
  or to the nearest subreaper above the checker): the block's ancestors are this process and
  that one, never the checker's ``gptblock check ...`` (whose command line names it); it says
  ``supervisor PID`` on stdout, and ends when its stdin closes or its command has ended;
* makes itself the subreaper of everything below it (Linux's ``PR_SET_CHILD_SUBREAPER``): a
  process the block starts that leaves its parent, in a new session (``setsid``) or by forking
  twice, is re-parented to the reaper instead of to init, so it can always be found;
* starts COMMAND in a session of its own, with stdin from /dev/null, stdout and stderr on OUT_FD
  and ERR_FD and the pipes KEEP_FDS (comma-separated), and without the capability to trace other
  processes (``CAP_SYS_PTRACE``, dropped from its bounding set: even as root it cannot open the
  checker's ``/proc/PID/fd/1`` while the checker is not dumpable, nor the reaper's);
* writes ``pid N`` and, when COMMAND ends, ``exit RC`` (a negative RC: the signal) on stdout;
* when COMMAND has ended, or when its stdin closes (the checker is done, timed out, or died),
  kills COMMAND's session and then every process below the reaper (found in ``/proc``), again
  and again until none is left, and exits.

Off Linux there is no subreaper and no ``/proc``: only COMMAND's session is killed, and a process
that left it survives. A block that kills the reaper itself (it runs as the same user) can also
leave processes behind; a sandbox, a container or another user is the answer to that.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import select
import signal
import subprocess
import sys
import time

__all__ = ["main"]

PR_GET_DUMPABLE, PR_SET_DUMPABLE = 3, 4
PR_CAPBSET_DROP, PR_SET_CHILD_SUBREAPER, PR_CAP_AMBIENT = 24, 36, 47
CAP_SYS_PTRACE = 19
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    except OSError:
        return None


def prctl(option: int, value: int = 0) -> int:
    """``prctl(option, value)``'s result: -1 where there is none or it failed."""
    libc = _libc()
    if libc is None or not hasattr(libc, "prctl") or not sys.platform.startswith("linux"):
        return -1
    return int(libc.prctl(ctypes.c_int(option), ctypes.c_ulong(value), 0, 0, 0))


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def drop_ptrace() -> None:
    """Give up ``CAP_SYS_PTRACE`` for this process and everything it runs (best effort: a
    process without the capability has nothing to drop)."""
    libc = _libc()
    if libc is None or not sys.platform.startswith("linux"):
        return
    prctl(PR_CAPBSET_DROP, CAP_SYS_PTRACE)  # exec cannot give it back, even to root
    libc.prctl(ctypes.c_int(PR_CAP_AMBIENT), ctypes.c_ulong(4), 0, 0, 0)  # clear the ambient set
    header, data = _Header(_LINUX_CAPABILITY_VERSION_3, 0), (_Data * 2)()
    if libc.capget(ctypes.byref(header), data) == 0:
        keep = ~(1 << CAP_SYS_PTRACE) & 0xFFFFFFFF
        data[0].effective &= keep
        data[0].permitted &= keep
        data[0].inheritable &= keep
        libc.capset(ctypes.byref(header), data)


def _descendants(root: int) -> list[int]:
    """Every process below ``root``, from ``/proc`` (empty where there is no ``/proc``)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat.rsplit(b")", 1)[-1].split()  # the name may hold spaces and parentheses
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def sweep(session: int) -> None:
    """Kill ``session`` and every process below this one until none is left, reaping them."""
    for _ in range(10_000):
        with_pids = _descendants(os.getpid())
        for pid in with_pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.killpg(session, signal.SIGKILL)
        while True:  # reap what died, and what was re-parented to us and died
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                if not with_pids:
                    return
                break
            if pid == 0:
                break
        time.sleep(0.002)


def _say(line: str) -> None:
    with contextlib.suppress(OSError):  # the checker is gone: the sweep still runs
        os.write(1, (line + "\n").encode())


def main(argv: list[str]) -> int:
    out_fd, err_fd, keep = int(argv[0]), int(argv[1]), [int(f) for f in argv[2].split(",") if f]
    command = argv[argv.index("--") + 1 :]
    if hasattr(os, "fork") and os.fork():
        os._exit(0)  # the checker's child ends here: this process leaves the checker's tree
    _say(f"supervisor {os.getpid()}")
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    prctl(PR_SET_DUMPABLE, 0)  # the block cannot reach into this process's files or memory
    worker = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=out_fd,
        stderr=err_fd,
        pass_fds=keep,
        start_new_session=True,
        preexec_fn=drop_ptrace,
    )
    for fd in (out_fd, err_fd, *keep):
        os.close(fd)
    _say(f"pid {worker.pid}")
    while worker.poll() is None:
        if select.select([0], [], [], 0.02)[0] and not os.read(0, 1 << 12):
            break  # the checker closed our stdin: stop
    if worker.poll() is None:
        try:
            os.killpg(worker.pid, signal.SIGKILL)
        except OSError:
            worker.kill()
    _say(f"exit {worker.wait()}")
    sweep(worker.pid)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
