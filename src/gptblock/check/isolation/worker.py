"""The block built and read where it runs (``Served``), and the builder process that serves it.

``Served`` is a ``runner.Held`` that also tells the block's width, reads its parts into numbers
(``roles.plain``) and suggests a ``--map``: in the checker's own process for
``check_block(..., isolate=False)``, else in the builder. The builder (``main``) answers ``load``
target i, ``build`` it (at the file's sizes or ``other`` ones, sending its ``recipe`` as data for
the runner to build it again), ``width``, ``read`` by names (on a ``copy`` given the runner's
parameters) and ``suggest``. It imports gptblock, so the block could tell it is checked here:
nothing it says decides the verdict.

Shapes: B batch, T time, C channels.
"""

from __future__ import annotations

import contextlib
import pickle
import sys
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, cast

import torch
import torch.nn as nn

from ...errors import UserError, UserValueError
from ..building.build import build_at, max_length, width
from ..building.target import load_target
from ..compare.modern import ModernOutcome, check_modern
from ..mistakes.report import CAUGHT, one_line
from ..roles.modern_read import Source
from ..roles.modern_scope import attention_scope
from ..roles.plain import NotPlain, to_plain
from ..roles.readings import TRACE_T, Readings, Traces, read_parts, suggest_map, trace_shapes
from ..roles.trace import NoDropout, Trace, record
from ..serve.loop import drive_cache
from ..serve.runner import Held, Runner, serve, to_data

__all__ = ["PROBE_T", "Served", "main", "modern_answer", "plain_readings"]

Tensor = torch.Tensor
Answer = tuple[dict[str, Any], dict[str, Tensor]]
PROBE_T = 6  # sequence length (and batch size) of the probes, at most the block's block_size


class Served(Held):
    """A built block and the answers the checker gets from it (``runner.Held``'s, and
    reading); ``kwargs``, its constructor arguments, may say its width and longest sequence.

    Example:
        >>> from gptblock import lesson
        >>> served = Served(lesson.Block(16, 2, 8), {})
        >>> served.width(), served.copy()["dtype"]
        ((16, 6), 'float64')
    """

    def __init__(self, module: nn.Module, kwargs: Mapping[str, object]) -> None:
        super().__init__(module)
        self.kwargs = kwargs

    def width(self) -> tuple[int, int]:
        """(C, T): the block's width, and the probes' sequence length (``longest``: its longest
        sequence, 0 if nothing tells)."""
        self.longest = max_length(self.module, self.kwargs, 0)
        self.T = min(PROBE_T, self.longest or PROBE_T)
        self.C = width(self.module, self.kwargs, self.T)
        return self.C, self.T

    def read(self, roles: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, Tensor]]:
        """The block's parts as numbers (``plain``), or why they cannot be read (``"why"``).

        Raises:
            UserValueError: a given role names nothing the block has.
        """
        notes: list[str] = []
        longest = max_length(self.module, self.kwargs, TRACE_T)
        found = read_parts(self.subject, self.traces, roles, longest, notes)
        if isinstance(found, str):
            return {"why": found, "notes": notes}, {}
        return plain_readings(found, list(self.subject.module.parameters()), notes)

    def copy(self) -> dict[str, Any]:
        """``Held.copy``, and the copy's forward passes recorded once per input (``Traces``)."""
        told = super().copy()
        s = self.subject
        self.traces = Traces(s, lambda x: record(s.module, x, no_dropout=s.no_dropout))
        return told

    def set_parameters(self, values: Mapping[str, Tensor]) -> None:
        super().set_parameters(values)
        self.traces.clear()  # recorded with the weights before

    def dropout_off(self) -> str:
        how = super().dropout_off()
        self.traces.clear()
        return how

    trusted = True  # in the checker's own process: what this object says is what the block did

    def modern(self) -> dict[str, Any]:
        """The modern comparison (``compare.modern``) as plain data (``modern_answer``)."""
        B, T = trace_shapes(max_length(self.module, self.kwargs, TRACE_T))[0]
        s = self.subject
        source = Source(self.traces, lambda x: s.module(x.clone()), partial(drive_cache, s.module))
        with NoDropout() if s.no_dropout else contextlib.nullcontext():
            outcome = check_modern(source, self.traces.input(B, T))
        return modern_answer(outcome, self.traces.last)

    def suggest(self) -> str:
        """The ``--map`` arguments that would let the checker read the block, or ``""``."""
        return suggest_map(self.subject.module, self.C)

    def answer(self, op: str, args: Mapping[str, Any], tensors: Mapping[str, Tensor]) -> Answer:
        """``runner.Held``'s answers, and the builder's: ``width``, ``read``, ``suggest``."""
        if op == "width":
            C, T = self.width()
            return {"C": C, "T": T, "longest": self.longest}, {}
        if op == "read":
            return self.read(args["roles"])
        if op == "suggest":
            return {"map": self.suggest()}, {}
        return super().answer(op, args, tensors)  # copy, set, dropout_off: read as the runner


def plain_readings(
    found: Readings, params: list[Tensor], notes: list[str]
) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """``found``'s parts as numbers (``plain.to_plain``), as ``Served.read`` answers: each
    reading that can be read so, with its description; ``params``: the block's parameters."""
    own = [p.detach().flatten().to(torch.float64).cpu() for p in params]
    known = torch.cat(own).sort().values if own else None
    tensors: dict[str, Tensor] = {"x": found.x}
    parts: list[dict[str, Any]] = []
    describe: list[str] = []
    readings, missed = 0, ""
    for i, p in enumerate([*found.readings, *found.fallback]):
        try:
            meta, read = to_plain(p, found.x, str(len(parts)), known)
        except CAUGHT as e:  # a part of the block's own code refused the probe
            missed = missed or (str(e) if isinstance(e, NotPlain) else one_line(e))
            continue
        parts.append(meta)
        tensors.update(read)
        describe.append(found.describe(i))
        readings += i < len(found.readings)
    if not parts:
        return {"why": f"its parts cannot be read as numbers: {missed}", "notes": notes}, {}
    meta = {"parts": parts, "readings": readings, "heads": list(found.heads), "describe": describe}
    return {**meta, "notes": notes}, tensors


def modern_answer(outcome: ModernOutcome | None, last: Trace | None) -> dict[str, Any]:
    """The modern comparison's outcome as plain data; for the lessons' block, ``{}``, or
    ``{"scope": [...]}`` naming what its attention computes that the references do not model,
    read from the forward pass the comparison read last (``last``), for the verdict should no
    variant match it."""
    if outcome is None:  # the lessons' block: what the references do not model in it
        scope = attention_scope(last) if last is not None else []
        return {"scope": scope} if scope else {}
    f = outcome.finding
    return {
        "notes": list(outcome.notes),
        "finding": None if f is None else [f.name, f.passed, f.message, f.label],
        "mistakes": list(outcome.mistakes),
        "details": dict(outcome.details),
        "alternatives": [list(a) for a in outcome.alternatives],
        "parts": outcome.parts[0] if outcome.parts else None,  # a PASS's, for the checker
        "tensors": outcome.parts[1] if outcome.parts else {},
    }


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


def _load(target: str | bytes) -> object:
    if isinstance(target, str):
        return load_target(target)
    try:
        return pickle.loads(target)
    except CAUGHT as e:
        raise UserValueError(f"cannot load the target in the child process: {one_line(e)}") from e


class _Builder(Runner):
    def __init__(self, request: dict[str, Any]) -> None:
        super().__init__(request)
        self.kwargs, self.target = request["kwargs"], cast(object, None)

    def build(self, op: str, args: Mapping[str, Any]) -> Answer:
        if op == "load":
            self.target = _load(self.targets[int(args["index"])])
            return {}, {}
        other = bool(args.get("other"))
        built = build_at(self.target, self.kwargs, other)
        if built is None:
            return {"none": True}, {}
        self.undo, settings = _settings(self.target, built.undo)
        self.held = Served(built.module, built.args if other else self.kwargs)
        home = sys.modules.get(getattr(self.target, "__module__", None) or "")
        try:
            recipe = {"settings": settings, "args": to_data(built.args, home)}
        except ValueError as e:
            raise UserValueError(
                f"cannot send {built.description}'s arguments to a fresh process: {e}"
            ) from e
        told = {"description": built.description, "label": built.label, "recipe": recipe}
        return {**told, "notes": built.notes, "width": built.width}, {}


def main(argv: list[str] | None = None) -> int:
    """The builder: ``IN_FD OUT_FD``."""
    return serve(sys.argv[1:] if argv is None else argv, _Builder, (UserError,))


if __name__ == "__main__":
    sys.exit(main())
