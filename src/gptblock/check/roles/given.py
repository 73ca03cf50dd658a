"""``--map``: a module, glob or parameter, or ``PATH[SLICES]:LAYOUT``, refused where it cannot be
the role (docs/checker.md, "A `--map` or `--arg` that cannot be what it claims is refused").
Shapes: C channels, D attention width, H the MLP's hidden width, nh heads, hs head size.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from dataclasses import replace

import torch
import torch.nn as nn

from ...errors import UserValueError
from .mapping import QKV, ROLES, SHAPES, fits
from .parts import Given, Matrix, Part, named_parts, paired_bias, tensor_ids
from .weights import Reading

__all__ = ["Map", "check_claims", "check_reading", "fix_roles", "given_part", "parse_given"]

Tensor = torch.Tensor

_SPEC = re.compile(r"^(?P<path>[\w.]+)(?:\[(?P<slices>[^\]]*)\])?(?::(?P<layout>\w+))?$")
_BOUND = re.compile(r"^\s*(-?\d*)\s*:\s*(-?\d*)\s*$")


Map = dict[str, Given]  # role -> its parsed value


def parse_given(module: nn.Module, text: str) -> Given:
    """``read`` as a matrix where it has a slice or layout or names a 3-D parameter, else a name."""
    if "[" not in text and ":" not in text:
        p = dict(module.named_parameters()).get(text)
        return Given(text, None, "", text, p is not None and p.dim() == 3)
    match = _SPEC.match(text.strip())
    if match is None:
        raise UserValueError(
            f"--map value {text!r}: expected PATH[START:STOP, ...]:LAYOUT, e.g. "
            "attn.c_attn.weight[:, 0:32]:in_out"
        )
    if match["layout"] not in (None, "out_in", "in_out"):
        raise UserValueError(
            f"--map value {text!r}: layout {match['layout']!r}; expected out_in or in_out"
        )
    bounds = match["slices"]
    slices = None if bounds is None else tuple(_slice(text, s) for s in bounds.split(","))
    return Given(match["path"], slices, match["layout"] or "", text, True)


def _slice(text: str, bound: str) -> slice:
    found = _BOUND.match(bound)
    if found is None:
        raise UserValueError(
            f"--map value {text!r}: {bound.strip()!r} is not START:STOP (steps and single "
            "indices are not taken)"
        )
    return slice(*(int(s) if s else None for s in found.groups()))


def given_part(module: nn.Module, C: int, role: str, g: Given, index: int) -> Part:
    """A ``linear`` part for ``role`` read from ``g``, its place ``index``; a UserValueError
    where it cannot be the role."""
    named, say = dict(module.named_parameters()), f"{role}={g.text}"
    if role in ("ln1", "ln2"):
        raise UserValueError(f"{say}: a norm is given as its module, not a slice")
    p = named.get(g.path)
    if p is None:
        near = ", ".join(n for n in named if n.rpartition(".")[2] == g.path.rpartition(".")[2])
        raise UserValueError(
            f"{say}: the block has no parameter {g.path!r}"
            + (f" (parameters of that name: {near})" if near else "")
        )
    shape, n = tuple(p.shape), len(p.shape if g.slices is None else g.slices)
    if p.dim() not in (2, 3) or n != p.dim():
        raise UserValueError(
            f"{say}: {n} slices for {g.path} of shape {shape}; expected a matrix (out, in) / "
            "(in, out) or one per head (nh, C, hs), one slice per dimension (':' for all)"
        )
    for s, n in zip(g.slices or (), shape, strict=False):
        start, stop = s.start or 0, n if s.stop is None else s.stop
        if not 0 <= start < stop <= n:
            raise UserValueError(
                f"{say}: slice {start}:{stop} is out of range for a dimension of size {n} "
                f"({g.path} has shape {shape})"
            )
    bias = paired_bias(named, g.path, p)
    # a per-head tensor with no layout written is read in the one that fits the role
    layouts = ("out_in", "in_out") if p.dim() == 3 and not g.layout else (g.layout,)
    reads = [Matrix(role, p, named[bias] if bias else None, replace(g, layout=x)) for x in layouts]
    m = next((m for m in reads if fits(role, tuple(m.canonical()[0].shape), C)), reads[-1])
    w, b = m.canonical()
    if not fits(role, tuple(w.shape), C):
        why = f"reads as (out, in) = {tuple(w.shape)}, but {role} is {SHAPES[role]} with C = {C}"
    elif b is not None and b.numel() != w.shape[0]:  # a slice or layout that misses the bias
        why = f"its bias {bias} gives {b.numel()} values for {w.shape[0]} outputs"
    else:
        params = (g.path, bias) if bias else (g.path,)
        return Part(g.text, "linear", index, m, params, (int(w.shape[0]), int(w.shape[1])))
    raise UserValueError(f"{say}: {why}; check the slice, or the layout (out_in / in_out)")


def fix_roles(
    parts: list[Part], given: Map, read: dict[str, Part]
) -> tuple[list[Part], dict[str, list[Part]]]:
    """The block's parts with those ``read`` as matrices in place of the parts holding their
    parameters (read only so), and every role's parts; a ValueError for a name of no part."""
    covered = {n for p in read.values() for n in p.params}
    kept = [p for p in parts if not covered & set(p.params)]
    fixed = {r: named_parts(kept, g.text) for r, g in given.items() if r not in read}
    for role in (r for r, found in fixed.items() if not found):
        known = ", ".join(p.name or "(the block)" for p in kept[:16])
        raise ValueError(f"{role}={given[role].text}: no such part; the block's parts are {known}")
    return [*kept, *read.values()], fixed | {r: [p] for r, p in read.items()}


BRANCH = {"ln1": "attention", "ln2": "MLP"}
SAME = 1e-6  # a slice holds a role's matrix when they agree to this, relative, up to a factor


def check_claims(
    module: nn.Module, C: int, parts: list[Part], roles: Mapping[str, str]
) -> tuple[Map, dict[str, Part]]:
    """``roles`` parsed; refused where one cannot be the role, or one weight is two roles; the
    parts of those read as matrices (``given_part``), placed after ``parts``."""
    if unknown := [r for r in roles if r not in ROLES]:
        raise UserValueError(f"unknown role {unknown[0]!r}; the roles are {', '.join(ROLES)}")
    if "qkv" in roles and roles.keys() & {"q", "k", "v"}:
        raise UserValueError("give either qkv (packed) or q, k and v, not both")
    given = {r: parse_given(module, t) for r, t in roles.items()}
    # a name of no part: fix_roles says so later, with the trace's names
    found = {r: [] if g.read else named_parts(parts, g.text) for r, g in given.items()}
    _one_weight_one_role(module, given, found)
    fitted: dict[str, list[tuple[int, int]]] = {}  # role -> (out, in) of each of its parts
    named = dict(module.named_parameters())
    for role, g in given.items():
        why, fitted[role] = _cannot(role, found[role], C, named.get(g.text))
        if why:
            raise UserValueError(f"{role}={g.text}{why}")
    _between(given, fitted)
    read = [(r, g) for r, g in given.items() if g.read]
    return given, {r: given_part(module, C, r, g, len(parts) + i) for i, (r, g) in enumerate(read)}


def _what(p: Part) -> str:
    return f"{p.name or '(the block)'} is " + {
        "norm": "a norm" + (f" of width {p.width}" if p.width else ""),
        "mha": "an nn.MultiheadAttention (q, k, v and proj)",
        "matrix": f"a matrix parameter of shape {p.shape}",
    }.get(p.kind, f"a linear layer (out, in) = {p.shape}")


def _cannot(
    role: str, found: list[Part], C: int, vector: Tensor | None
) -> tuple[str, list[tuple[int, int]]]:
    """Why ``found`` cannot be ``role`` ("" where it can), and its (out, in) where known."""
    if not found:  # read as a matrix (``given_part``), or a name of no part (said later)
        return "", []
    if len(found) > 1 and role not in QKV:
        one = f"{role} is one norm" if role in BRANCH else "only q, k and v take one module per head"  # fmt: skip
        return f" matches {len(found)} parts ({', '.join(p.name for p in found[:4])}); {one}", []
    if role in BRANCH:
        why = f": {_what(found[0])}, not a norm; {role} is the norm before the {BRANCH[role]}"
        return "" if found[0].kind == "norm" else why, []
    if vector is not None and vector.dim() < 2:
        what = f"a vector of shape {tuple(vector.shape)} (a bias or a norm's weight)"
        return f": {what}, not {role}'s {SHAPES[role]} weight; name the weight or its module", []
    shapes: list[tuple[int, int]] = []
    for p in found:
        if p.kind == "norm" or (p.kind == "mha" and role in ("fc1", "fc2")):
            return f": {_what(p)}, not a linear layer; {role} is a {SHAPES[role]} weight", []
        options = {p.shape, p.laid(True).shape} - {None}
        fit = sorted(s for s in options if s is not None and fits(role, s, C))
        if options and not fit:
            return f": {_what(p)}, but {role} is {SHAPES[role]} with C = {C}", []
        shapes += fit[:1] if len(fit) == 1 else []
    return "", shapes if len(shapes) == len(found) else []  # [] where the orientation is unknown


def _between(given: Map, fitted: Mapping[str, list[tuple[int, int]]]) -> None:
    """proj reads what q (or qkv) writes; fc2 reads what fc1 writes."""
    q = fitted.get("q") or [(s[0] // 3, s[1]) for s in fitted.get("qkv", [])]
    pairs = (("q" if "q" in fitted else "qkv", q, "proj"), ("fc1", fitted.get("fc1"), "fc2"))
    for first, writes, second in pairs:
        reads = fitted.get(second)
        if writes and reads and reads[0][1] != sum(s[0] for s in writes):
            raise UserValueError(
                f"{second}={given[second].text} reads {reads[0][1]} channels, but {first}="
                f"{given[first].text} writes {sum(s[0] for s in writes)}: {second} must read what "
                f"{first} writes"
            )


def _one_weight_one_role(module: nn.Module, given: Map, found: Mapping[str, list[Part]]) -> None:
    """ln1 and ln2 may share a norm: one LayerNorm for both branches."""
    shapes = {n: tuple(p.shape) for n, p in module.named_parameters()}
    held: dict[str, list[tuple[str, tuple[slice, ...] | None]]] = {}  # role -> names, slices
    for role, g in given.items():
        ps = [p for p in found[role] if p.kind != "mha"]
        held[role] = [(g.path, g.slices)] if g.read else [(n, None) for p in ps for n in (p.params if g.text not in p.params else (g.text,))]  # fmt: skip
    for a, b in itertools.combinations(held, 2):
        for (path, sa), (other, sb) in itertools.product(held[a], held[b]):
            if path == other and _overlap(sa, sb, shapes.get(path, ())) and {a, b} != {"ln1", "ln2"}:  # fmt: skip
                what = "overlapping slices of" if sa and sb else "both name"
                raise UserValueError(
                    f"{a}={given[a].text} and {b}={given[b].text}: {what} {path}; one weight "
                    f"cannot be both {a} and {b}"
                )


def _overlap(a: tuple[slice, ...] | None, b: tuple[slice, ...] | None, shape: tuple[int, ...]) -> bool:  # fmt: skip
    if a is None or b is None or len(a) != len(b) or len(a) != len(shape):
        return True
    spans = [(x.indices(n), y.indices(n)) for x, y, n in zip(a, b, shape, strict=True)]
    return all(max(x[0], y[0]) < min(x[1], y[1]) for x, y in spans)


def check_reading(
    module: nn.Module, C: int, read: Reading, given: Map, parts: Mapping[str, Part]
) -> bool:
    """Refuse roles that the forward pass, as ``read``, shows to be something else (``parts``:
    those read as matrices); whether every role is named as it reads it (``qkv``: as q)."""
    held = {r: tensor_ids(module, *names) for r, names in read.params.items()}
    agree = True
    for role, g in given.items():
        mine = tensor_ids(module, g.path)
        named = not (g.slices or g.layout)  # a slice or layout is read as given, never traced
        agree = agree and named and bool(mine & held.get("q" if role == "qkv" else role, set()))
        if not mine:
            continue  # no such part: said where the roles are resolved
        claimed = set(QKV) if role == "qkv" else {role}
        if role == "ln2" and "ln2" not in held:
            claimed = {"ln1"}  # one LayerNorm for both branches
        users = [r for r in ROLES if mine & held.get(r, set())]
        there = f" (it reads {role} from {read.names[role]})" if role in read.names else ""
        if not claimed & set(users):
            uses = f"uses {g.path} as {', '.join(users)}" if users else f"uses {g.path} for no role"
            raise UserValueError(f"{role}={g.text}: the forward pass {uses}, not {role}{there}")
        if role in parts:
            _holds(C, read, role, parts[role])
    return agree


def _holds(C: int, read: Reading, role: str, part: Part) -> None:
    """The forward pass's ``role`` is ``part`` (named as given), up to a factor."""
    H = int(read.parts.fc1(torch.zeros(1, 1, C, dtype=torch.float64)).shape[-1])
    width = {"proj": read.parts.D, "fc2": H}.get(role, C)
    x = torch.randn(1, 4, width, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    if part.shape is not None and part.shape[1] != width:
        raise UserValueError(
            f"{role}={part.name}: reads {part.shape[1]} channels, but the forward pass's {role} "
            f"reads {width}"
        )
    zero = torch.zeros_like(x)
    mine = part.module(x) - part.module(zero)  # less their biases
    if role in (*QKV, "qkv"):
        q, k, v = (a - b for a, b in zip(read.parts.qkv(x), read.parts.qkv(zero), strict=True))
        theirs = {"q": q, "k": k, "v": v, "qkv": torch.cat([q, k, v], dim=-1)}
    else:
        theirs = {role: getattr(read.parts, role)(x) - getattr(read.parts, role)(zero)}
    if _same(mine, theirs[role]):
        return
    whose = [r for r, y in theirs.items() if r != role and _same(mine, y)]
    held = f"it holds what the forward pass uses as {whose[0]}" if whose else (
        f"it is not the matrix the forward pass uses as {role}"
    )  # fmt: skip
    raise UserValueError(f"{role}={part.name}: {held}; check the slice and the layout")


def _same(a: Tensor, b: Tensor) -> bool:
    if a.shape != b.shape:
        return False
    scale = float(b.abs().max())
    if scale == 0.0:
        return float(a.abs().max()) == 0.0
    factor = float((a * b).sum() / (b * b).sum())
    if abs(factor) < SAME:  # all but zero: not the same matrix
        return False
    return float((a - factor * b).abs().max()) <= SAME * scale * max(abs(factor), 1.0)
