"""The child process of ``gptblock.check.isolation``: the user's block, answering requests.

Run as this module with the arguments ``IN_FD OUT_FD`` (under ``gptblock.check.reaper``, from a
script with a neutral name): it reads the targets and constructor arguments (pickled: they come
from the checker), says it is ready, then answers one request after another
(``gptblock.check.frames``: JSON and tensors, never pickle) on OUT_FD: ``load`` target i,
``build`` it (at the file's sizes, or at ``other`` ones: ``build.build_at``), tell its
``width`` and ``longest`` sequence, make the checker's ``copy``, ``forward`` an input (in eval
or ``train`` mode), run ``grads``, ``dropout_off``, ``record`` a forward pass (``loop.record``,
in eval mode), drive its ``cache`` (``loop.drive_cache``), ``read`` its parts by names (with
``--map``, or where the dataflow the checker reads from the traces shows no roles), ``suggest``
a ``--map``. It computes no check and no verdict: the checker does, from these answers, and
trusts none of them. An error the block raises is an answer too (``raised``); a target that
cannot be loaded or built is a ``user_error`` (the ``UserError``'s class and message). stdout
and stderr are the block's: the checker only counts them.
"""

from __future__ import annotations

import os
import pickle
import sys
import traceback
from collections.abc import Callable
from typing import Any

import torch

from ..errors import UserError, UserValueError
from .build import build_at
from .frames import Reader, send
from .loop import drive_cache, record
from .report import CAUGHT, one_line
from .served import Served
from .subject import one_thread
from .target import load_target

__all__ = ["main"]

Tensor = torch.Tensor
Answer = tuple[dict[str, Any], dict[str, Tensor]]


def _load(target: str | bytes) -> object:
    if isinstance(target, str):
        return load_target(target)
    try:
        return pickle.loads(target)
    except CAUGHT as e:
        raise UserValueError(f"cannot load the target in the child process: {one_line(e)}") from e


class _Worker:
    def __init__(self, request: dict[str, Any]) -> None:
        self.targets, self.kwargs = request["targets"], request["kwargs"]
        self.target: object = None
        self.served: Served | None = None
        self.undo: Callable[[], None] = lambda: None  # the module settings a build changed

    def answer(self, op: str, args: dict[str, Any], tensors: dict[str, Tensor]) -> Answer:
        if op in ("load", "build"):
            self.undo()
            self.undo, self.served = lambda: None, None
        if op == "load":
            self.target = _load(self.targets[int(args["index"])])
            return {}, {}
        if op == "build":
            other = bool(args.get("other"))
            built = build_at(self.target, self.kwargs, other)
            if built is None:
                return {"none": True}, {}
            self.undo = built.undo
            self.served = Served(built.module, built.args if other else self.kwargs)
            told = {"description": built.description, "label": built.label}
            return {**told, "notes": built.notes, "width": built.width}, {}
        served = self.served
        if served is None:
            raise RuntimeError(f"{op} before build")
        if op == "width":
            C, T = served.width()
            return {"C": C, "T": T, "longest": served.longest}, {}
        if op == "copy":
            return served.copy(), {}
        s = served.subject
        if op == "forward":
            x, train = tensors["x"].to(s.device), bool(args.get("train", False))
            return _output(s, s(x, seeded=bool(args["seeded"]), train=train))
        if op == "grads":
            x, w = tensors["x"].to(s.device), tensors["weights"].to(s.device)
            got = s.grads(x, w, inputs=bool(args["inputs"]))
            found = {f"g{i}": g for i, g in enumerate(got.grads) if g is not None}
            found.update({"input": got.input} if got.input is not None else {})
            meta = {"names": got.names, "failed": got.failed, "message": got.message}
            return meta, found
        if op == "parameters":
            values = served.parameters()
            return {"names": list(values)}, values
        if op == "set":
            served.set_parameters(tensors)
            return {}, {}
        if op == "dropout_off":
            return {"how": served.dropout_off()}, {}
        if op == "record":
            return record(s.module, tensors["x"].to(s.device), no_dropout=s.no_dropout)
        if op == "read":
            return served.read(args["roles"])
        if op == "suggest":
            return {"map": served.suggest()}, {}
        if op == "cache":
            return drive_cache(s.module, tensors["x"].to(s.device), no_dropout=s.no_dropout)
        raise RuntimeError(f"unknown request {op!r}")


def _output(s: Any, y: Tensor) -> Answer:
    meta = {"shape": list(y.shape), "dtype": str(y.dtype).removeprefix("torch.")}
    if y.device != s.device:
        return {**meta, "device": str(y.device)}, {}
    return {**meta, "device": "same"}, {"y": y}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    in_fd, out_fd = int(argv[0]), int(argv[1])
    for fd in (in_fd, out_fd):
        os.set_inheritable(fd, False)  # not passed on to processes the block starts
    reader = Reader(in_fd)
    header, _ = reader.next()
    request = pickle.loads(bytes.fromhex(header["init"]))
    worker = _Worker(request)
    send(out_fd, {"id": 0, "ok": {"ready": True}})
    with one_thread():
        while True:
            try:
                header, tensors = reader.next()
            except EOFError:
                return 0
            reply: dict[str, Any] = {"id": header.get("id")}
            found: dict[str, Tensor] = {}
            try:
                ok, found = worker.answer(str(header.get("op")), header, tensors)
                reply["ok"] = ok
            except UserError as e:
                reply.update(user_error=type(e).__name__, message=str(e))
            except CAUGHT as e:
                where = " ".join(w.strip() for w in traceback.format_exception(e)[-3:])
                reply.update(raised=one_line(e), where=where)
            send(out_fd, reply, found)


if __name__ == "__main__":
    sys.exit(main())
