"""The block built and read where it runs (``Served``), answering in this process (``InProcess``,
for ``isolate=False``) or in the builder process (``main``; it also sends each build's ``recipe``
for the runner). The builder imports gptblock, so the block could tell it is checked there:
nothing it says decides the verdict.

Shapes: B batch, T time, C channels.
"""

from __future__ import annotations

import contextlib
import pickle
import sys
from collections.abc import Mapping
from functools import partial
from typing import Any

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
from ..roles.readings import TRACE_T, Readings, Traces, read_parts, trace_shapes
from ..roles.suggest import suggest_map
from ..roles.trace import NoDropout, Trace, record
from ..serve.loop import drive_cache
from ..serve.runner import Held, Runner, serve, to_data

__all__ = ["PROBE_T", "InProcess", "Served", "main", "modern_answer", "plain_readings"]

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

    trusted = True  # in the checker's own process: what this object says is what the block did

    def __init__(self, module: nn.Module, kwargs: Mapping[str, object]) -> None:
        super().__init__(module)
        self.kwargs = kwargs

    def width(self) -> tuple[int, int]:
        """(C, T): the block's width and the probes' length; ``longest`` set (0: unknown)."""
        self.longest = max_length(self.module, self.kwargs, 0)
        self.T = min(PROBE_T, self.longest or PROBE_T)
        self.C = width(self.module, self.kwargs, self.T)
        return self.C, self.T

    def read(self, roles: Mapping[str, str]) -> Answer:
        """The block's parts as numbers (``plain``), or why they cannot be read (``"why"``)."""
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

    def modern(self) -> dict[str, Any]:
        B, T = trace_shapes(max_length(self.module, self.kwargs, TRACE_T))[0]
        s = self.subject
        source = Source(self.traces, lambda x: s.module(x.clone()), partial(drive_cache, s.module))
        with NoDropout() if s.no_dropout else contextlib.nullcontext():
            outcome = check_modern(source, self.traces.input(B, T))
        return modern_answer(outcome, self.traces.last)

    def suggest(self) -> str:
        return suggest_map(self.subject.module, self.C)

    def answer(self, op: str, args: Mapping[str, Any], tensors: Mapping[str, Tensor]) -> Answer:
        if op == "width":
            C, T = self.width()
            return {"C": C, "T": T, "longest": self.longest}, {}
        if op == "read":
            return self.read(args["roles"])
        if op == "suggest":
            return {"map": self.suggest()}, {}
        return super().answer(op, args, tensors)  # copy, set, dropout_off: read as the runner


def plain_readings(found: Readings, params: list[Tensor], notes: list[str]) -> Answer:
    """``found``'s parts as numbers (``plain.to_plain``), each with its description, as
    ``Served.read`` answers; ``params``: the block's parameters."""
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
    """The modern comparison's outcome as plain data; for the lessons' block (None), what its
    attention computes that the references do not model, read from the ``last`` forward pass."""
    if outcome is None:
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


class InProcess(Runner):
    """A child's answers (a ``Call``) made in this process, for code the caller trusts; ``decide``
    then asks its ``held`` block directly. Its last build's module settings stay set until ``undo``."""

    def __init__(
        self, target: object, kwargs: Mapping[str, object], targets: list[Any] | None = None
    ) -> None:
        super().__init__({"targets": targets or []})
        self.target, self.kwargs = target, kwargs

    def __call__(self, op: str, tensors: Mapping[str, Tensor] | None = None, **args: Any) -> Answer:
        return self.answer(op, args, tensors or {})

    def build(self, op: str, args: Mapping[str, Any]) -> Answer:
        other = bool(args.get("other"))
        built = build_at(self.target, self.kwargs, other)
        if built is None:
            return {"none": True}, {}
        self.undo, self.args = built.undo, built.args
        self.held = Served(built.module, built.args if other else self.kwargs)
        told = {"description": built.description, "label": built.label, "notes": built.notes}
        return {**told, "width": built.width}, {}


class _Builder(InProcess):
    def __init__(self, request: dict[str, Any]) -> None:
        super().__init__(None, request["kwargs"], request["targets"])

    def build(self, op: str, args: Mapping[str, Any]) -> Answer:
        if op == "load":
            target = self.targets[int(args["index"])]
            if isinstance(target, str):
                self.target = load_target(target)
                return {}, {}
            try:
                self.target = pickle.loads(target)
            except CAUGHT as e:
                raise UserValueError(
                    f"cannot load the target in the child process: {one_line(e)}"
                ) from e
            return {}, {}
        said, _ = super().build(op, args)
        if said.get("none"):
            return said, {}
        home = sys.modules.get(getattr(self.target, "__module__", None) or "")
        changed: dict[str, object] = {}
        if home is not None:
            # the module settings the build changed, kept set, read by difference from undo's
            built = dict(vars(home))
            self.undo()
            restored = dict(vars(home))
            changed = {n: v for n, v in built.items() if n in restored and restored[n] is not v}
            vars(home).update(changed)
            self.undo = lambda: vars(home).update({n: restored[n] for n in changed})
        try:
            settings = {n: to_data(v, home) for n, v in changed.items()}
            said["recipe"] = {"settings": settings, "args": to_data(self.args, home)}
        except ValueError as e:
            raise UserValueError(
                f"cannot send {said['description']}'s arguments or module settings to a fresh "
                f"process: {e}"
            ) from e
        return said, {}


def main(argv: list[str]) -> int:
    """The builder: ``IN_FD OUT_FD``."""
    return serve(argv, _Builder, (UserError,))
