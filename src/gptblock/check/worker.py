"""The child process of ``gptblock.check.isolation``: load, build and check blocks, and say so.

Run as ``python -m gptblock.check.worker FD``: it reads one pickled request from stdin (the
nonce, the targets, the constructor arguments, the roles), then writes one JSON line per event
to file descriptor ``FD``, each carrying the nonce: ``target`` (starting target i), ``stage``,
``built`` (the target's description), ``finding``, ``report``, ``user_error`` (the target cannot
be loaded or built: the ``UserError``'s class and message), ``failed`` (the checker raised) and
``done``. stdout and stderr are the block's: the parent only counts them.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import traceback
from typing import Any

from ..errors import UserError, UserValueError
from .report import CAUGHT, Finding, one_line
from .run import check_in_process
from .target import load_target

__all__ = ["main"]


class _Channel:
    """The events, as JSON lines on the parent's pipe."""

    def __init__(self, fd: int, nonce: str) -> None:
        self.fd, self.nonce = fd, nonce
        os.set_inheritable(fd, False)  # not passed on to processes the block starts

    def send(self, event: str, **data: Any) -> None:
        line = (json.dumps({"nonce": self.nonce, "event": event, **data}) + "\n").encode()
        while line:
            line = line[os.write(self.fd, line) :]

    # the run.Progress protocol
    def stage(self, what: str) -> None:
        self.send("stage", what=what)

    def built(self, description: str) -> None:
        self.send("built", description=description)

    def finding(self, finding: Finding) -> None:
        self.send("finding", finding=vars(finding))


def _load(target: str | bytes) -> object:
    if isinstance(target, str):
        return load_target(target)
    try:
        return pickle.loads(target)
    except CAUGHT as e:
        raise UserValueError(f"cannot load the target in the child process: {one_line(e)}") from e


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    request = pickle.loads(sys.stdin.buffer.read())
    channel = _Channel(int(argv[0]), request["nonce"])
    for i, target in enumerate(request["targets"]):
        channel.send("target", index=i)
        try:
            report = check_in_process(
                _load(target), request["kwargs"], request["roles"], progress=channel
            )
        except UserError as e:
            channel.send("user_error", type=type(e).__name__, message=str(e))
            return 0
        except CAUGHT as e:
            where = traceback.format_exception(e)[-3:]
            channel.send("failed", message=one_line(e), where=" ".join(w.strip() for w in where))
            continue
        channel.send("report", report=report.to_dict())
    channel.send("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
