"""Checking blocks in a child process that only answers requests, so that the block cannot end,
hang or fool the checker.

``check_isolated`` starts the supervisor (``gptblock.check.reaper``), which starts the worker
(``gptblock.check.worker``), both from scripts with neutral names in a temporary folder, so that
no command line the block can read names the checker; the supervisor leaves this process's tree
(it forks, its parent ends), and the child's environment has no variable of the checker's. The
child loads and builds the target (``FILE.py:NAME`` text, or a pickled class / factory / module)
and then only answers requests (``gptblock.check.remote``): an output for an input, a backward
pass's gradients, one forward pass recorded (``gptblock.check.loop``), its cache driven. Every
check, the reading of its weights (by replaying the recorded operators), the comparison and the
verdict are computed here, in a process that never runs the block's code and never unpickles
anything the child sends (JSON and raw tensors, ``gptblock.check.frames``); a comparison is
confirmed on inputs from a seed the child never sees. The child's stdout and stderr (whatever the block prints, an ``atexit`` handler included)
are drained by threads and only counted; the report is printed by the caller, after the child
and everything it started are gone.

Whatever the child does, the report comes from here: a block that calls ``os._exit``, crashes
(a signal), breaks the protocol or runs past ``timeout`` seconds gets a report that keeps the
findings made before and names what happened and during which stage. At the end, or at the
timeout, the reaper kills the child and every process below it, those that left its session
(``setsid``, a double fork) included: it is their subreaper (Linux; elsewhere only the child's
session is killed). Targets from different files or modules get a child each (one learner's
code cannot answer for another's); those of one file share one. A target that cannot be loaded
or built raises the same ``UserError`` as in-process.

What remains (the block runs as the same user as the checker): while a check runs, this process
is not dumpable and the child cannot trace processes (``CAP_SYS_PTRACE`` dropped), so it cannot
open this process's ``/proc/PID/fd/1`` even as root; but it can write to any file and terminal
the user can (a ``/dev/pts`` terminal included), and kill this process or the reaper. For
grading, trust the exit code or ``--json`` (one object, printed last), and run untrusted code in
a container or as another user.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import secrets
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

import torch

from .. import errors
from .frames import Reader, send
from .remote import ProtocolBroken, Remote
from .report import CAUGHT, CheckReport, Finding, Raised, one_line, text
from .subject import one_thread
from .target import check_spec
from .verdict import decide

__all__ = ["DEFAULT_TIMEOUT", "STARTUP_LIMIT", "check_isolated"]

DEFAULT_TIMEOUT = 60.0
"""Seconds a block may take to load, build and be checked (a check takes well under one)."""
STARTUP_LIMIT = 120.0  # seconds for the child to import torch and the checker: not the block's
KEEP = 4096  # bytes of the block's own output kept, for the first line in the report
REAPER = Path(__file__).with_name("reaper.py")


class _Gone(BaseException):  # not an Exception: the probes must not catch it
    """The child stopped answering: it ended, hung past the deadline or broke the protocol."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


@dataclass
class _Output:
    """One of the child's stdout / stderr: counted, its start kept, the rest dropped."""

    name: str
    size: int = 0
    lines: int = 0
    head: bytearray = field(default_factory=bytearray)

    def drain(self, stream: IO[bytes]) -> None:
        while chunk := stream.read1(65536):  # type: ignore[attr-defined]
            self.size += len(chunk)
            self.lines += chunk.count(b"\n")
            if len(self.head) < KEEP:
                self.head += chunk[: KEEP - len(self.head)]

    def describe(self) -> str:
        first = self.head.decode("utf-8", "replace").strip().splitlines()
        shown = f", the first: {first[0][:120]!r}" if first else ""
        return f"{self.size:,} bytes ({self.lines:,} lines) to {self.name}{shown}"


@dataclass
class _State:
    """Where the child is: the target, the stage, what was found so far."""

    index: int | None = None
    where: str = "starting"  # the stage
    description: str = ""
    findings: list[Finding] = field(default_factory=list)

    # the verdict.Progress protocol
    def stage(self, what: str) -> None:
        self.where = what

    def built(self, description: str) -> None:
        self.description = description

    def finding(self, finding: Finding) -> None:
        self.findings.append(finding)


def check_isolated(
    targets: Sequence[object],
    *,
    kwargs: Mapping[str, object],
    roles: Mapping[str, str],
    timeout: float = DEFAULT_TIMEOUT,
) -> list[CheckReport]:
    """Check each target in a child process; one report per target, in order.

    Args:
        targets: ``"FILE.py:NAME"`` / ``"package.module:NAME"`` texts, or picklable objects (a
            class or factory importable by name, a module instance).
        kwargs: constructor arguments, for every target.
        roles: parts by role (``check_block``'s ``roles``).
        timeout: seconds each target may take; then the child is killed.

    Raises:
        UserError: a target cannot be sent, loaded or built (the error the child raised).
        RuntimeError: the child process could not start the checker.
    """
    for t in targets:
        if isinstance(t, str):
            check_spec(t)  # a malformed spec or a missing file needs no child to say so
    sent = [t if isinstance(t, str) else _pickled(t) for t in targets]
    names = [t if isinstance(t, str) else _name(t) for t in targets]
    reports: list[CheckReport] = []
    with _undumpable(), one_thread():
        while len(reports) < len(sent):  # a child that dies leaves the rest to a fresh one
            first = last = len(reports)
            while last < len(sent) and _source(sent[last]) == _source(sent[first]):
                last += 1  # one child per file: one learner's code cannot answer for another's
            reports += _run_child(sent[first:last], names[first:last], kwargs, roles, timeout)
    return reports


def _source(target: str | bytes) -> str:
    """Where a target's code comes from: its file or module, or "" for a pickled object."""
    return target.rpartition(":")[0] if isinstance(target, str) else ""


@contextlib.contextmanager
def _undumpable() -> Iterator[None]:
    """This process not dumpable while the child runs: a process without ``CAP_SYS_PTRACE``
    (the child) cannot then open its ``/proc/PID/fd`` (its stdout), even as the same user."""
    from .reaper import PR_GET_DUMPABLE, PR_SET_DUMPABLE, prctl

    before = prctl(PR_GET_DUMPABLE)
    changed = before > 0 and prctl(PR_SET_DUMPABLE, 0) == 0
    try:
        yield
    finally:
        if changed:
            prctl(PR_SET_DUMPABLE, before)


class _Child:
    """The reaper and the worker below it, the pipes to them, and their drained output."""

    def __init__(self, request: bytes) -> None:
        to_child, self.to_fd = os.pipe()
        self.from_fd, from_child = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        self.folder = tempfile.TemporaryDirectory()
        supervisor, serve = _neutral_scripts(Path(self.folder.name))
        worker = [sys.executable, str(serve), str(to_child), str(from_child)]
        passed = (to_child, from_child, out_w, err_w)
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", str(supervisor), str(out_w), str(err_w),
             f"{to_child},{from_child}", "--", *worker],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err_w,
            pass_fds=passed,
            env=_environment(),
            start_new_session=True,  # its own process group, spared the terminal's ^C
        )  # fmt: skip
        self.status: list[str] = []
        self.eof = False
        for fd in passed:
            os.close(fd)
        self.outputs = [_Output("stdout"), _Output("stderr")]
        self.threads = [
            threading.Thread(target=o.drain, args=(os.fdopen(fd, "rb"),), daemon=True)
            for o, fd in zip(self.outputs, (out_r, err_r), strict=True)
        ]
        for t in self.threads:
            t.start()
        self.reader, self.id = Reader(self.from_fd), 0
        self.deadline = time.monotonic() + STARTUP_LIMIT
        send(self.to_fd, {"init": request.hex()})

    def call(
        self, op: str, tensors: dict[str, torch.Tensor] | None = None, **args: Any
    ) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """One request's answer; a block error as ``Raised``, a target's as its ``UserError``."""
        self.id += 1
        with contextlib.suppress(BrokenPipeError):  # it died: reading says how
            send(self.to_fd, {"id": self.id, "op": op, **args}, tensors)
        return self.answer(self.id)

    def answer(self, wanted: int) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        try:
            header, tensors = self.reader.next(self.deadline)
        except TimeoutError:
            raise _Gone("timeout") from None
        except EOFError:
            raise _Gone(self.ended()) from None
        except ValueError as e:
            raise _Gone(f"broke the checker's protocol ({one_line(e)})") from None
        if header.get("id") != wanted:
            raise _Gone("broke the checker's protocol (an answer to no request)")
        if "ok" in header and isinstance(header["ok"], dict):
            return header["ok"], tensors
        if "user_error" in header:
            cls = getattr(errors, str(header["user_error"]), errors.UserValueError)
            if not (isinstance(cls, type) and issubclass(cls, errors.UserError)):
                cls = errors.UserValueError
            raise cls(text(header.get("message", ""), 2000))
        if "raised" in header:
            raised = Raised(text(header["raised"], 400))
            raised.where = text(header.get("where", ""), 600)  # type: ignore[attr-defined]
            raise raised
        raise _Gone("broke the checker's protocol (an answer of no known kind)")

    def _status(self, timeout: float) -> None:
        """The supervisor's lines (``supervisor PID``, ``pid PID``, ``exit RC``) until it ends,
        after closing its stdin (its signal to stop the worker and sweep)."""
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        out = self.proc.stdout
        if out is None or self.eof:
            return
        deadline = time.monotonic() + timeout
        data = b""
        while (left := deadline - time.monotonic()) > 0:
            if not select.select([out], [], [], left)[0]:
                break
            chunk = os.read(out.fileno(), 4096)
            if not chunk:
                self.eof = True
                break
            data += chunk
        self.status += data.decode(errors="replace").splitlines()

    def ended(self) -> str:
        """How the worker ended, as its supervisor saw it."""
        self._status(10)
        rc: int | None = None
        for line in self.status:
            if line.startswith("exit ") and line[5:].lstrip("-").isdigit():
                rc = int(line[5:])
        if rc is None:
            return "ended without a word from its reaper"
        if rc < 0:
            name = signal.Signals(-rc).name if -rc in signal.valid_signals() else f"signal {-rc}"
            why = {
                "SIGSEGV": " (a crash in native code)",
                "SIGKILL": " (out of memory?)",
                "SIGINT": " (a KeyboardInterrupt raised in the block)",
            }
            return f"was killed by {name}{why.get(name, '')}"
        return f"exited with code {rc} without a result (os._exit, or a crash past Python)"

    def close(self) -> None:
        """Stop the worker and everything below it (the supervisor sweeps), and the drains."""
        self._status(30)
        if not self.eof:  # it hangs: the supervisor, at least (not our child: by its pid)
            for line in self.status:
                if line.startswith("supervisor ") and line[11:].isdigit():
                    with contextlib.suppress(OSError):
                        os.kill(int(line[11:]), signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)  # (the first process: it ended at once)
        for fd in (self.to_fd, self.from_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        for t in self.threads:
            t.join(timeout=5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.folder.cleanup()


_SERVE = "import runpy\nrunpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n"


def _neutral_scripts(folder: Path) -> tuple[Path, Path]:
    """The supervisor (``reaper.py``, copied) and a script that runs the worker, under names
    that say nothing of the checker: the command lines the block can read in ``/proc``."""
    supervisor, serve = folder / "supervise.py", folder / "serve.py"
    supervisor.write_bytes(REAPER.read_bytes())
    serve.write_text(_SERVE.format(module=f"{__package__}.worker"))
    return supervisor, serve


_KEPT = ("PATH", "HOME", "LD_LIBRARY_PATH", "PYTHONHOME", "VIRTUAL_ENV", "TMPDIR")  # torch needs


def _environment() -> dict[str, str]:
    """The child's environment: the caller's, but nothing that names the checker (``GPTBLOCK_*``,
    the shell's ``_``: the command it ran, pytest's ``PYTEST_*``, a value that names
    gptblock); ``PYTHONPATH`` this process's path, so that the child imports the same torch
    and modules."""
    env = {
        k: v for k, v in os.environ.items()
        if not k.upper().startswith(("GPTBLOCK", "PYTEST_")) and k != "_"
        and (k in _KEPT or "gptblock" not in v.lower())
    }  # fmt: skip
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    return env


def _run_child(
    targets: list[str | bytes],
    names: list[str],
    kwargs: Mapping[str, object],
    roles: Mapping[str, str],
    timeout: float,
) -> list[CheckReport]:
    """Run one child on ``targets``; returns a report per target it got to (at least one)."""
    try:
        request = pickle.dumps({"targets": targets, "kwargs": dict(kwargs)})
    except CAUGHT as e:
        raise errors.UserValueError(
            f"cannot send the constructor arguments to a child process: {one_line(e)}"
        ) from e
    child = _Child(request)
    reports: list[CheckReport] = []
    try:
        try:
            child.answer(0)  # ready: torch and the checker imported
        except (_Gone, Raised) as e:
            err = child.outputs[1].head.decode("utf-8", "replace").strip().splitlines()
            what = e.what if isinstance(e, _Gone) else str(e)
            what = f"did not start within {STARTUP_LIMIT:g} s" if what == "timeout" else what
            raise RuntimeError(
                f"the checker's child process {what} before checking anything"
                + (f": {err[-1]}" if err else "")
            ) from None
        for i in range(len(targets)):
            state = _State(i, f"loading {names[i]}")
            child.deadline = time.monotonic() + timeout
            try:
                reports.append(_check_one(child, i, state, roles))
            except _Gone as e:
                what = e.what
                if what == "timeout":
                    what = f"did not finish within {timeout:g} s (--timeout) and was stopped"
                reports.append(_cut_short(state, names, what))
                break  # the targets after it get a fresh child
            except Raised as e:
                reports.append(_failed(state, names, e))
    finally:
        child.close()
    noisy = [o.describe() for o in child.outputs if o.size]
    if noisy:
        note = f"the checked code wrote {' and '.join(noisy)}; not shown"
        reports = [_with_note(r, note) for r in reports]
    return reports


def _check_one(child: _Child, i: int, state: _State, roles: Mapping[str, str]) -> CheckReport:
    """Load, build and check target ``i`` through ``child``; every check computed here."""
    child.call("load", index=i)
    state.stage("building the block")
    state.built(text(child.call("build")[0].get("description", ""), 400))
    state.stage("copying the block and calling it once to tell its width C")
    shape = child.call("width")[0]
    C, T, longest = shape.get("C"), shape.get("T"), shape.get("longest")
    if not (
        isinstance(C, int) and isinstance(T, int) and 1 <= C <= 1 << 16 and 1 <= T <= 64
        and isinstance(longest, int) and 1 <= longest <= 1 << 16
    ):  # fmt: skip
        raise _Gone("broke the checker's protocol (a width that is not one)")
    state.stage("copying the block and calling it once")
    copy = child.call("copy")[0]
    dtype = getattr(torch, str(copy.get("dtype")), None)
    try:
        if not isinstance(dtype, torch.dtype):
            raise ProtocolBroken(f"a copy in {text(copy.get('dtype'), 40)!r}")
        remote = Remote(child.call, C, T, dtype, str(copy.get("note", "")), longest)
    except ProtocolBroken as e:
        raise _Gone(f"broke the checker's protocol ({e})") from None
    fresh = torch.Generator().manual_seed(secrets.randbits(63))  # the child never sees these
    weights = torch.Generator().manual_seed(secrets.randbits(63))
    try:
        return decide(remote, state.description, roles, state, fresh, weights)
    except ProtocolBroken as e:
        raise _Gone(f"broke the checker's protocol ({e})") from None


def _pickled(target: object) -> bytes:
    try:
        return pickle.dumps(target)
    except CAUGHT as e:
        raise errors.UserValueError(
            f"cannot send {_name(target)} to a child process ({one_line(e)}); pass it as "
            "'FILE.py:NAME', or check it with isolate=False"
        ) from e


def _name(target: object) -> str:
    return str(getattr(target, "__qualname__", type(target).__name__))


def _cut_short(state: _State, names: list[str], what: str) -> CheckReport:
    """The report of a target whose check the child did not finish, or the load error."""
    name = names[state.index] if state.index is not None else "the target"
    if state.where.startswith("loading") or state.where == "building the block":
        verb = "load" if state.where.startswith("loading") else "build"
        raise errors.UserValueError(f"cannot {verb} {name}: its process {what} while {state.where}")
    finding = Finding(
        "process", False, f"the process running the block {what} during {state.where}"
    )
    notes = ["the check was cut short; the findings before it are kept"]
    return CheckReport(state.description or name, [*state.findings, finding], [], {}, notes)


def _failed(state: _State, names: list[str], e: Raised) -> CheckReport:
    """The block's process raised where the checker does not expect the block to (reading its
    parts, say): a failed check, and where."""
    name = names[state.index] if state.index is not None else "the target"
    finding = Finding("check", False, f"the check stopped during {state.where}: {e}")
    where = getattr(e, "where", "")
    notes = [f"if the block did not cause this, it is a bug in gptblock: {where}"]
    return CheckReport(state.description or name, [*state.findings, finding], [], {}, notes)


def _with_note(report: CheckReport, note: str) -> CheckReport:
    return replace(report, notes=[*report.notes, note])
