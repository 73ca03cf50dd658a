"""Checking blocks in a child process, so that the block cannot end, hang or fool the checker.

``check_isolated`` starts ``python -m gptblock.check.worker``, sends it the targets (``FILE.py:NAME``
text, or a pickled class / factory / module), and reads back what it does, one JSON line per
event, on a pipe of its own: which target and stage it is at, each finding as it completes, and
the report. The child's stdout and stderr (whatever the block prints) are drained by threads and
only counted, so a block that prints a lot cannot block the child or garble the checker's output.

Whatever the child does, the report comes from here: a block that calls ``os._exit``, crashes
(a signal), or runs past ``timeout`` seconds (the child is killed, with everything it started)
gets a report that keeps the findings made before and names what happened and during which
stage. ``sys.exit`` is caught in the child itself, like any exception the block raises. A target
that cannot be loaded or built raises the same ``UserError`` as in-process. A protocol line
must carry this run's random nonce, so text the block writes cannot pass for the checker's.

This guards against accidents (``sys.exit`` left in a script, an endless loop, a segfault), not
against code written to defeat it: the block runs in the same process as the checker's probes.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import secrets
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import IO, Any

from .. import errors
from .report import CAUGHT, CheckReport, Finding, one_line
from .target import check_spec

__all__ = ["DEFAULT_TIMEOUT", "STARTUP_LIMIT", "check_isolated"]

DEFAULT_TIMEOUT = 60.0
"""Seconds a block may take to load, build and be checked (a check takes well under one)."""
STARTUP_LIMIT = 120.0  # seconds for the child to import torch and the checker: not the block's
MAX_LINE = 16 * 2**20  # bytes: a longer protocol line is not the checker's
KEEP = 4096  # bytes of the block's own output kept, for the first line in the report


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
    stage: str = "starting"
    description: str = ""
    findings: list[Finding] = field(default_factory=list)


class _Lines:
    """Lines from a pipe, with a deadline."""

    def __init__(self, fd: int) -> None:
        self.fd, self.buffer, self.eof = fd, b"", False

    def next(self, deadline: float) -> bytes | None:
        """The next line; ``None`` at end of file; ``TimeoutError`` past the deadline."""
        while b"\n" not in self.buffer:
            if self.eof:
                return None
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self.fd], [], [], remaining)[0]:
                raise TimeoutError
            chunk = os.read(self.fd, 1 << 16)
            self.eof = not chunk
            self.buffer += chunk
            if len(self.buffer) > MAX_LINE and b"\n" not in self.buffer:
                raise ValueError(f"a line of over {MAX_LINE} bytes from the child")
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line


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
    while len(reports) < len(sent):  # a child that dies leaves the rest to a fresh one
        first = len(reports)
        reports += _run_child(sent[first:], names[first:], kwargs, roles, timeout)
    return reports


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


def _run_child(
    targets: list[str | bytes],
    names: list[str],
    kwargs: Mapping[str, object],
    roles: Mapping[str, str],
    timeout: float,
) -> list[CheckReport]:
    """Run one child on ``targets``; returns a report per target it got to (at least one)."""
    nonce = secrets.token_hex(16)
    try:
        request = pickle.dumps(
            {"nonce": nonce, "targets": targets, "kwargs": dict(kwargs), "roles": dict(roles)}
        )
    except CAUGHT as e:
        raise errors.UserValueError(
            f"cannot send the constructor arguments to a child process: {one_line(e)}"
        ) from e
    read_fd, write_fd = os.pipe()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))  # the same modules as here
    proc = subprocess.Popen(
        [sys.executable, "-m", "gptblock.check.worker", str(write_fd)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        pass_fds=(write_fd,),
        env=env,
        start_new_session=True,  # its own process group: killed as one, spared the terminal's ^C
    )
    os.close(write_fd)
    outputs = [_Output("stdout"), _Output("stderr")]
    threads = [
        threading.Thread(target=o.drain, args=(s,), daemon=True)
        for o, s in zip(outputs, (proc.stdout, proc.stderr), strict=True)
    ]
    for t in threads:
        t.start()
    state, reports = _State(), []
    try:
        try:
            if proc.stdin is not None:
                proc.stdin.write(request)
                proc.stdin.close()
        except BrokenPipeError:
            pass  # it died before reading: the events below say how
        lines, deadline = _Lines(read_fd), time.monotonic() + STARTUP_LIMIT
        while True:
            try:
                line = lines.next(deadline)
            except TimeoutError:
                _kill(proc)
                if state.index is None:
                    raise RuntimeError(
                        f"the checker's child process did not start within {STARTUP_LIMIT:g} s"
                    ) from None
                what = f"did not finish within {timeout:g} s (--timeout) and was stopped"
                reports.append(_cut_short(state, names, what))
                break
            if line is None:
                if state.index is not None or not reports:
                    reports += _ended(proc, state, names, outputs)
                break  # (between targets: the reports so far stand, a fresh child does the rest)
            event = _event(line, nonce)
            if event is None:
                continue
            kind = event["event"]
            if kind == "target":
                state = _State(int(event["index"]), f"loading {names[int(event['index'])]}")
                deadline = time.monotonic() + timeout
            elif kind == "stage":
                state.stage = str(event["what"])
            elif kind == "built":
                state.description = str(event["description"])
            elif kind == "finding":
                state.findings.append(_finding(event["finding"]))
            elif kind == "report":
                reports.append(CheckReport.from_dict(event["report"]))
                state = _State()
            elif kind == "failed":
                reports.append(_failed(state, names, event))
                state = _State()
            elif kind == "user_error":
                cls = getattr(errors, str(event["type"]), errors.UserValueError)
                if not (isinstance(cls, type) and issubclass(cls, errors.UserError)):
                    cls = errors.UserValueError
                raise cls(str(event["message"]))
            elif kind == "done":
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5)  # let it flush what the block printed
                break
    finally:
        _kill(proc)
        os.close(read_fd)
        for t in threads:
            t.join(timeout=5)
    noisy = [o.describe() for o in outputs if o.size]
    if noisy:
        note = f"the checked code wrote {' and '.join(noisy)}; not shown"
        reports = [_with_note(r, note) for r in reports]
    return reports


def _event(line: bytes, nonce: str) -> dict[str, Any] | None:
    """The protocol event on ``line``, or None for anything that is not this run's."""
    try:
        event = json.loads(line)
    except ValueError:
        return None
    if not isinstance(event, dict) or event.get("nonce") != nonce or "event" not in event:
        return None
    return event


def _finding(data: object) -> Finding:
    if not isinstance(data, dict):
        raise ValueError("a finding from the child is not an object")
    return CheckReport.from_dict({"target": "", "findings": [data], "diagnosis": []}).findings[0]


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """Kill the child and every process the block started in its group (even after the child
    itself has exited: a process the block left running would hold the output pipes open)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        if proc.poll() is None:
            proc.kill()
    proc.wait()


def _ended(
    proc: subprocess.Popen[bytes], state: _State, names: list[str], outputs: list[_Output]
) -> list[CheckReport]:
    """The child closed its channel without saying it was done: why, and the report for it."""
    try:
        rc = proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        _kill(proc)
        rc = proc.returncode
    if rc < 0:
        name = signal.Signals(-rc).name if -rc in signal.valid_signals() else f"signal {-rc}"
        why = {
            "SIGSEGV": " (a crash in native code)",
            "SIGKILL": " (out of memory?)",
            "SIGINT": " (a KeyboardInterrupt raised in the block)",
        }
        what = f"was killed by {name}{why.get(name, '')}"
    else:
        what = f"exited with code {rc} without a result (os._exit, or a crash past Python)"
    if state.index is None:
        err = outputs[1].head.decode("utf-8", "replace").strip().splitlines()
        raise RuntimeError(
            f"the checker's child process {what} before checking anything"
            + (f": {err[-1]}" if err else "")
        )
    return [_cut_short(state, names, what)]


def _cut_short(state: _State, names: list[str], what: str) -> CheckReport:
    """The report of a target whose check the child did not finish, or the load error."""
    name = names[state.index] if state.index is not None else "the target"
    if state.stage.startswith("loading") or state.stage == "building the block":
        verb = "load" if state.stage.startswith("loading") else "build"
        raise errors.UserValueError(f"cannot {verb} {name}: its process {what} while {state.stage}")
    finding = Finding(
        "process", False, f"the process running the block {what} during {state.stage}"
    )
    notes = ["the check was cut short; the findings before it are kept"]
    return CheckReport(state.description or name, [*state.findings, finding], [], {}, notes)


def _failed(state: _State, names: list[str], event: dict[str, Any]) -> CheckReport:
    """The checker itself raised while checking a block: a failed check, and where."""
    name = names[state.index] if state.index is not None else "the target"
    finding = Finding(
        "check", False, f"the check stopped during {state.stage}: {event.get('message')}"
    )
    notes = [f"if the block did not cause this, it is a bug in gptblock: {event.get('where', '')}"]
    return CheckReport(state.description or name, [*state.findings, finding], [], {}, notes)


def _with_note(report: CheckReport, note: str) -> CheckReport:
    return replace(report, notes=[*report.notes, note])
