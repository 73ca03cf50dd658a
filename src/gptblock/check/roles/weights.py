"""Each role's weight read by replaying its sub-layer on zeros and basis vectors (``measure``,
``read_trace``), and the norms (``find_norms``). docs/checker.md, "How it decides" ("The weights,
read by what each sub-layer computes"). B batch, T time, C channels, D, H attention, MLP widths.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..mistakes.report import CAUGHT
from ..mistakes.steps import Parts, affine
from .dataflow import Role, Unread, as_rows, find_roles, layout, static_names, weight_input
from .parts import glob
from .provenance import nearest
from .trace import LEAF, Trace, replay, rerun

__all__ = ["Reading", "find_norms", "measure", "order_norms", "read_trace", "rescaled"]

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
        one += "; a parallel residual: both branches read the block's input" * self.parts.parallel
        return (
            f"roles: {roles} (read from the forward pass: {self.heads} heads from the attention's "
            f"shapes; every weight reproduces its sub-layer's traced output to {self.error:.0e}"
            f"{one})"
        )


NORM_OPS = frozenset(["native_layer_norm", "layer_norm", "rms_norm", "_fused_rms_norm"])
MOMENTS = frozenset(["mean", "var", "var_mean", "std", "std_mean"])  # a norm written out starts


@dataclass
class Norm:
    key: str
    first: int
    out: int
    function: Callable[[Tensor], Tensor]
    end: int = 0  # a norm module's call: the operators first:end ran inside it


def rescaled(
    trace: Trace,
    source: int,
    out: int,
    z: Tensor,
    factors: list[Tensor | float],
    shaped: bool = False,
) -> tuple[Callable[[Tensor], Tensor], Tensor, list[float]] | None:
    """The replay (``shaped``: on any shape, dtype), its output on ``z``, and how far that moves
    when ``z`` is multiplied by each of ``factors``; None: not finite."""
    try:
        run, like = replay(trace, source, out), trace.nodes[source].value

        def f(h: Tensor) -> Tensor:  # ``shaped``: on another dtype or shape of as many entries
            if not shaped:
                return run(h)
            shape, h = h.shape, h.reshape(like.shape) if h.numel() == like.numel() else h
            got = run(h.to(like.dtype))
            return (got.reshape(shape) if got.numel() == math.prod(shape) else got).to(h.dtype)

        a, *outs = [f(z)] + [f(z * by) for by in factors]  # (``replay`` runs without gradients)
        if not isinstance(a, Tensor) or not torch.isfinite(a).all():
            return None
        scale = float(a.abs().max()) + 1e-12
        return f, a, [float((a - o).abs().max()) / scale for o in outs]
    except CAUGHT:
        return None


def _normalising(
    trace: Trace, source: int, out: int, shaped: bool = False
) -> Callable[[Tensor], Tensor] | None:  # no identity, and it ignores scaling its input
    like = trace.nodes[source].value
    g = torch.Generator().manual_seed(3)
    z = torch.randn(like.shape, generator=g, dtype=torch.float64).to(like.dtype)
    found = rescaled(trace, source, out, z, [3.0], shaped)
    if found is None or found[1].shape != z.shape or found[2][0] > 1e-3:
        return None
    return None if torch.allclose(found[1], z) else found[0]


def find_norms(trace: Trace, B: int, T: int) -> list[Norm]:
    found: list[Norm] = []
    for name, first, end, ins, outs in trace.calls:  # an outer module's call first
        if name not in trace.modules or len(ins) != 1 or len(outs) != 1:
            continue
        held = [shape for p, shape in trace.parameters.items() if p.startswith(name + ".")]
        # not a norm module inside another (x-transformers' LayerNorm holds nn.LayerNorm)
        nested = any(n.first <= first < n.end and name.startswith(n.key + ".") for n in found)
        if (
            trace.nodes[ins[0]].data
            and not nested
            and all(math.prod(shape) == max(shape, default=1) for shape in held)  # no matrix
            and all(weight_input(trace, op) is None for op in trace.ops[first:end])  # no sub-layer
            and layout(trace.nodes[ins[0]].shape, B, T)
            and (f := _normalising(trace, ins[0], outs[0], shaped=True)) is not None
        ):
            found.append(Norm(name, first, outs[0], f, end))
    for op in trace.ops:
        inside = any(n.first <= op.index < n.end for n in found)
        if inside or not op.inputs or not trace.nodes[op.inputs[0]].data:
            continue
        source, out = op.inputs[0], op.outputs[0] if op.name in NORM_OPS else None
        if op.name in MOMENTS and layout(trace.nodes[source].shape, B, T):  # a norm written out:
            for later in trace.ops[op.index + 1 :]:  # the last node normalising the source
                if weight_input(trace, later) is not None or later.name in ("bmm", "_softmax"):
                    break  # before a matrix product
                for n in later.outputs:
                    node = trace.nodes[n]
                    if node.shape == trace.nodes[source].shape and node.data:
                        out = n if _normalising(trace, source, n) is not None else out
        if out is not None and (f := _normalising(trace, source, out)) is not None:
            names = static_names(trace, trace.between(source, out))
            key = ", ".join(names) or f"{op.name} #{op.index} (no weights)"
            found.append(Norm(key, op.index, out, f))
    return sorted(found, key=lambda n: n.first)


def order_norms(norms: list[Norm], attn_input: int, mlp_input: int) -> list[Norm]:
    """ln1 and ln2: the first two norms to run; of more, those the attention and the MLP read."""
    distinct: dict[str, Norm] = {}
    for n in norms:
        distinct.setdefault(n.key, n)
    order = list(distinct.values())
    if not order:
        raise Unread("no norm in the forward pass (nothing that divides by a root of a variance)")
    if len(order) <= 2:
        return order
    by_out = {n.out: distinct[n.key] for n in norms}
    ln1 = by_out.get(attn_input, order[0])
    ln2 = by_out.get(mlp_input)
    if ln2 is None or ln2.key == ln1.key:
        ln2 = next(n for n in order if n.key != ln1.key)
    return [ln1, ln2]


def measure(trace: Trace, roles: dict[str, Role], B: int, T: int) -> dict[str, tuple[Tensor, Tensor, float]]:  # fmt: skip
    BT = B * T
    like = {r.put: trace.nodes[r.put].value for r in roles.values()}
    like |= rerun(trace, {}, [n for n in like if n in trace.written], trace.ops)  # once written
    width = {n: as_rows(v, B, T).shape[1] for n, v in like.items()}
    gets = [g for r in roles.values() for g in r.get]

    def run(r: int, nodes: set[int]) -> dict[int, Tensor]:  # r < 0: zeros; else row p is
        put = {}  # channel r * BT + p's 1, at ``nodes``
        for n in nodes:
            v = like[n]
            rows = torch.zeros(BT, width[n], dtype=v.dtype, device=v.device)
            at = torch.arange(max(0, min(BT, width[n] - r * BT)) if r >= 0 else 0, device=v.device)
            rows[at, r * BT + at] = 1.0
            put[n] = as_rows(rows, B, T, tuple(v.shape))
        return rerun(trace, put, gets)

    # a role's input that is another's output (two products in a row: an MLP with no activation
    # between) is put in a run of its own, so that it does not overwrite what the other makes
    made = set(like) & set(gets)
    groups = [g for g in (set(like) - made, made) if g]
    runs_of: dict[int, tuple[dict[int, Tensor], list[dict[int, Tensor]]]] = {}
    for g in groups:
        steps = range(math.ceil(max(width[n] for n in g) / BT))
        ran = run(-1, g), [run(r, g) for r in steps]
        runs_of.update(dict.fromkeys(g, ran))
    out = {}
    for name, role in roles.items():
        zero, runs = runs_of[role.put]

        def rows(values: dict[int, Tensor], role: Role = role) -> Tensor:
            out = torch.cat([as_rows(values[g], B, T).double() for g in role.get], dim=1)
            return out / role.factor

        z = rows(zero)
        weight = torch.cat([rows(r) - z for r in runs])[: width[role.put]].T.contiguous()
        values = {g: trace.nodes[g].value for g in role.get}
        x, y = as_rows(like[role.put], B, T).double(), rows(values)
        low = min((v.dtype for v in (like[role.put], *values.values())), key=lambda d: d.itemsize)
        finite = torch.isfinite(x).all(dim=1) & torch.isfinite(y).all(dim=1)  # (B * T,)
        if finite.double().mean() < 0.5:  # a mask that blocks whole rows leaves some NaN
            raise Unread(f"{name}'s input or output is not finite at most positions")
        x, y = x[finite], y[finite]
        error = float((x @ weight.T + z[0] - y).abs().max() / (y.abs().max() + 1e-30))
        if not error <= TOLERANCE.get(low, 1e-4):
            raise Unread(
                f"{name} is not a linear map of its input alone (the weight read from the block "
                f"misses its traced output by {error:.1e} of its scale)"
            )
        out[name] = (_stored(trace, role, weight) if name == "proj" else weight, z[0], error)
    return out


def read_trace(trace: Trace, x: Tensor) -> Reading:
    """Every role's weight read; ``x`` (B, T, C) with B != T so that shapes tell batch from time."""
    B, T, C = x.shape
    found, nh = find_roles(trace, B, T)  # a TraceError where the trace cannot be replayed
    if "fc3" in found or any(r.turned for r in found.values()):  # the modern block's parts
        raise Unread("a gated MLP, or q, k or v turned between their products and the scores")
    norms = order_norms(find_norms(trace, B, T), found["q"].put, found["fc1"].put)
    read = measure(trace, found, B, T)
    wq, wk, wv = read["q"][0], read["k"][0], read["v"][0]
    D, H = wq.shape[0], read["fc1"][0].shape[0]
    if wk.shape != wq.shape or wv.shape != wq.shape or wq.shape[1] != C:
        raise Unread(f"q, k, v have shapes {tuple(wq.shape)}, {tuple(wk.shape)}, {tuple(wv.shape)}")
    for role, shape in {"proj": (C, D), "fc2": (C, H), "fc1": (H, C)}.items():
        if tuple(read[role][0].shape) != shape:
            raise Unread(f"{role} maps {tuple(read[role][0].shape)[::-1]}, expected {shape[::-1]}")
    if D % nh:
        raise Unread(f"{nh} heads do not divide the attention width {D}")
    q, k, v, proj, fc1, fc2 = (affine(*read[r][:2]) for r in ("q", "k", "v", "proj", "fc1", "fc2"))
    ln = [n.function for n in norms] + [None]
    # the MLP reads no stream after the attention: both branches read the block's input
    parallel = found["proj"].get[0] not in trace.ancestors(found["fc1"].put)
    parts = Parts(C, D, lambda h: (q(h), k(h), v(h)), proj, fc1, fc2, ln[0], ln[1], parallel)
    names = {f"ln{i + 1}": n.key for i, n in enumerate(norms)}
    names.update({role: _shown(trace, r.params, read[role][0]) for role, r in found.items()})
    held = {r: list(role.params) for r, role in found.items()}
    held.update({f"ln{i + 1}": n.key.split(", ") for i, n in enumerate(norms)})
    error = max(e for _, _, e in read.values())
    return Reading(parts, nh, names, error, held)


def _stored(trace: Trace, role: Role, weight: Tensor) -> Tensor:
    """``weight``'s columns in the order its one parameter stores them: a library's product
    (einsum's) may flatten the heads (hs, nh)-major on both sides, where the reference is nh-major."""
    held = [n.value for n in trace.nodes if n.op == LEAF and n.name in role.params]
    if len(held) != 1 or held[0].dim() < 2:
        return weight
    values, order = held[0].detach().double().flatten().sort()
    first = weight[0].double()
    at = nearest(values, first)  # each column's first entry: where it is stored
    off = float((values[at] - first).abs().max()) > 1e-6 * float(first.abs().max())
    if off or torch.unique(at).numel() < at.numel():
        return weight
    return weight[:, order[at].argsort()]


def _shown(trace: Trace, params: list[str], weight: Tensor) -> str:
    """Parameters by their modules (``heads.*.query``), ' (in, out)' where stored transposed."""
    if not params:
        return "none (the merged heads join the stream as they are: the identity)"
    shown: list[str] = []
    for owner in dict.fromkeys(p.rpartition(".")[0] for p in params):
        held = [p for p in params if p.rpartition(".")[0] == owner]
        own = {p for p in trace.parameters if p.rpartition(".")[0] == owner}
        shown += [owner] if owner and set(held) == own else held
    values = {n.name: n.value for n in trace.nodes if n.op == LEAF and n.name in params}
    matrices = [v for name, v in values.items() if name in trace.parameters and v.dim() == 2]
    if len(matrices) != 1 or matrices[0].shape != weight.T.shape:
        return glob(shown) or "(no parameter)"
    stored = matrices[0].detach().to(weight.dtype)
    same = stored.shape == weight.shape and torch.allclose(stored, weight, atol=1e-8)
    turned = not same and torch.allclose(stored, weight.T, atol=1e-8)
    return (glob(shown) or "(no parameter)") + (" (in, out)" if turned else "")
