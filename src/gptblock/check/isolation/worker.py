"""The builder: the process that loads and builds the learner's block and says how.

Run by the supervisor (``reaper``) as ``main([IN_FD, OUT_FD])``, in a process forked after
torch was imported: it reads the targets and constructor arguments (pickled: they come from the
checker), says it is ready, then answers one request after another (``gptblock.check.serve.frames``:
JSON and tensors, never pickle): ``load`` target i, ``build`` it (at the file's sizes, or at
``other`` ones: ``build.build_at``) and say what it built with as data (``recipe``: the
arguments, a config object as its fields, the module settings the build changed), tell its
``width`` and ``longest`` sequence, ``read`` its parts by names (with ``--map``, or where the
dataflow the checker reads from the runner's traces shows no roles: on a ``copy`` given the
runner's parameters, ``set``), ``suggest`` a ``--map``. This process imports gptblock, so the
block could tell it is checked here: nothing it says decides the verdict. The runner
(``gptblock.check.serve.runner``) builds the block again from the recipe and answers everything that
does; the checker treats the builder's readings as claims, confirmed on the runner's outputs.
An error the block raises is an answer too (``raised``); a target that cannot be loaded or built
is a ``user_error`` (the ``UserError``'s class and message). stdout and stderr are the block's:
the checker only counts them.
"""

from __future__ import annotations

import pickle
import sys
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ...errors import UserError, UserValueError
from ..building.build import build_at
from ..building.target import load_target
from ..mistakes.report import CAUGHT, one_line
from ..serve.runner import serve, to_data
from .served import Served

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


def _settings(
    target: object, undo: Callable[[], None]
) -> tuple[Callable[[], None], dict[str, Any]]:
    """The module settings a build changed (those its ``undo`` restores), kept set, as data;
    and their undo. Read by difference, whatever set them (``sizes.patch_globals``)."""
    home = sys.modules.get(getattr(target, "__module__", None) or "")
    if home is None:
        return undo, {}
    built = dict(vars(home))
    undo()
    restored = dict(vars(home))
    changed = {n: v for n, v in built.items() if n in restored and restored[n] is not v}
    for n, v in changed.items():
        setattr(home, n, v)

    def again() -> None:
        for n in changed:
            setattr(home, n, restored[n])

    try:
        return again, {n: to_data(v, home) for n, v in changed.items()}
    except ValueError as e:
        again()
        raise UserValueError(f"cannot send a module setting to a fresh process: {e}") from e


class _Builder:
    def __init__(self, request: dict[str, Any]) -> None:
        self.targets, self.kwargs = request["targets"], request["kwargs"]
        self.target: object = None
        self.served: Served | None = None
        self.undo: Callable[[], None] = lambda: None  # the module settings a build changed

    def answer(self, op: str, args: Mapping[str, Any], tensors: Mapping[str, Tensor]) -> Answer:
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
            self.undo, settings = _settings(self.target, built.undo)
            self.served = Served(built.module, built.args if other else self.kwargs)
            home = sys.modules.get(getattr(self.target, "__module__", None) or "")
            try:
                recipe = {"settings": settings, "args": to_data(built.args, home)}
            except ValueError as e:
                raise UserValueError(
                    f"cannot send {built.description}'s arguments to a fresh process: {e}"
                ) from e
            told = {"description": built.description, "label": built.label, "recipe": recipe}
            return {**told, "notes": built.notes, "width": built.width}, {}
        served = self.served
        if served is None:
            raise RuntimeError(f"{op} before build")
        if op == "width":
            C, T = served.width()
            return {"C": C, "T": T, "longest": served.longest}, {}
        if op == "read":
            return served.read(args["roles"])
        if op == "suggest":
            return {"map": served.suggest()}, {}
        return served.answer(op, args, tensors)  # copy, set, dropout_off: to read as the runner


def main(argv: list[str] | None = None) -> int:
    """The builder: ``IN_FD OUT_FD``."""
    return serve(sys.argv[1:] if argv is None else argv, _Builder, (UserError,))


if __name__ == "__main__":
    sys.exit(main())
