"""Which reading the comparison uses (``read_parts``): the dataflow's, else the module tree's, or
as ``--map`` says; ``suggest_map``: a ``--map`` to offer (docs/checker.md, "When the forward pass
does not show the roles"). Shapes: B batch, T time, C channels.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import torch
import torch.nn as nn

from ...errors import UserValueError
from ..mistakes.report import CAUGHT, one_line
from ..serve.subject import Probed, Subject
from .dataflow import Unread
from .given import check_claims, check_reading, fix_roles
from .mapping import FORMS, QKV, READS_C, ROLES, MappedBlock, fits, map_roles
from .parts import discover, observe, paired_bias
from .trace import Trace, TraceError
from .weights import Reading, read_trace

__all__ = [
    "TRACE_B", "TRACE_T", "Readings", "Traces", "dataflow", "read_parts", "suggest_map",
    "trace_shapes",
]  # fmt: skip

Tensor = torch.Tensor
TRACE_T, TRACE_B = 7, 5  # the traced input's T and B: different, so shapes tell them apart


class Traces:
    """A block's forward passes, recorded once per input (the costliest step, shared by the
    modern comparison and the dataflow's reading); ``clear`` after setting the block's weights."""

    def __init__(self, tested: Probed, record: Callable[[Tensor], Trace]) -> None:
        self.record = record
        self.input = functools.cache(lambda B, T: tested.input(B, T, tested.C))  # one draw each
        self.clear()

    def clear(self) -> None:
        self.seen: list[tuple[Tensor, Trace]] = []  # (input, its forward pass)
        self.last: Trace | None = None  # the latest asked for

    def __call__(self, x: Tensor) -> Trace:
        same = (t for s, t in self.seen if s.shape == x.shape and s.dtype == x.dtype and torch.equal(s, x))  # fmt: skip
        trace = next(same, None)
        if trace is None:
            trace = self.record(x)
            self.seen.append((x, trace))
        self.last = trace
        return trace


Readings = MappedBlock  # the parts to compare, by the dataflow, the module tree or --map


def trace_shapes(longest: int) -> list[tuple[int, int]]:
    """The (B, T) to trace with: B != T, neither likely a head count (so shapes tell them
    apart), then B = T (a block that only runs so) and B = 1 (one that loops over sequences)."""
    T = min(TRACE_T, longest)
    shapes = [(B, min(t, longest)) for B, t in ((TRACE_B, TRACE_T), (11, 13), (4, TRACE_T))]
    return list(dict.fromkeys([*((B + 2 * (B == t), t) for B, t in shapes), (T, T), (1, T)]))


def dataflow(traces: Traces, longest: int) -> tuple[Reading, Tensor] | str:
    """The dataflow's reading and its (float64) input, or why there is none."""
    why = ""
    for B, T in trace_shapes(longest):
        x = traces.input(B, T)
        try:
            return read_trace(traces(x), x), x.to(torch.float64)
        except (Unread, TraceError) as e:
            why = why or str(e)
        except CAUGHT as e:  # the reader's own limit, not the block's mistake: say so
            why = why or f"the forward pass could not be read ({one_line(e)})"
    return why


def read_parts(
    subject: Subject, traces: Traces, roles: Mapping[str, str], longest: int, notes: list[str]
) -> Readings | str:
    """The block's parts to compare, or why they cannot be read; how, added to ``notes``."""
    found = dataflow(traces, longest)
    module, C = subject.module, subject.C
    parts = discover(module)
    given, read = check_claims(module, C, parts, roles)
    if not isinstance(found, str) and check_reading(module, C, found[0], given, read):
        reading, x = found
        if roles:
            notes.append(f"the roles given ({', '.join(roles)}) agree with the forward pass")
        return Readings((reading.parts,), (), (reading.heads,), x, lambda _: reading.describe())
    why, seen = (found, "") if isinstance(found, str) else ("", found[0].describe())
    try:
        kept, fixed = fix_roles(parts, given, read)
    except ValueError as e:
        raise UserValueError(f"{e}" + (f"; the forward pass reads {seen}" if seen else "")) from e
    x = subject.input(subject.T, subject.T, C)
    called = observe(module, kept, lambda: subject(x))
    mapped = map_roles(module, C, kept, called, fixed, subject.T)
    if not isinstance(mapped, MappedBlock):
        return f"{why}; by the module tree: {mapped}" if why else str(mapped)
    if why:
        notes.append(
            f"the forward pass did not show the roles ({why}): found by shapes and order instead"
        )
    return mapped


def suggest_map(module: nn.Module, C: int) -> str:
    """``--map ROLE=NAME ...`` by registration order, with the slices or layouts (in, out) and
    per-head weights need, or "" if none fits."""
    parts = discover(module)
    named = dict(module.named_parameters())
    per_head = {n for n, p in named.items() if p.dim() == 3}
    biases = {paired_bias(named, n, named[n]) for n in per_head}  # b_Q (nh, hs): no matrix
    linear = {p.params[0]: p.name for p in parts if p.kind in ("linear", "matrix")}
    # (what --map names: the part or the 3-D parameter, its weight), by the weight's registration
    matrices = [(linear.get(n, n), n) for n in named if n in per_head | (linear.keys() - biases)]
    order = next((FORMS[f] for f in ("packed", "separate") if len(FORMS[f]) == len(matrices)), ())
    norms = [p.name for p in parts if p.kind == "norm"]
    for laid in (False, True) if order else ():
        roles = dict(zip(ROLES[:2], norms, strict=False))
        for role, (name, weight) in zip(order, matrices, strict=True):
            roles.update(_given(role, C, name, weight, tuple(named[weight].shape), laid))
        try:
            kept, fixed = fix_roles(parts, *check_claims(module, C, parts, roles))
        except ValueError:
            continue
        if isinstance(map_roles(module, C, kept, {}, fixed), MappedBlock):
            return "--map " + " ".join(f"{r}={n}" for r, n in roles.items())
    return ""


def _given(
    role: str, C: int, name: str, weight: str, shape: tuple[int, ...], laid: bool
) -> dict[str, str]:
    if len(shape) == 3:  # per head: (nh, C, hs) is in_out for q/k/v, (nh, hs, C) for proj
        in_out = (shape[1] == C) == (role in READS_C)
        layout = "in_out" if in_out else "out_in"
        if role != "qkv":
            return {role: f"{name}:{layout}"}
        hs = shape[2 if in_out else 1] // 3  # q, k, v packed per head: thirds of each head
        at = "[:,:,{}:{}]" if in_out else "[:,{}:{},:]"
        return {r: f"{name}{at.format(i * hs, (i + 1) * hs)}:{layout}" for i, r in enumerate(QKV)}
    stored_in_out = fits(role, shape[::-1], C) and not fits(role, shape, C)
    return {role: f"{weight}:in_out" if laid and stored_in_out else name}
