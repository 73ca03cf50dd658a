"""The checker's view of a block that runs in another process: its answers, as claims.

``Remote`` is what ``gptblock.check.verdict.decide`` checks when the block runs in the child
process of ``gptblock.check.isolation``: a ``Tested`` and a ``Service`` whose every method is a
request to that process (``gptblock.check.worker``) and whose every answer is plain data, read
back and checked for form (shapes, dtypes, lengths) before it is used. Text it sends ends up in
the report only as one line of bounded length, never as a line of its own. The probes' inputs
are drawn here, from the seed an in-process check uses; the weights the block is given and the
inputs that confirm a comparison come from secret seeds (``isolation``).

Shapes: B batch, T time, C channels.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager as ContextManager
from contextlib import nullcontext
from typing import Any

import torch

from .report import text
from .subject import Grads, moved

__all__ = ["Call", "ProtocolBroken", "Remote"]

Tensor = torch.Tensor
Call = Callable[..., tuple[dict[str, Any], dict[str, Tensor]]]
"""``call(op, tensors=None, **args)``: one request's answer, (JSON object, tensors)."""
_SUGGESTION = r"(--map( [a-z0-9]+=[\w.*\[\]:,-]+)+)?"  # what suggest.suggest_map writes
MAX_NUMEL = 1 << 28  # elements of a tensor the block's process may claim to have made


class ProtocolBroken(BaseException):  # not an Exception: no probe may catch it
    """The block's process answered something that is not an answer to the request: the check
    stops there (``isolation`` reports it), rather than counting it as the block's error."""


def _dtype(name: object) -> torch.dtype:
    dtype = getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype):
        raise ProtocolBroken(f"an unknown dtype {text(name, 40)!r}")
    return dtype


class Remote:
    """A block in another process, asked through ``call``.

    Args:
        call: sends a request and returns its answer.
        C: the block's width; T: the probes' sequence length.
        dtype: what the other process computes in (float64, else float32).
        note: what the other process said of its copy.
        longest: its longest sequence, as it says (0: unknown).
    """

    device = torch.device("cpu")  # the tensors here; the block's own device is its process's

    def __init__(
        self, call: Call, C: int, T: int, dtype: torch.dtype, note: str, longest: int = 0
    ) -> None:
        if dtype not in (torch.float64, torch.float32):
            raise ProtocolBroken(f"a copy in {dtype}, expected float64 or float32")
        self.call, self.C, self.T, self.dtype, self._note = call, C, T, dtype, text(note)
        self.longest = longest
        self.tol = 1e-10 if dtype == torch.float64 else 1e-5
        self.generator = torch.Generator().manual_seed(0)
        self.input(T, T, C)  # the draw the copy's first call takes in a check in-process

    @property
    def tested(self) -> Remote:
        return self

    @property
    def note(self) -> str:
        return self._note

    def input(self, *shape: int, scale: float = 1.0) -> Tensor:
        """Standard normal values of ``shape`` times ``scale``, from the checker's own seed."""
        x = torch.randn(*shape, generator=self.generator, dtype=torch.float64) * scale
        return x.to(self.dtype)

    def __call__(self, x: Tensor, *, seeded: bool = True, train: bool = False) -> Tensor:
        """The block's output for ``x`` (in its dtype; in train mode, dropout off), as it says."""
        meta, tensors = self.call("forward", {"x": x}, seeded=seeded, train=train)
        return self._output(meta, tensors.get("y"))

    def _output(self, meta: dict[str, Any], y: Tensor | None) -> Tensor:
        shape = meta.get("shape")
        if not isinstance(shape, list) or not all(isinstance(n, int) and n >= 0 for n in shape):
            raise ProtocolBroken("an output without a shape")
        dtype = _dtype(meta.get("dtype"))
        if meta.get("device") != "same":  # on another device than its input: shown as meta
            if len(shape) > 8 or torch.Size(shape).numel() > MAX_NUMEL:
                raise ProtocolBroken("an output of an impossible shape")
            return torch.empty(shape, dtype=dtype, device="meta")
        if y is None or list(y.shape) != shape or y.dtype != dtype:
            raise ProtocolBroken("an output that is not what its description says")
        return y

    def own_rng(self) -> ContextManager[None]:
        return nullcontext()  # the block draws from its own process's generator

    def moved(self, y: Tensor, y2: Tensor) -> Tensor:
        return moved(y, y2, self.tol)

    def grads(self, x: Tensor, weights: Tensor, *, inputs: bool = False) -> Grads:
        """The gradients the block says a backward pass gives."""
        meta, tensors = self.call("grads", {"x": x, "weights": weights}, inputs=inputs)
        names, failed = meta.get("names"), meta.get("failed")
        if not isinstance(names, list) or failed not in ("", "forward", "backward"):
            raise ProtocolBroken("gradients without parameter names")
        shown = [text(n, 200) for n in names]
        if failed:
            return Grads(shown, [], str(failed), text(meta.get("message", ""), 400))
        grads = [tensors.get(f"g{i}") for i in range(len(names))]
        got = tensors.get("input")
        if inputs and (got is None or got.shape != x.shape):
            raise ProtocolBroken("an input gradient of the wrong shape")
        return Grads(shown, grads, input=got)

    def parameters(self) -> dict[str, Tensor]:
        """The parameters of the block's copy, as it says: floating-point tensors, by name."""
        meta, tensors = self.call("parameters")
        names = meta.get("names")
        if not isinstance(names, list) or set(names) != set(tensors) or len(names) > 1 << 16:
            raise ProtocolBroken("parameters without names")
        if not all(t.is_floating_point() and t.dim() <= 8 for t in tensors.values()):
            raise ProtocolBroken("parameters that are not floating-point tensors")
        return {str(n): tensors[n] for n in names}

    def set_parameters(self, values: Mapping[str, Tensor]) -> None:
        self.call("set", dict(values))

    def dropout_off(self) -> str:
        how = self.call("dropout_off")[0].get("how")
        if how not in ("", "switched off", "with its probability set to 0"):
            raise ProtocolBroken("an unknown way of switching dropout off")
        return str(how)

    def read(self, roles: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, Tensor]]:
        return self.call("read", roles=dict(roles))  # checked by verdict._unpack, plain.from_plain

    trusted = False  # answers from the block's process: claims

    def modern(self) -> dict[str, Any]:
        """The modern comparison the block's process reports, each text cut to one bounded line
        (``Served.modern``); ``{}`` when it reads the lessons' block or says nothing usable."""
        said, tensors = self.call("modern")
        finding = said.get("finding")
        if said and finding is None and said.get("notes"):  # out of scope: not compared
            return {"notes": _words(said.get("notes"), 600)[:4], "finding": None}
        if said.get("scope") and "finding" not in said:  # the lessons' block's unmodelled parts
            return {"scope": _words(said.get("scope"), 300)[:4]}
        if not said or not isinstance(finding, list) or len(finding) != 4:
            return {}
        details, notes, others = (said.get(k) for k in ("details", "notes", "alternatives"))
        return {
            "notes": _words(notes, 600)[:4],
            "finding": [
                text(finding[0], 40),
                finding[1] is True,
                text(finding[2], 600),
                "FOUND" if finding[3] == "FOUND" else "",
            ],
            "mistakes": _words(said.get("mistakes")),
            "details": {text(k, 80): text(v, 300) for k, v in details.items()}
            if isinstance(details, dict)
            else {},
            "alternatives": [_words(a) for a in others][:8] if isinstance(others, list) else [],
            "parts": said.get("parts"),  # checked by modern_plain.receive, in the verdict
            "tensors": tensors,
        }

    def suggest(self) -> str:
        """The ``--map`` arguments the block's process suggests, if they are only that."""
        said = text(self.call("suggest")[0].get("map", ""), 4000)
        return said if re.fullmatch(_SUGGESTION, said) else ""


def _words(value: object, size: int = 80) -> list[str]:
    """A list of short texts from the block's process, or nothing."""
    return [text(w, size) for w in value] if isinstance(value, list) else []
