"""The block built and read where it runs (``Served``: here for ``isolate=False``, or in the
builder process, ``main``: nothing it says decides the verdict); and the checker's view of a
block (``Remote``), whose answers are claims. docs/checker.md, "What the block can still tell"."""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager as ContextManager
from typing import Any

import torch

from ...errors import UserError, UserValueError
from ..building.build import build_at, max_length, width
from ..building.target import load_target
from ..compare.conditions import MAX_T, UNKNOWN_T
from ..compare.modern import Compared, check_modern
from ..mistakes.report import CAUGHT, one_line, text
from ..roles import readings
from ..roles.modern_read import Source
from ..roles.plain import NotPlain, to_plain
from ..roles.scope import attention_scope
from ..roles.trace import Trace, from_plain, record
from ..serve import runner
from ..serve.loop import Message
from ..serve.runner import Held, load, to_data
from ..serve.script import as_script
from ..serve.subject import Grads, Probed
from .child import ProtocolBroken

__all__ = ["Call", "Remote", "Served", "main"]

Tensor = torch.Tensor
Call = Callable[..., Message]  # call(op, tensors=None, **args): one request's answer
PROBE_T = 6  # sequence length (and batch size) of the probes, at most the block's block_size


class Served(Held):
    """``runner.Held``'s answers and ``width``, ``read``, ``suggest``; in the builder, each build
    also says its ``recipe``. The last build's module settings stay set until ``undo``."""

    refused = (UserError,)

    def __init__(
        self, target: object, kwargs: Mapping[str, object], targets: Sequence[str | bytes] = ()
    ):
        super().__init__({"targets": targets})
        self.target, self.kwargs, self.sized = target, kwargs, kwargs

    def __call__(self, op: str, tensors: dict[str, Tensor] | None = None, **args: Any) -> Message:
        return self.answer(op, args, tensors or {})

    def answer(self, op: str, args: Mapping[str, Any], tensors: Mapping[str, Tensor]) -> Message:
        if op == "width":  # the block's width and the probes' length; longest 0: unknown
            self.longest = max_length(self.module, self.sized, 0, self.target)
            self.T = min(PROBE_T, self.longest or PROBE_T)
            self.C = width(self.module, self.sized, self.T)
            return {"C": self.C, "T": self.T, "longest": self.longest}, {}
        if op == "read":
            return self.read(args["roles"])
        if op == "suggest":
            return {"map": readings.suggest_map(self.subject.module, self.C)}, {}
        told = super().answer(op, args, tensors)
        if op == "copy":  # its forward passes recorded once per input (``Remote`` clears them)
            s = self.subject
            self.traces = readings.Traces(s, lambda x: record(s.module, x, no_dropout=s.no_dropout))
        return told

    def load(self, target: str | bytes) -> object:
        as_script(target)
        return load_target(target) if isinstance(target, str) else load(target)

    def build(self, args: Mapping[str, Any]) -> Message:
        other = bool(args.get("other"))
        built = build_at(self.target, self.kwargs, other)
        if built is None:
            return {"none": True}, {}
        self.module, self.undo = built.module, built.undo
        self.sized = built.args if other else self.kwargs
        told: dict[str, Any] = {"description": built.description, "notes": built.notes}
        if self.targets:  # in the builder: what the runner builds the block from, as data
            home = sys.modules.get(getattr(self.target, "__module__", None) or "")
            try:
                settings = {n: to_data(v, home) for n, v in built.settings.items()}
                told["recipe"] = {"settings": settings, "args": to_data(built.args, home)}
            except ValueError as e:
                raise UserValueError(
                    f"cannot send {built.description}'s arguments or module settings to a "
                    f"fresh process: {e}"
                ) from e
        return {**told, "label": built.label, "width": built.width}, {}

    def read(self, roles: Mapping[str, str]) -> Message:  # as numbers, or "why" not
        notes: list[str] = []
        longest = max_length(self.module, self.sized, readings.TRACE_T, self.target)
        found = readings.read_parts(self.subject, self.traces, roles, longest, notes)
        if isinstance(found, str):
            return {"why": found, "notes": notes}, {}
        return plain_readings(found, list(self.subject.module.parameters()), notes)


def plain_readings(found: readings.Readings, params: list[Tensor], notes: list[str]) -> Message:
    """``found``'s parts as numbers (``plain.to_plain``), each described."""
    own = [p.detach().flatten().to(torch.float64).cpu() for p in params]
    known = torch.cat(own).sort().values if own else None
    tensors: dict[str, Tensor] = {"x": found.x}
    parts, describe, counted, missed = list[dict[str, Any]](), list[str](), 0, ""
    for i, p in enumerate([*found.readings, *found.fallback]):
        try:
            meta, read = to_plain(p, found.x, str(len(parts)), known)
        except CAUGHT as e:  # a part of the block's own code refused the probe
            missed = missed or (str(e) if isinstance(e, NotPlain) else one_line(e))
            continue
        parts.append(meta)
        tensors.update(read)
        describe.append(found.describe(i))
        counted += i < len(found.readings)
    if not parts:
        return {"why": f"its parts cannot be read as numbers: {missed}", "notes": notes}, {}
    meta = {"parts": parts, "readings": counted, "heads": list(found.heads), "describe": describe}
    return {**meta, "notes": notes}, tensors


def main(argv: list[str]) -> int:
    return runner.main(argv, lambda request: Served(None, request["kwargs"], request["targets"]))


_SUGGESTION = r"(--map( [a-z0-9]+=[\w.*\[\]:,-]+)+)?"  # what suggest.suggest_map writes
MAX_NUMEL = 1 << 28  # elements of a tensor the block's process may claim to have made
DTYPES = {"float64": torch.float64, "float32": torch.float32}


class Remote(Probed):
    """``verdict``'s ``Service`` asked through ``call``: a process (claims), or a ``Served``."""

    def __init__(
        self, call: Call, C: int, T: int, name: object, note: str, longest: int = 0,
        failed: str = "",
    ) -> None:  # fmt: skip
        if str(name) not in DTYPES:
            raise ProtocolBroken(f"a copy in {text(name, 40)!r}, expected float64 or float32")
        self.call, self.C, self.T, self.note, self.longest = call, C, T, text(note), longest
        self.failed = text(failed, 400)  # what its first call raised in float64, if it did
        self.dtype = DTYPES[str(name)]
        self.here = call.subject if isinstance(call, Served) else None  # the copy, if here
        self.trusted = self.here is not None  # then what it says is what the block did
        self.device = torch.device("cpu") if self.here is None else self.here.device
        self.traces = call.traces if isinstance(call, Served) else readings.Traces(self, self.trace)
        self.generator = torch.Generator().manual_seed(0)
        self.tol = 1e-10 if self.dtype == torch.float64 else 1e-5
        self.input(T, T, C)  # the draw the copy's first call takes

    def trace(self, x: Tensor) -> Trace:  # its forward pass on ``x``, as its process says
        return from_plain(*self.call("record", {"x": x}), device=self.device)

    def __call__(self, x: Tensor, *, seeded: bool = True, train: bool = False) -> Tensor:
        meta, tensors = self.call("forward", {"x": x}, seeded=seeded, train=train)
        shape, y = meta.get("shape"), tensors.get("y")
        if not isinstance(shape, list) or not all(isinstance(n, int) and n >= 0 for n in shape):
            raise ProtocolBroken("an output without a shape")
        dtype = getattr(torch, str(meta.get("dtype")), None)
        if not isinstance(dtype, torch.dtype):
            raise ProtocolBroken(f"an unknown dtype {text(meta.get('dtype'), 40)!r}")
        if meta.get("device") != "same":  # on another device than its input: shown as meta
            if len(shape) > 8 or torch.Size(shape).numel() > MAX_NUMEL:
                raise ProtocolBroken("an output of an impossible shape")
            return torch.empty(shape, dtype=dtype, device="meta")
        if y is None or list(y.shape) != shape or y.dtype != dtype:
            raise ProtocolBroken("an output that is not what its description says")
        return y

    def own_rng(self) -> ContextManager[None]:  # in another process: its own generator
        return contextlib.nullcontext() if self.here is None else self.here.own_rng()

    def grads(self, x: Tensor, weights: Tensor, *, inputs: bool = False) -> Grads:
        meta, tensors = self.call("grads", {"x": x, "weights": weights}, inputs=inputs)
        names, failed = meta.get("names"), meta.get("failed")
        if not isinstance(names, list) or failed not in ("", "forward", "backward"):
            raise ProtocolBroken("gradients without parameter names")
        shown = [text(n, 200) for n in names]
        if failed:
            return Grads(shown, [], str(failed), text(meta.get("message", ""), 400))
        got = tensors.get("input")
        if inputs and (got is None or got.shape != x.shape):
            raise ProtocolBroken("an input gradient of the wrong shape")
        kept = text(meta.get("kept", ""), 200)
        return Grads(shown, [tensors.get(f"g{i}") for i in range(len(names))], input=got, kept=kept)

    def parameters(self) -> dict[str, Tensor]:
        meta, tensors = self.call("parameters")
        names = meta.get("names")
        if not isinstance(names, list) or set(names) != set(tensors) or len(names) > 1 << 16:
            raise ProtocolBroken("parameters without names")
        if not all(t.is_floating_point() and t.dim() <= 8 for t in tensors.values()):
            raise ProtocolBroken("parameters that are not floating-point tensors")
        return {str(n): tensors[n] for n in names}

    def set_parameters(self, values: Mapping[str, Tensor]) -> None:
        self.traces.clear()  # recorded with the weights before
        self.call("set", dict(values))

    def dropout_off(self) -> str:
        self.traces.clear()
        how = self.call("dropout_off")[0].get("how")
        if how not in ("", "switched off", "with its probability set to 0"):
            raise ProtocolBroken("an unknown way of switching dropout off")
        return str(how)

    def read(self, roles: Mapping[str, str]) -> Message:
        """From the traces' dataflow here, else as its process says (``receive`` checks it):
        ``guessed`` there without ``roles`` (by the module tree's shapes and order)."""
        found = "" if roles else readings.dataflow(self.traces, self.longest or readings.TRACE_T)
        if isinstance(found, str):
            said, tensors = self.call("read", roles=dict(roles))
            return {**said, "guessed": not roles}, tensors
        read, x = found
        parts = readings.Readings((read.parts,), (), (read.heads,), x, lambda _: read.describe())
        return plain_readings(parts, list(self.parameters().values()), [])

    def modern(self) -> Compared | list[str]:
        """The modern comparison (``compare.modern``); else what the block's attention computes
        that the references do not model (its last forward pass)."""
        source = Source(self.traces, self, self.cache)
        B, T = readings.trace_shapes(self.longest or readings.TRACE_T)[0]
        outcome = check_modern(source, self.traces.input(B, T))
        last = self.traces.last
        return outcome or (attention_scope(last) if last is not None else [])

    def cache(self, x: Tensor) -> Message:  # ``serve.cache.drive_cache``'s answer, as plain data
        return self.call("cache", {"x": x})

    def scope(self) -> list[str]:
        """What its attention computes that no reference models, at the longest sequence compared
        (a sliding window as long as the traced sequences shows only there)."""
        T = min(self.longest or UNKNOWN_T, MAX_T)
        return attention_scope(self.traces(self.traces.input(1, T)))

    def suggest(self) -> str:  # the --map arguments its process suggests, if only that
        said = text(self.call("suggest")[0].get("map", ""), 4000)
        return said if re.fullmatch(_SUGGESTION, said) else ""
