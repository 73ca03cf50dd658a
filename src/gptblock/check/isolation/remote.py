"""The checker's view of a block that runs in another process (``Remote``): its answers, as
claims, each checked for form (shapes, dtypes, lengths) before use; its text bounded. The
weights and the modern block are read here, by replaying forward passes that process records.

Shapes: B batch, T time, C channels.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager as ContextManager
from contextlib import nullcontext
from typing import Any

import torch

from ..compare.modern import check_modern
from ..mistakes.report import text
from ..roles.modern_read import Source
from ..roles.readings import TRACE_T, Readings, Traces, dataflow, trace_shapes
from ..roles.trace import from_plain
from ..serve.subject import Grads, Probed
from .worker import modern_answer, plain_readings

__all__ = ["Call", "ProtocolBroken", "Remote"]

Tensor = torch.Tensor
Call = Callable[..., tuple[dict[str, Any], dict[str, Tensor]]]
"""``call(op, tensors=None, **args)``: one request's answer, (JSON object, tensors)."""
_SUGGESTION = r"(--map( [a-z0-9]+=[\w.*\[\]:,-]+)+)?"  # what suggest.suggest_map writes
MAX_NUMEL = 1 << 28  # elements of a tensor the block's process may claim to have made
DTYPES = {"float64": torch.float64, "float32": torch.float32}


class ProtocolBroken(BaseException):  # not an Exception: no probe may catch it
    """The block's process answered something that is not an answer to the request: the check
    stops there (``isolation`` reports it), rather than counting it as the block's error."""


class Remote(Probed):
    """A block in another process, asked through ``call`` (``compare.verdict``'s ``Tested`` and
    ``Service``): its width ``C``, the probes' length ``T``, the ``name`` of the dtype it computes
    in, the ``note`` it said of its copy and its ``longest`` sequence (0: unknown), as it says."""

    device = torch.device("cpu")  # the tensors here; the block's own device is its process's
    trusted = False  # answers from the block's process: claims

    def __init__(self, call: Call, C: int, T: int, name: object, note: str, longest: int = 0):
        if str(name) not in DTYPES:
            raise ProtocolBroken(f"a copy in {text(name, 40)!r}, expected float64 or float32")
        self.call, self.C, self.T, self.note, self.longest = call, C, T, text(note), longest
        self.tested, self.dtype = self, DTYPES[str(name)]
        self.generator = torch.Generator().manual_seed(0)
        self.tol = 1e-10 if self.dtype == torch.float64 else 1e-5
        self.input(T, T, C)  # the draw the copy's first call takes in a check in-process
        record = lambda x: from_plain(*call("record", {"x": x}), device=self.device)  # noqa: E731
        self.traces = Traces(self, record)

    def __call__(self, x: Tensor, *, seeded: bool = True, train: bool = False) -> Tensor:
        """The block's output for ``x`` (in its dtype; in train mode, dropout off), as it says."""
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

    def own_rng(self) -> ContextManager[None]:
        return nullcontext()  # the block draws from its own process's generator

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
        return Grads(shown, [tensors.get(f"g{i}") for i in range(len(names))], input=got)

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

    def read(self, roles: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, Tensor]]:
        """The block's parts as numbers: read here from the dataflow of traces the block's
        process recorded, else (with roles given, or by names) as that process says (checked
        by ``receive.unpack_readings``)."""
        found = "" if roles else dataflow(self.traces, self.longest or TRACE_T)
        if isinstance(found, str):
            return self.call("read", roles=dict(roles))
        read, x = found
        readings = Readings((read.parts,), (), (read.heads,), x, lambda _: read.describe())
        return plain_readings(readings, list(self.parameters().values()), [])

    def modern(self) -> dict[str, Any]:
        """The modern comparison, made here from traces the block's process recorded."""
        B, T = trace_shapes(self.longest or TRACE_T)[0]
        source = Source(self.traces, self, lambda x: self.call("cache", {"x": x}))
        return modern_answer(check_modern(source, self.traces.input(B, T)), self.traces.last)

    def suggest(self) -> str:
        """The ``--map`` arguments the block's process suggests, if they are only that."""
        said = text(self.call("suggest")[0].get("map", ""), 4000)
        return said if re.fullmatch(_SUGGESTION, said) else ""
