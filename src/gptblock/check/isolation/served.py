"""The block, where it runs: everything the checker asks of it, answered as plain data.

``Served`` holds the user's block (built, copied, its weights perturbed) and answers the
checker's requests: its width, its parts read into numbers (``gptblock.check.roles.plain``), a
suggested ``--map``, and (``runner.Held``) an output for an input, the gradients of a backward
pass, its dropout switched off. ``gptblock check`` runs a ``Served`` in the builder process
(``gptblock.check.isolation.worker``) for the width and the readings by names, and a ``Held`` in the
runner (``gptblock.check.serve.runner``) for the answers that decide the verdict, and treats every
answer as a claim to check; ``check_block(..., isolate=False)`` runs a ``Served`` in the
checker's own process, for code the caller trusts.

Shapes: B batch, T time, C channels.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn as nn

from ..building.build import max_length, width
from ..compare.modern import ModernOutcome, check_modern
from ..mistakes.report import CAUGHT, one_line
from ..roles.modern_scope import attention_scope
from ..roles.plain import NotPlain, to_plain
from ..roles.readings import TRACE_T, Readings, read_parts, trace_shapes
from ..roles.suggest import suggest_map
from ..roles.trace import NoDropout, Trace
from ..serve.runner import Held

__all__ = ["PROBE_T", "Served", "modern_answer", "plain_readings"]

Tensor = torch.Tensor
PROBE_T = 6  # sequence length (and batch size) of the probes, at most the block's block_size


class Served(Held):
    """A built block and the answers the checker gets from it (``runner.Held``'s, and reading).

    Args:
        module: the user's block (never changed: the checks run on a copy).
        kwargs: its constructor arguments (they may say its width and longest sequence).

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
        found = read_parts(
            self.subject, roles, max_length(self.module, self.kwargs, TRACE_T), notes
        )
        if isinstance(found, str):
            return {"why": found, "notes": notes}, {}
        own = [
            p.detach().flatten().to(torch.float64).cpu() for p in self.subject.module.parameters()
        ]
        return plain_readings(found, torch.cat(own).sort().values if own else None, notes)

    trusted = True  # in the checker's own process: what this object says is what the block did

    def modern(self) -> dict[str, Any]:
        """The modern comparison (``gptblock.check.compare.modern``) as plain data: notes, the finding
        (None: out of scope, not compared), the mistakes it names, their accounts and the
        alternatives; for a block read as the lessons' block, ``{}``, or ``{"scope": [...]}``
        naming what its attention computes that the references do not model
        (``modern_scope.attention_scope``), for the verdict should no variant match it."""
        B, T = trace_shapes(max_length(self.module, self.kwargs, TRACE_T))[0]
        x = self.subject.input(B, T, self.C)
        seen: list[Trace] = []
        with NoDropout() if self.subject.no_dropout else contextlib.nullcontext():
            outcome = check_modern(self.subject.module, x, seen)
        return modern_answer(outcome, seen)

    def suggest(self) -> str:
        """The ``--map`` arguments that would let the checker read the block, or ``""``."""
        return suggest_map(self.subject.module, self.C)


def plain_readings(
    found: Readings, known: Tensor | None, notes: list[str]
) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """``found``'s parts as numbers (``plain.to_plain``), as ``Served.read`` answers: each
    reading that can be read so, with its description; ``known``: the block's parameter
    values, sorted (float64)."""
    x = found.x
    tensors: dict[str, Tensor] = {"x": x}
    parts: list[dict[str, Any]] = []
    describe: list[str] = []
    heads = list(found.heads)
    kept = {"readings": 0, "fallback": 0}
    whole = [
        *(("readings", p) for p in found.readings),
        *(("fallback", p) for p in found.fallback),
    ]
    missed = ""
    for i, (kind, p) in enumerate(whole):
        try:
            meta, read = to_plain(p, x, str(len(parts)), known)
        except CAUGHT as e:  # a part of the block's own code refused the probe
            missed = missed or (str(e) if isinstance(e, NotPlain) else one_line(e))
            continue
        parts.append(meta)
        tensors.update(read)
        describe.append(found.describe(i))
        kept[kind] += 1
    if not parts:
        return {"why": f"its parts cannot be read as numbers: {missed}", "notes": notes}, {}
    meta = {"parts": parts, "readings": kept["readings"], "heads": heads, "describe": describe}
    return {**meta, "notes": notes}, tensors


def modern_answer(outcome: ModernOutcome | None, seen: list[Trace]) -> dict[str, Any]:
    """The modern comparison's outcome as plain data (``Served.modern``'s answer); for the
    lessons' block, ``{}``, or ``{"scope": [...]}`` naming what its attention computes that the
    references do not model, read from the last forward pass the comparison kept (``seen``)."""
    if outcome is None:  # the lessons' block: what the references do not model in it
        scope = attention_scope(seen[-1]) if seen else []
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
