"""The child processes of ``isolation.check``: started under their supervisor, asked, stopped.

``Child`` takes a supervisor (``reaper``, started by ``gptblock.early``), which forks the builder
(``worker``) and the runner (the ``serve`` folder's copy). ``call`` sends loading, building, the
width and readings by names to the builder, every other request (what decides the verdict) to the
runner, which builds the block from the builder's ``recipe``; a reading by names is made on the
builder's copy given the runner's parameters. The block's output is drained.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

import torch

from ... import errors
from ...early import environment, take
from ..mistakes.report import Raised, one_line, text
from ..serve.frames import Reader, send

__all__ = ["KEEP", "STARTUP_LIMIT", "Child", "Gone", "environment", "undumpable"]

STARTUP_LIMIT = 120.0  # seconds for the child to import torch and the checker: not the block's
KEEP = 4096  # bytes of the block's own output kept, for the first line in the report
SIGNALS = {"SIGSEGV": " (a crash in native code)", "SIGKILL": " (out of memory?)",
           "SIGINT": " (a KeyboardInterrupt raised in the block)"}  # fmt: skip
Answer = tuple[dict[str, Any], dict[str, torch.Tensor]]


class Gone(BaseException):  # not an Exception: the probes must not catch it
    """The child stopped answering: it ended, hung past the deadline (``"timeout"``) or broke
    the protocol; the argument says which."""


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
            self.head += chunk[: max(0, KEEP - len(self.head))]

    def describe(self) -> str:
        first = self.head.decode("utf-8", "replace").strip().splitlines()
        shown = f", the first: {first[0][:120]!r}" if first else ""
        return f"{self.size:,} bytes ({self.lines:,} lines) to {self.name}{shown}"


@contextlib.contextmanager
def undumpable() -> Iterator[None]:
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


class Child:
    """The supervisor, the builder and the runner below it, the pipes to them, and their drained
    output; what the supervisor said (``said``)."""

    def __init__(self, request: bytes) -> None:
        self.spawned = spawned = take()  # started early by ``gptblock check``, or now
        self.pipes = {name: (to, Reader(fro)) for name, (to, fro) in spawned.pipes.items()}
        self.said, self.eof = b"", False
        self.outputs = [_Output("stdout"), _Output("stderr")]
        self.threads = [
            threading.Thread(target=o.drain, args=(os.fdopen(fd, "rb"),), daemon=True)
            for o, fd in zip(self.outputs, (spawned.out_r, spawned.err_r), strict=True)
        ]
        for t in self.threads:
            t.start()
        self.id, self.index, self.synced, self.dropout = 0, 0, False, False
        self.shape: dict[str, Any] = {}
        self.deadline = time.monotonic() + STARTUP_LIMIT
        for to_fd, _ in self.pipes.values():
            with contextlib.suppress(BrokenPipeError):
                send(to_fd, {"init": request.hex()})

    def ready(self) -> None:
        """Wait for both processes to say they are ready (torch and their code imported)."""
        for name in self.pipes:
            self.answer(name, 0)

    def call(self, op: str, tensors: dict[str, torch.Tensor] | None = None, **args: Any) -> Answer:
        """One request's answer; a block error as ``Raised``, a target's as its ``UserError``."""
        if op == "build":
            said, _ = self._ask("builder", op, None, **args)
            if said.get("none") is not True:
                recipe = said.pop("recipe", None)
                self._ask("runner", op, None, index=self.index, recipe=recipe)
                self.synced = self.dropout = False
            return said, {}
        if op in ("load", "width", "read", "suggest"):
            self.index = int(args.get("index", self.index))
            if op in ("read", "suggest"):  # on the builder's copy, made as the runner's is
                if not self.synced:
                    self._ask("builder", "copy", None, **self.shape)
                    if self.dropout:
                        self._ask("builder", "dropout_off", None)
                    self.synced = True
                self._ask("builder", "set", self._ask("runner", "parameters", None)[1])
            return self._ask("builder", op, tensors, **args)
        if op == "copy":
            self.shape = args
        self.dropout = self.dropout or op == "dropout_off"
        return self._ask("runner", op, tensors, **args)

    def _ask(
        self, name: str, op: str, tensors: dict[str, torch.Tensor] | None, **args: Any
    ) -> Answer:
        self.id += 1
        with contextlib.suppress(BrokenPipeError):  # it died: reading says how
            send(self.pipes[name][0], {"id": self.id, "op": op, **args}, tensors)
        return self.answer(name, self.id)

    def answer(self, name: str, wanted: int) -> Answer:
        try:
            header, tensors = self.pipes[name][1].next(self.deadline)
        except TimeoutError:
            raise Gone("timeout") from None
        except EOFError:
            raise Gone(self.ended(name)) from None
        except ValueError as e:
            raise Gone(f"broke the checker's protocol ({one_line(e)})") from None
        if header.get("id") != wanted:
            raise Gone("broke the checker's protocol (an answer to no request)")
        if isinstance(header.get("ok"), dict):
            return header["ok"], tensors
        if "user_error" in header:
            cls = getattr(errors, str(header["user_error"]), None)
            if not (isinstance(cls, type) and issubclass(cls, errors.UserError)):
                cls = errors.UserValueError
            raise cls(text(header.get("message", ""), 2000))
        if "raised" in header:
            raised = Raised(text(header["raised"], 400))
            raised.where = text(header.get("where", ""), 600)  # type: ignore[attr-defined]
            raise raised
        raise Gone("broke the checker's protocol (an answer of no known kind)")

    def _status(self, timeout: float) -> None:
        """What the supervisor says (``supervisor PID``, ``pid NAME PID``, ``exit NAME RC``) until
        it ends, after closing its stdin (its signal to stop the jobs and sweep)."""
        with contextlib.suppress(OSError):
            self.spawned.stdin.close()
        out, deadline = self.spawned.stdout, time.monotonic() + timeout
        while not self.eof and (left := deadline - time.monotonic()) > 0:
            if select.select([out], [], [], min(left, 0.5))[0]:
                chunk = os.read(out.fileno(), 4096)
                self.said, self.eof = self.said + chunk, not chunk
            else:  # without a PID namespace, the block may have stopped it: it must sweep
                self._signal(signal.SIGCONT)

    def _signal(self, number: int) -> None:
        """Send the supervisor (by the pid it said) signal ``number``."""
        if found := re.search(rb"^supervisor (\d+)$", self.said, re.M):
            with contextlib.suppress(OSError):
                os.kill(int(found[1]), number)

    def ended(self, name: str) -> str:
        """How the builder or the runner ended, as their supervisor saw it."""
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
        """Stop the jobs and everything below them (the supervisor sweeps), and the drains."""
        self._status(30)
        if not self.eof:  # it hangs: the supervisor, at least (not our child: by its pid)
            self._signal(signal.SIGKILL)
        for fd in (fd for to_fd, reader in self.pipes.values() for fd in (to_fd, reader.fd)):
            with contextlib.suppress(OSError):
                os.close(fd)
        for t in self.threads:
            t.join(timeout=5)
        self.spawned.stdout.close()
