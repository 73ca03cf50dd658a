"""Refusing a ``--map`` that cannot be what it claims, before anything is compared.

A role given by hand is the comparison's truth: a wrong one must not quietly become a PASS
(ignored) or a FAIL (blamed on the block). ``check_claims`` refuses, in one line naming the role,
the name and why, a part of the wrong kind (a norm for a projection, a bias for a matrix,
several modules for a role that is one), a shape the role cannot have in a block of width C (or
that the role before it does not write), and one weight for two roles. ``check_reading`` then
holds the roles against the forward pass, where it was read: a name it uses for another role or
for none is refused, and a slice must hold the matrix it uses for the role (up to a factor).

Shapes: C channels, D attention width, H the MLP's hidden width.
"""

from __future__ import annotations

import fnmatch
import itertools
from collections.abc import Callable, Mapping

import torch
import torch.nn as nn

from ...errors import UserValueError
from .given import Given, given_part, parse_given
from .mapping import QKV, ROLES, SHAPES, fits, named_parts
from .parts import Part
from .weights import Reading

__all__ = ["check_claims", "check_reading"]

Tensor = torch.Tensor
BRANCH = {"ln1": "attention", "ln2": "MLP"}
SAME = 1e-6  # a slice holds a role's matrix when they agree to this, relative, up to a factor


def check_claims(module: nn.Module, C: int, parts: list[Part], roles: Mapping[str, str]) -> None:
    """Refuse roles (``{role: --map value}``) whose kind or shape cannot be the role, or one
    weight given for two roles; a name that matches nothing ``mapping.resolve_roles`` refuses.

    Raises:
        UserValueError: one line naming the role, the name and why.

    Example:
        >>> from gptblock import lesson
        >>> from gptblock.check.roles.parts import discover
        >>> block = lesson.Block(16, 2, 8)
        >>> check_claims(block, 16, discover(block), {"q": "ln1"})
        Traceback (most recent call last):
        ...
        gptblock.errors.UserValueError: q=ln1: ln1 is a norm of width 16, not a linear layer; q is a (D, C) weight
    """
    given = {r: parse_given(module, text) for r, text in roles.items()}
    # a name of no part: resolve_roles says so later, with the trace's names
    found = {r: [] if given[r] else named_parts(parts, text) for r, text in roles.items()}
    _one_weight_one_role(module, roles, given, found)
    fitted: dict[str, list[tuple[int, int]]] = {}  # role -> (out, in) of each of its parts
    named = dict(module.named_parameters())
    for role, text in roles.items():
        some = found[role]
        if len(some) > 1 and role not in QKV:
            one = f"{role} is one norm" if role in BRANCH else "only q, k and v take one module per head"  # fmt: skip
            names = ", ".join(p.name for p in some[:4])
            raise UserValueError(f"{role}={text} matches {len(some)} parts ({names}); {one}")
        if some and role in BRANCH and some[0].kind != "norm":
            raise UserValueError(
                f"{role}={text}: {some[0].name or '(the block)'} is {_what(some[0])}, not a "
                f"norm; {role} is the norm before the {BRANCH[role]}"
            )
        if some and role not in BRANCH:
            fitted[role] = _linear(role, text, some, C, named.get(text))
    _between(roles, fitted)


def _what(p: Part) -> str:
    if p.kind == "norm":
        return "a norm" + (f" of width {p.width}" if p.width else "")
    if p.kind == "mha":
        return "an nn.MultiheadAttention (q, k, v and proj)"
    if p.kind == "matrix":
        return f"a matrix parameter of shape {p.shape}"
    return f"a linear layer (out, in) = {p.shape}"


def _linear(
    role: str, text: str, found: list[Part], C: int, vector: Tensor | None
) -> list[tuple[int, int]]:
    """The (out, in) of each part given for a linear role, refused where it cannot be."""
    if vector is not None and vector.dim() < 2:
        raise UserValueError(
            f"{role}={text}: a vector of shape {tuple(vector.shape)} (a bias or a norm's "
            f"weight), not {role}'s {SHAPES[role]} weight; name the weight or its module"
        )
    shapes: list[tuple[int, int]] = []
    for p in found:
        if p.kind == "norm" or (p.kind == "mha" and role in ("fc1", "fc2")):
            raise UserValueError(
                f"{role}={text}: {p.name or '(the block)'} is {_what(p)}, not a linear layer; "
                f"{role} is a {SHAPES[role]} weight"
            )
        options = {p.shape_as(False), p.shape_as(True)} - {None}
        fit = sorted(s for s in options if s is not None and fits(role, s, C))
        if options and not fit:
            raise UserValueError(
                f"{role}={text}: {p.name} is {_what(p)}, but {role} is {SHAPES[role]} with C = {C}"
            )
        shapes += fit[:1] if len(fit) == 1 else []
    return shapes if len(shapes) == len(found) else []  # [] where the orientation is unknown


def _between(roles: Mapping[str, str], fitted: Mapping[str, list[tuple[int, int]]]) -> None:
    """proj reads what q (or qkv) writes; fc2 reads what fc1 writes."""
    q = fitted.get("q") or [(s[0] // 3, s[1]) for s in fitted.get("qkv", [])]
    pairs = (("q" if "q" in fitted else "qkv", q, "proj"), ("fc1", fitted.get("fc1"), "fc2"))
    for first, writes, second in pairs:
        reads = fitted.get(second)
        if writes and reads and reads[0][1] != sum(s[0] for s in writes):
            raise UserValueError(
                f"{second}={roles[second]} reads {reads[0][1]} channels, but {first}="
                f"{roles[first]} writes {sum(s[0] for s in writes)}: {second} must read what "
                f"{first} writes"
            )


def _one_weight_one_role(
    module: nn.Module,
    roles: Mapping[str, str],
    given: Mapping[str, Given | None],
    found: Mapping[str, list[Part]],
) -> None:
    """Refuse two roles that name the same module or parameter, or overlapping slices of one.
    (ln1 and ln2 may share a norm: one LayerNorm for both branches.)"""
    shapes = {n: tuple(p.shape) for n, p in module.named_parameters()}
    held: dict[str, list[tuple[str, tuple[slice, ...] | None]]] = {}  # role -> names, slices
    for role, text in roles.items():
        g, ps = given[role], [p for p in found[role] if p.kind != "mha"]
        held[role] = [(g.path, g.slices)] if g else [(n, None) for p in ps for n in (p.params if text not in p.params else (text,))]  # fmt: skip
    for a, b in itertools.combinations(held, 2):
        for (path, sa), (other, sb) in itertools.product(held[a], held[b]):
            if path == other and _overlap(sa, sb, shapes.get(path, ())) and {a, b} != {"ln1", "ln2"}:  # fmt: skip
                what = "overlapping slices of" if sa and sb else "both name"
                raise UserValueError(
                    f"{a}={roles[a]} and {b}={roles[b]}: {what} {path}; one weight cannot be both "
                    f"{a} and {b}"
                )


def _overlap(a: tuple[slice, ...] | None, b: tuple[slice, ...] | None, shape: tuple[int, ...]) -> bool:  # fmt: skip
    if a is None or b is None or len(a) != len(b) or len(a) != len(shape):
        return True
    spans = [(x.indices(n), y.indices(n)) for x, y, n in zip(a, b, shape, strict=True)]
    return all(max(x[0], y[0]) < min(x[1], y[1]) for x, y in spans)


# ----- against the forward pass ------------------------------------------------------------------


def check_reading(module: nn.Module, C: int, read: Reading, roles: Mapping[str, str]) -> None:
    """Refuse roles that the forward pass, as ``read`` (``weights.read_block``), shows to be
    something else.

    Raises:
        UserValueError: a name the dataflow uses for another role or none, or a slice that
            does not hold the role's matrix; the message says what the forward pass shows.
    """
    held = {r: set().union(*(_ids(module, n) for n in names)) for r, names in read.params.items()}
    for role, text in roles.items():
        g = parse_given(module, text)
        path = g.path if g is not None else text
        mine = _ids(module, path)
        if not mine:
            continue  # no such part: said where the roles are resolved
        claimed = set(QKV) if role == "qkv" else {role}
        if role == "ln2" and "ln2" not in held:
            claimed = {"ln1"}  # one LayerNorm for both branches
        users = [r for r in ROLES if mine & held.get(r, set())]
        there = f" (it reads {role} from {read.names[role]})" if role in read.names else ""
        if not claimed & set(users):
            uses = f"uses {path} as {', '.join(users)}" if users else f"uses {path} for no role"
            raise UserValueError(f"{role}={text}: the forward pass {uses}, not {role}{there}")
        if g is not None:
            _holds(module, C, read, role, g)


def _ids(module: nn.Module, name: str) -> set[int]:
    """The parameters and buffers a name stands for: a parameter, a module's, or a glob's."""
    tensors = {
        **dict(module.named_buffers(remove_duplicate=False)),
        **dict(module.named_parameters(remove_duplicate=False)),
    }
    if name in tensors:
        return {id(tensors[name])}
    found = [m for n, m in module.named_modules(remove_duplicate=False) if n == name or fnmatch.fnmatchcase(n, name)]  # fmt: skip
    ids = {id(t) for m in found for t in (*m.parameters(), *m.buffers())}
    return ids | {id(t) for n, t in tensors.items() if fnmatch.fnmatchcase(n, name)}


def _holds(module: nn.Module, C: int, read: Reading, role: str, g: Given) -> None:
    """A slice given for a role must hold the matrix the forward pass uses for it."""
    part = given_part(module, C, role, g, 0)
    H = int(read.parts.fc1(torch.zeros(1, 1, C, dtype=torch.float64)).shape[-1])
    width = {"proj": read.parts.D, "fc2": H}.get(role, C)
    x = torch.randn(1, 4, width, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    if part.shape is not None and part.shape[1] != width:
        raise UserValueError(
            f"{role}={g.text}: reads {part.shape[1]} channels, but the forward pass's {role} "
            f"reads {width}"
        )
    mine = _without_bias(part.module, x)
    if role in (*QKV, "qkv"):  # q, k, v and qkv of the reading, less their biases
        zero = read.parts.qkv(torch.zeros_like(x))
        q, k, v = (a - b for a, b in zip(read.parts.qkv(x), zero, strict=True))
        theirs = {"q": q, "k": k, "v": v, "qkv": torch.cat([q, k, v], dim=-1)}
    else:
        theirs = {role: _without_bias(getattr(read.parts, role), x)}
    if _same(mine, theirs[role]):
        return
    whose = [r for r, y in theirs.items() if r != role and _same(mine, y)]
    held = f"it holds what the forward pass uses as {whose[0]}" if whose else (
        f"it is not the matrix the forward pass uses as {role}"
    )  # fmt: skip
    raise UserValueError(f"{role}={g.text}: {held}; check the slice and the layout")


def _without_bias(f: Callable[[Tensor], Tensor], h: Tensor) -> Tensor:
    return f(h) - f(torch.zeros_like(h))


def _same(a: Tensor, b: Tensor) -> bool:
    """Equal up to a factor, relative to ``b``'s scale."""
    if a.shape != b.shape:
        return False
    scale = float(b.abs().max())
    if scale == 0.0:
        return float(a.abs().max()) == 0.0
    factor = float((a * b).sum() / (b * b).sum())
    if abs(factor) < SAME:  # all but zero: not the same matrix
        return False
    return float((a - factor * b).abs().max()) <= SAME * scale * max(abs(factor), 1.0)
