"""Run the checker's processes and, when they end or when told to stop, kill every process below.
Runs as ``supervise.py`` (standard library and torch only): the fork server (``serve_forks``) of
supervisors (``main``). docs/checker.md, "The block cannot break the checker"."""

from __future__ import annotations

import atexit
import contextlib
import ctypes.util
import importlib
import json
import os
import select
import signal
import sys
import time
import traceback
from typing import Any, NoReturn

__all__ = ["main"]

PR_GET_DUMPABLE, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_CHILD_SUBREAPER = 3, 4, 24, 36
PR_CAP_AMBIENT, CAP_SYS_PTRACE, CLONE_NEWUSER, CLONE_NEWPID = 47, 19, 0x10000000, 0x20000000
# What the block could send to end or stop it, short of SIGKILL and SIGSTOP: ignored here.
SPARED = ["SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGTSTP",
          "SIGTTIN", "SIGTTOU", "SIGXCPU", "SIGXFSZ", "SIGVTALRM", "SIGPROF"]  # fmt: skip


def _libc() -> ctypes.CDLL | None:  # where it is Linux's
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    except OSError:
        return None
    return libc if sys.platform.startswith("linux") and hasattr(libc, "prctl") else None


def prctl(option: int, value: int = 0) -> int:
    libc = _libc()
    return -1 if libc is None else libc.prctl(ctypes.c_int(option), ctypes.c_ulong(value), 0, 0, 0)


def drop_ptrace() -> None:
    """Give up ``CAP_SYS_PTRACE`` for this process and all it runs (exec cannot give it back)."""
    libc = _libc()
    if libc is None:
        return
    prctl(PR_CAPBSET_DROP, CAP_SYS_PTRACE)
    prctl(PR_CAP_AMBIENT, 4)  # clear the ambient set
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    sets = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable; of capabilities 0-31 first
    if libc.capget(header, sets) == 0:
        for i in range(3):
            sets[i] &= ~(1 << CAP_SYS_PTRACE) & 0xFFFFFFFF
        libc.capset(header, sets)


def own_pid_namespace() -> bool:
    """Make the next fork the init of a PID namespace of its own: the block then cannot signal
    any process outside, nor the init, and the kernel kills what is left when it ends."""
    libc = _libc()
    if libc is None or not hasattr(libc, "unshare"):
        return False
    if libc.unshare(ctypes.c_int(CLONE_NEWPID)) == 0:
        return True
    uid, gid = os.getuid(), os.getgid()  # before: in the new user namespace they are unmapped
    if libc.unshare(ctypes.c_int(CLONE_NEWUSER | CLONE_NEWPID)) != 0:
        return False
    maps = {"setgroups": "deny", "uid_map": f"{uid} {uid} 1", "gid_map": f"{gid} {gid} 1"}
    with contextlib.suppress(OSError):  # the same ids inside as outside
        for name, text in maps.items():
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    return True


def _descendants(root: int) -> list[int]:  # from /proc (none without it)
    children: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for entry in filter(str.isdigit, os.listdir("/proc")):
            with contextlib.suppress(OSError), open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[-1].split()  # the name may hold ")"
                children.setdefault(int(fields[1]), []).append(int(entry))
    found = [root]
    for pid in found:  # found grows as it is walked
        found += children.get(pid, [])
    return found[1:]


def sweep(sessions: list[int], init: bool) -> None:
    """Kill ``sessions`` and every process below this one until none is left; ``init``: of a PID
    namespace of its own, whose every process is ours (``kill(-1)``)."""
    while init:
        with contextlib.suppress(OSError):
            os.kill(-1, signal.SIGKILL)  # all but this one (its init)
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return
    for _ in range(10_000):
        with_pids = _descendants(os.getpid())
        for pid in with_pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        for session in sessions:
            with contextlib.suppress(OSError):
                os.killpg(session, signal.SIGKILL)
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass  # reap what died, and what was re-parented to us and died
        except ChildProcessError:  # no child left
            if not with_pids:
                return
        time.sleep(0.002)


def _say(line: str) -> None:
    with contextlib.suppress(OSError):  # the checker is gone: the sweep still runs
        os.write(1, (line + "\n").encode())


def _only(std: tuple[int, int, int], keep: set[int]) -> None:
    os.setsid()
    for fd, to in zip(std, (0, 1, 2), strict=True):
        os.dup2(fd, to)
    try:
        opened = [int(n) for n in os.listdir("/proc/self/fd")]
    except OSError:  # no /proc: the usual range
        opened = list(range(3, 256))
    for fd in set(opened) - {0, 1, 2, *keep}:
        with contextlib.suppress(OSError):
            os.close(fd)


def _job(module: str, pipes: list[int], out_fd: int, err_fd: int, handlers: Any) -> NoReturn:
    rc = 1
    try:
        for number, handler in handlers.items():  # what the supervisor ignores, as it was
            signal.signal(number, handler)
        _only((os.open(os.devnull, os.O_RDONLY), out_fd, err_fd), set(pipes))
        drop_ptrace()
        prctl(PR_SET_DUMPABLE, 1)  # its own process, as an exec'd one would be
        rc = int(importlib.import_module(module).main([str(fd) for fd in pipes]) or 0)
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else int(e.code is not None)
    except KeyboardInterrupt:  # as Python reports it: killed by SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()  # the block's handlers, as at an interpreter's exit
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(rc)


def serve_forks(sock_fd: int) -> NoReturn:
    """``python supervise.py SOCK_FD``: import torch once, then fork a supervisor for each request
    on the socket (pipes, jobs, environment, folder: not a command line the block reads)."""
    import socket

    with contextlib.suppress(ImportError):
        import torch  # noqa: F401
    prctl(PR_SET_DUMPABLE, 0)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # its forks are reaped by the kernel
    sock = socket.socket(fileno=sock_fd)
    base = [p for p in sys.path[1:] if p not in os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, 1 << 20, 64)
        except OSError:
            break
        if not data:
            break  # the checker ended
        ask = json.loads(data)
        pid = os.fork()
        if pid == 0:
            try:  # main ends by os._exit; this fork must never return to the server's loop
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                _only((fds[0], fds[1], fds[3]), set(fds[2:]))  # the socket, what torch opened
                os.environ.clear()
                os.environ.update(ask["env"])
                sys.path[1:] = [*ask["env"].get("PYTHONPATH", "").split(os.pathsep), *base]
                os.chdir(ask["cwd"])
                if "random" in sys.modules:
                    sys.modules["random"].seed()  # not the fork server's draws
                sys.argv[1:] = [str(n) for n in fds[2:4]]
                jobs = [[name, module, fds[i], fds[o]] for name, module, i, o in ask["jobs"]]
                main(fds[2], fds[3], jobs)  # in a socket, not a command line the block reads
            except BaseException:
                traceback.print_exc()  # on the checker's stderr pipe, once fd 2 is it
            os._exit(1)
        for fd in fds:
            os.close(fd)
        with contextlib.suppress(OSError):
            sock.send(pid.to_bytes(8, "little"))
    os._exit(0)


def main(out_fd: int, err_fd: int, jobs: list[list[Any]]) -> NoReturn:
    """A supervisor of ``jobs`` (``[NAME, MODULE, IN_FD, OUT_FD]``): it leaves the checker's tree,
    says ``supervisor PID`` and ``exit NAME RC``, and stops when its stdin closes."""
    isolated = own_pid_namespace()
    pid = os.fork()
    if pid:  # the checker's child ends here: this process leaves the checker's tree
        _say(f"supervisor {pid}")  # as the checker numbers it (in the namespace it is 1)
        os._exit(0)
    numbers = [getattr(signal, name) for name in SPARED if hasattr(signal, name)]
    handlers = {number: signal.signal(number, signal.SIG_IGN) for number in numbers}
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    prctl(PR_SET_DUMPABLE, 0)  # the block cannot reach into this process's files or memory
    fds = {out_fd, err_fd, *(fd for job in jobs for fd in job[2:])}
    running: dict[int, str] = {}
    for name, module, *pipes in jobs:
        pid = os.fork()
        if pid == 0:
            _job(module, pipes, out_fd, err_fd, handlers)
        running[pid] = name
    for fd in fds:
        os.close(fd)
    sessions = list(running)
    while running:
        for pid, name in list(running.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                _say(f"exit {name} {os.waitstatus_to_exitcode(status)}")
                del running[pid]
        if running and select.select([0], [], [], 0.02)[0] and not os.read(0, 1 << 12):
            break  # the checker closed our stdin: stop
    for pid, name in running.items():  # its session, and itself: it may have none yet
        for kill in (os.killpg, os.kill):
            with contextlib.suppress(OSError):
                kill(pid, signal.SIGKILL)
        _say(f"exit {name} {os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])}")
    sweep(sessions, isolated and os.getpid() == 1)
    os._exit(0)  # not Python's exit: tearing torch down takes longer than the whole sweep


if __name__ == "__main__":
    serve_forks(int(sys.argv[1]))
