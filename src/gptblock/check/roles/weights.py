"""Each role's weight read out of a block by what its sub-layer computes, in the lessons' layout.

``read_block(module, x)`` records the forward pass (``trace``), finds the roles (``dataflow``),
and reads every sub-layer the same way whatever holds its weight: the block is replayed with the
role's input replaced by zeros, then by basis vectors, and its output read where the reference
needs it; ``h @ W.T + b`` gives ``b`` for the zero rows and ``W[:, c] + b`` for basis vector
``c``. Every weight read must reproduce the role's traced output (to 1e-9 of its scale in
float64), or the block is not read.

Shapes: B batch, T time, C channels, D attention width, H the MLP's hidden width.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn as nn

from ..mistakes.steps import Parts, affine
from .dataflow import Role, Roles, Unread, find_roles
from .norms import find_norms, order_norms
from .parts import glob
from .trace import LEAF, Trace, TraceError, record, rerun
from .walks import layout

__all__ = ["Reading", "measure", "read_block", "read_trace"]

Tensor = torch.Tensor
TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4}  # of a role's output scale


@dataclass(frozen=True)
class Reading:
    """The block's parts read from its dataflow: the reference's ``Parts`` and what they are."""

    parts: Parts
    heads: int
    names: dict[str, str]  # role -> the parameters (or module) it was read from, as shown
    error: float  # the largest verification error of a weight read, relative
    params: dict[str, list[str]]  # role -> the parameters (and buffers) it was read from

    def describe(self) -> str:
        roles = ", ".join(f"{r}={n}" for r, n in self.names.items())
        one = "" if "ln2" in self.names else "; one LayerNorm for both branches"
        return (
            f"roles: {roles} (read from the forward pass: {self.heads} heads from the attention's "
            f"shapes; every weight reproduces its sub-layer's traced output to {self.error:.0e}"
            f"{one})"
        )


def _axes(shape: tuple[int, ...], B: int, T: int) -> tuple[int, int]:
    axes = layout(shape, B, T, strict=False)
    if axes is None:
        raise Unread(f"a tensor of shape {shape} is not laid out by position")
    return axes


def _rows(value: Tensor, B: int, T: int) -> Tensor:
    """A node's value as one row per position, (B * T, F), b-major."""
    axes = _axes(tuple(value.shape), B, T)
    if axes[0] == axes[1]:  # (..., B * T, ...)
        return value.movedim(axes[0], 0).reshape(B * T, -1)
    return value.movedim(axes, (0, 1)).reshape(B * T, -1)


def _unrows(rows: Tensor, shape: tuple[int, ...], B: int, T: int) -> Tensor:
    """``_rows``' inverse: (B * T, F) rows back to a node's shape."""
    axes = _axes(shape, B, T)
    rest = [s for i, s in enumerate(shape) if i not in axes]
    if axes[0] == axes[1]:
        return rows.reshape(B * T, *rest).movedim(0, axes[0]).contiguous()
    return rows.reshape(B, T, *rest).movedim((0, 1), axes).contiguous()


def measure(trace: Trace, found: Roles, B: int, T: int) -> dict[str, tuple[Tensor, Tensor, float]]:  # fmt: skip
    """Each role's (weight (out, in), bias (out,), verification error)."""
    BT = B * T
    puts = {r.put for r in found.roles.values()}
    like = {n: trace.nodes[n].value for n in puts}
    width = {n: _rows(v, B, T).shape[1] for n, v in like.items()}
    gets = [g for r in found.roles.values() for g in r.get]

    def run(fill: dict[int, Tensor]) -> dict[int, Tensor]:
        put = {n: _unrows(fill[n], tuple(like[n].shape), B, T) for n in puts}
        return rerun(trace, put, gets)

    def basis(r: int, w: int, v: Tensor) -> Tensor:
        rows = torch.zeros(BT, w, dtype=v.dtype, device=v.device)
        for p in range(min(BT, w - r * BT)):
            rows[p, r * BT + p] = 1.0
        return rows

    zero = run(
        {n: torch.zeros(BT, width[n], dtype=v.dtype, device=v.device) for n, v in like.items()}
    )
    runs = [
        run({n: basis(r, width[n], v) for n, v in like.items()})
        for r in range(math.ceil(max(width.values()) / BT))
    ]
    out = {}
    for name, role in found.roles.items():

        def rows(values: dict[int, Tensor], role: Role = role) -> Tensor:
            out = torch.cat([_rows(values[g], B, T).double() for g in role.get], dim=1)
            return out / role.factor

        z, w_in = rows(zero), width[role.put]
        measured = [rows(r) for r in runs]
        weight = torch.stack(
            [measured[c // BT][c % BT] - z[c % BT] for c in range(w_in)], dim=1
        )  # (out, in)
        bias = z[0]
        values = {g: trace.nodes[g].value for g in role.get}
        x, y = _rows(like[role.put], B, T).double(), rows(values)
        low = min((v.dtype for v in (like[role.put], *values.values())), key=lambda d: d.itemsize)
        finite = torch.isfinite(x).all(dim=1) & torch.isfinite(y).all(dim=1)  # (B * T,)
        if finite.double().mean() < 0.5:  # a mask that blocks whole rows leaves some NaN
            raise Unread(f"{name}'s input or output is not finite at most positions")
        x, y = x[finite], y[finite]
        error = float((x @ weight.T + bias - y).abs().max() / (y.abs().max() + 1e-30))
        if not error <= TOLERANCE.get(low, 1e-4):
            raise Unread(
                f"{name} is not a linear map of its input alone (the weight read from the block "
                f"misses its traced output by {error:.1e} of its scale)"
            )
        out[name] = (weight, bias, error)
    return out


def read_block(module: nn.Module, x: Tensor) -> Reading:
    """Record ``module(x)`` and read every role's weight out of it; ``x`` (B, T, C) with B != T,
    so that shapes tell batch from time.

    Raises:
        Unread: the block's roles or weights cannot be read; the message says why.

    Example:
        >>> from gptblock import lesson
        >>> block = lesson.Block(16, 2, 8, dropout=0.0).double().eval()
        >>> reading = read_block(block, torch.randn(5, 7, 16, dtype=torch.float64))
        >>> reading.heads, reading.parts.D, reading.error < 1e-12
        (2, 16, True)
    """
    try:
        trace = record(module, x)
    except TraceError as e:
        raise Unread(str(e)) from e
    return read_trace(trace, x)


def read_trace(trace: Trace, x: Tensor) -> Reading:
    """``read_block`` on a recorded forward pass (``x`` its input): every weight read by
    replaying the trace, wherever it was recorded.

    Raises:
        Unread: the block's roles or weights cannot be read; the message says why.
    """
    B, T, C = x.shape
    try:
        found = find_roles(trace, B, T)
        norms = order_norms(find_norms(trace, B, T), found.roles["q"].put, found.roles["fc1"].put)
        read = measure(trace, found, B, T)
    except TraceError as e:
        raise Unread(str(e)) from e
    (wq, bq, _), (wk, bk, _), (wv, bv, _) = read["q"], read["k"], read["v"]
    D = wq.shape[0]
    if wk.shape != wq.shape or wv.shape != wq.shape or wq.shape[1] != C:
        raise Unread(f"q, k, v have shapes {tuple(wq.shape)}, {tuple(wk.shape)}, {tuple(wv.shape)}")
    H = read["fc1"][0].shape[0]
    for role, shape in {"proj": (C, D), "fc2": (C, H), "fc1": (H, C)}.items():
        if tuple(read[role][0].shape) != shape:
            raise Unread(f"{role} maps {tuple(read[role][0].shape)[::-1]}, expected {shape[::-1]}")
    if D % found.heads:
        raise Unread(f"{found.heads} heads do not divide the attention width {D}")

    def qkv(h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return affine(wq, bq)(h), affine(wk, bk)(h), affine(wv, bv)(h)

    ln = [n.function for n in norms]
    parts = Parts(
        C, D, qkv, affine(*read["proj"][:2]), affine(*read["fc1"][:2]), affine(*read["fc2"][:2]),
        ln[0], ln[1] if len(ln) > 1 else None,
    )  # fmt: skip
    names = {f"ln{i + 1}": n.key for i, n in enumerate(norms)}
    params = {n.name: n.value for n in trace.nodes if n.op == LEAF and n.name in trace.parameters}
    for role, r in found.roles.items():
        names[role] = (
            _display(trace, r.params) + _orientation(params, r.params, read[role][0])
            if r.params
            else "none (the merged heads join the stream as they are: the identity)"
        )
    error = max(e for _, _, e in read.values())
    held = {r: list(role.params) for r, role in found.roles.items()}
    held.update({f"ln{i + 1}": n.key.split(", ") for i, n in enumerate(norms)})
    return Reading(parts, found.heads, names, error, held)


def _display(trace: Trace, params: list[str]) -> str:
    """Parameters by the modules that hold them: ``attn.c_attn`` for its weight and bias,
    ``heads.*.query`` for one module per head, else the parameters themselves."""
    owners: dict[str, list[str]] = {}
    for p in params:
        owners.setdefault(p.rpartition(".")[0], []).append(p)
    shown = []
    for owner, held in owners.items():
        own = {p for p in trace.parameters if p.rpartition(".")[0] == owner}
        shown += [owner] if owner and set(held) == own else held
    return glob(shown) or "(no parameter)"


def _orientation(params: Mapping[str, Tensor], names: list[str], weight: Tensor) -> str:
    """' (in, out)' when the role's one matrix is stored transposed, as ``x @ W`` reads it."""
    matrices = [params[n] for n in names if n in params and params[n].dim() == 2]
    if len(matrices) != 1 or matrices[0].shape != weight.T.shape:
        return ""
    stored = matrices[0].detach().to(weight.dtype)
    same = stored.shape == weight.shape and torch.allclose(stored, weight, atol=1e-8)
    return "" if same or not torch.allclose(stored, weight.T, atol=1e-8) else " (in, out)"
