"""The child processes of ``isolation.check``: a supervisor (``reaper``), the builder (``worker``)
and the runner (``serve``). ``Child.call`` sends what decides the verdict to the runner, the rest
to the builder. docs/checker.md, "What the block can still tell"."""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import select
import signal
import threading
import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager as ContextManager
from typing import Any

import torch

from ... import errors
from ...early import take
from ..mistakes.report import CAUGHT, Raised, one_line, text
from ..serve.loop import Message, Reader, send, setting
from .reaper import PR_GET_DUMPABLE, PR_SET_DUMPABLE, prctl

__all__ = ["KEEP", "STARTUP_LIMIT", "Child", "Gone", "ProtocolBroken", "pickled", "undumpable"]

STARTUP_LIMIT = 120.0  # seconds for the child to import torch and the checker: not the block's
KEEP = 4096  # bytes of the block's own output kept, for the first line in the report
SIGNALS = {"SIGSEGV": " (a crash in native code)", "SIGKILL": " (out of memory?)",
           "SIGINT": " (a KeyboardInterrupt raised in the block)"}  # fmt: skip


class Gone(BaseException):  # not an Exception: the probes must not catch it
    """The child stopped answering: it ended, hung (``"timeout"``) or broke the protocol."""


class ProtocolBroken(Gone):
    def __str__(self) -> str:
        return f"broke the checker's protocol ({self.args[0]})"


class _Output(threading.Thread):
    def __init__(self, name: str, fd: int) -> None:
        super().__init__(name=name, daemon=True)
        self.stream, self.size, self.lines, self.head = os.fdopen(fd, "rb"), 0, 0, bytearray()
        self.start()

    def run(self) -> None:
        while chunk := self.stream.read1(65536):
            self.size += len(chunk)
            self.lines += chunk.count(b"\n")
            self.head += chunk[: max(0, KEEP - len(self.head))]

    def describe(self) -> str:
        first = self.head.decode("utf-8", "replace").strip().splitlines()
        shown = f", the first: {first[0][:120]!r}" if first else ""
        return f"{self.size:,} bytes ({self.lines:,} lines) to {self.name}{shown}"


def pickled(value: object, what: str, instead: str = "") -> bytes:
    """``value`` pickled for a child process, else a ``UserValueError`` naming ``what``."""
    try:
        return pickle.dumps(value)
    except CAUGHT as e:
        said = f"cannot send {what} to a child process ({one_line(e)}){instead}"
        raise errors.UserValueError(said) from e


def undumpable() -> ContextManager[None]:
    """Not dumpable while the child runs: the child (without ``CAP_SYS_PTRACE``) cannot then
    open its ``/proc/PID/fd`` (its stdout), even as the same user. (Where ``prctl`` is not
    Linux's, each call is a no-op returning -1.)"""
    return setting(lambda: prctl(PR_GET_DUMPABLE), lambda v: prctl(PR_SET_DUMPABLE, v), 0)


class Child:
    """The supervisor, and the builder and the runner below it given ``targets`` and ``kwargs``."""

    def __init__(
        self,
        targets: Sequence[str | bytes],
        kwargs: Mapping[str, object],
        roots: Sequence[str] = (),
    ) -> None:
        asked = {"targets": list(targets), "kwargs": dict(kwargs), "roots": list(roots)}
        request = pickled(asked, "the arguments")  # roots: on sys.path (a student's folder)
        self.spawned = spawned = take()  # started early by ``gptblock check``, or now
        self.pipes = {name: (to, Reader(fro)) for name, (to, fro) in spawned.pipes.items()}
        self.outputs = [_Output("stdout", spawned.out_r), _Output("stderr", spawned.err_r)]
        self.said, self.eof = b"", False  # what the supervisor said
        self.id, self.dropout = 0, False
        self.deadline = time.monotonic() + STARTUP_LIMIT
        # the seconds its processes may still take to answer (``--timeout``), else ``deadline``:
        # the checker's own work between requests (a search at GPT-2's width) is not the block's
        self.left: float | None = None
        for to_fd, _ in self.pipes.values():
            with contextlib.suppress(BrokenPipeError):
                send(to_fd, {"init": request.hex()})

    def ready(self) -> None:
        try:
            for name in self.pipes:
                self.answer(name, 0)
        except Gone as e:
            err = self.outputs[1].head.decode("utf-8", "replace").strip().splitlines()
            what = f"did not start within {STARTUP_LIMIT:g} s" if str(e) == "timeout" else str(e)
            raise RuntimeError(
                f"the checker's child process {what} before checking anything"
                + (f": {err[-1]}" if err else "")
            ) from None

    def call(self, op: str, tensors: dict[str, torch.Tensor] | None = None, **args: Any) -> Message:
        """A block error as ``Raised``, a target's as its ``UserError``."""
        if op not in ("load", "build", "width", "read", "suggest"):  # what decides the verdict
            self.dropout = self.dropout or op == "dropout_off"
            return self._ask("runner", op, tensors, **args)
        if op in ("read", "suggest"):  # on the builder's copy (at its width), as the runner's
            self._ask("builder", "copy", None)
            if self.dropout:
                self._ask("builder", "dropout_off", None)
            self._ask("builder", "set", self._ask("runner", "parameters", None)[1])
        said, found = self._ask("builder", op, tensors, **args)
        if op == "load" or (op == "build" and said.get("none") is not True):  # the runner's too
            sent = args if op == "load" else {"recipe": said.pop("recipe", None)}
            self._ask("runner", op, None, **sent)
            self.dropout = False
        return said, found

    def _ask(self, name: str, op: str, tensors: dict[str, Any] | None, **args: Any) -> Message:
        self.id += 1
        with contextlib.suppress(BrokenPipeError):  # it died: reading says how
            send(self.pipes[name][0], {"id": self.id, "op": op, **args}, tensors)
        return self.answer(name, self.id)

    def answer(self, name: str, wanted: int) -> Message:
        start = time.monotonic()
        try:
            header, tensors = self.pipes[name][1].next(
                self.deadline if self.left is None else start + self.left
            )
        except TimeoutError:
            raise Gone("timeout") from None
        except EOFError:
            raise Gone(self.ended(name)) from None
        except ValueError as e:
            raise ProtocolBroken(one_line(e)) from None
        finally:
            if self.left is not None:
                self.left -= time.monotonic() - start
        if header.get("id") != wanted:
            raise ProtocolBroken("an answer to no request")
        if isinstance(header.get("ok"), dict):
            return header["ok"], tensors
        if "user_error" in header:
            cls = getattr(errors, str(header["user_error"]), None)
            if not (isinstance(cls, type) and issubclass(cls, errors.UserError)):
                cls = errors.UserValueError
            raise cls(text(header.get("message", ""), 2000))
        if "raised" in header:
            raised = Raised(text(header["raised"], 400))
            raised.where = text(header.get("where", ""), 600)
            raise raised
        raise ProtocolBroken("an answer of no known kind")

    def _status(self, timeout: float, last: int = signal.SIGCONT) -> None:
        """Close the supervisor's stdin (its signal to stop and sweep) and read what it says until
        it ends; past ``timeout`` it is sent signal ``last``."""
        with contextlib.suppress(OSError):
            self.spawned.stdin.close()
        out, deadline = self.spawned.stdout, time.monotonic() + timeout
        while not self.eof:
            left = deadline - time.monotonic()
            if left > 0 and select.select([out], [], [], min(left, 0.5))[0]:
                chunk = os.read(out.fileno(), 4096)
                self.said, self.eof = self.said + chunk, not chunk
                continue
            # Silent: without a PID namespace the block may have stopped it, and it must sweep.
            if found := re.search(rb"^supervisor (\d+)$", self.said, re.M):
                with contextlib.suppress(OSError):
                    os.kill(int(found[1]), signal.SIGCONT if left > 0 else last)
            if left <= 0:
                return

    def ended(self, name: str) -> str:
        self._status(10)
        found = re.search(rf"^exit {name} (-?\d+)$".encode(), self.said, re.M)
        if not found:
            return "ended without a word from its reaper"
        rc = int(found[1])
        if rc >= 0:
            return f"exited with code {rc} without a result (os._exit, or a crash past Python)"
        name = signal.Signals(-rc).name if -rc in signal.valid_signals() else f"signal {-rc}"
        return f"was killed by {name}{SIGNALS.get(name, '')}"

    def close(self) -> None:
        self._status(30, signal.SIGKILL)  # hung: the supervisor, at least
        for fd in (fd for to_fd, reader in self.pipes.values() for fd in (to_fd, reader.fd)):
            with contextlib.suppress(OSError):
                os.close(fd)
        for o in self.outputs:
            o.join(timeout=5)
        self.spawned.stdout.close()
