"""Which linear layer of a block is q, k, v (or the packed qkv), proj, fc1 and fc2.

``assign_linears`` scores every assignment of the block's linear parts (``nn.Linear`` and
linear-like modules, raw matrices; the per-head q/k/v modules and ``nn.MultiheadAttention`` are
found first) to the roles each way of making q, k, v needs (``FORMS``), on four kinds of evidence:

* shapes, a hard constraint: q/k/v (D, C), packed (3D, C), proj (C, D), fc1 (H, C), fc2 (C, H);
* names: +3 for a part whose own name suggests its role, -3 for one that suggests another; +2 /
  -2 for the enclosing module (``attn`` / ``mlp``);
* the forward pass: +1 / -1 for each step (q/k/v, proj, fc1, fc2) called after the one before;
* registration order: +-0.25 for the same steps, and +0.1 for q, k, v registered in that order.

Unused parts cost 4 each. The best assignments (several when they tie, as a raw square matrix's
two orientations always do) become the block's readings, each as ``steps.Parts``.

Shapes: C channels, D attention width, H the MLP's hidden width, hs head size.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from ..mistakes.steps import Parts
from .linear_steps import (
    Candidate,
    Heads,
    NotABlock,
    attention_module,
    build_parts,
    describe_roles,
    role_names,
)
from .parts import Part
from .vocabulary import role_hint, scope_hint

__all__ = [
    "FORMS",
    "MAX_LINEARS",
    "MAX_READINGS",
    "Linears",
    "assign_linears",
]

MAX_LINEARS = 9  # more candidate linear layers than this are not searched: pass roles instead
MAX_READINGS = 4  # tied assignments kept for the comparison to try


@dataclass(frozen=True)
class Linears:
    """What ``assign_linears`` found: readings, their names, how, and what was used."""

    readings: list[Parts]  # norms not yet filled in
    names: list[dict[str, str]]  # per reading, then per fallback
    how: list[str]
    heads: tuple[int, ...]  # the head count when the parts tell it (per-head modules, MHA)
    used: set[str]  # parameter names the roles use
    fallback: list[Parts]  # q, k, v in the other orders, when registration order decided them


ATTENTION_ROLES = ("q", "k", "v", "qkv", "proj")
FORMS = {  # the roles each way of making q, k, v needs from the block's plain linear parts
    "packed": ("qkv", "proj", "fc1", "fc2"),
    "separate": ("q", "k", "v", "proj", "fc1", "fc2"),
    "heads": ("proj", "fc1", "fc2"),
    "mha": ("fc1", "fc2"),
}


def assign_linears(
    parts: list[Part], C: int, called: Mapping[str, int], fixed: Mapping[str, list[Part]]
) -> Linears:
    """The best assignments of ``parts``' linear layers to the roles of a block of width C.

    Args:
        parts: ``parts.discover``'s list.
        C: the residual stream's width.
        called: ``parts.observe``'s call order (may be empty).
        fixed: roles the caller named (``mapping.resolve_roles``); a glob's several parts are
            per-head q, k or v.

    Raises:
        NotABlock: no assignment fits, too many parts, too many ties.
    """
    mhas = [p for p in parts if p.kind == "mha"]
    heads = _head_groups(parts, C, fixed)
    plain = [p for p in parts if p.kind in ("linear", "matrix")]
    plain = [p for p in plain if not any(p in group for group in heads)]
    single = {r: ps[0] for r, ps in fixed.items() if r not in ("ln1", "ln2") and len(ps) == 1}
    if len(mhas) > 1:
        raise NotABlock(f"{len(mhas)} nn.MultiheadAttention modules: check one block at a time")
    if len(plain) > MAX_LINEARS:
        raise NotABlock(
            f"{len(plain)} linear layers: too many to tell apart; pass --map with the roles"
        )
    forms = ["mha"] if mhas else ["heads"] if heads else ["packed", "separate"]
    if not mhas and not plain:
        raise NotABlock(
            "no attention: no nn.MultiheadAttention and no linear layers that make q, k, v and "
            "an output projection"
        )
    conventions = (False, True) if any(p.kind == "matrix" for p in plain) else (False,)
    scored = [
        c
        for form in forms
        for in_out in conventions
        for c in _assignments(form, plain, single, C, heads, mhas, called, in_out)
    ]
    if not scored:
        raise NotABlock(_no_fit(plain, mhas, heads, C))
    best = max(c.score for c in scored)
    tied = [c for c in scored if c.score >= best - 1e-9]
    if len({_key(c) for c in tied}) > MAX_READINGS:
        listed = "; ".join(describe_roles(c, heads, mhas) for c in tied[:3])
        raise NotABlock(f"the linear layers fit {len(tied)} ways equally well ({listed}, ...)")
    readings = [build_parts(c, heads, mhas, C) for c in tied]
    names = [role_names(c, heads, mhas) for c in tied]
    how = [_evidence(tied[0], heads, called, fixed)]
    if len(tied) > 1:
        how.append(f"{len(tied)} readings fit equally well and are all tried")
    used = {n for c in tied for p in c.roles.values() for n in p.params}
    used |= {n for group in heads for p in group for n in p.params}
    used |= {n for p in mhas for n in p.params}
    nh: tuple[int, ...] = (len(heads),) if heads else ()
    if mhas:
        nh = (attention_module(mhas[0]).num_heads,)
    fallback: list[Parts] = []
    if "q, k, v" in how[0] and not fixed.keys() & {"q", "k", "v"}:  # registration order decided
        for order in list(itertools.permutations(range(3)))[1:]:
            c, hs = _permuted(tied[0], heads, order)
            fallback.append(build_parts(c, hs, mhas, C))
            names.append(role_names(c, hs, mhas))
    return Linears(readings, names, how, nh, used, fallback)


def _permuted(c: Candidate, heads: Heads, order: tuple[int, ...]) -> tuple[Candidate, Heads]:
    """``c`` with q, k, v taken in ``order`` instead (per head, for per-head attention)."""
    if c.form == "heads":
        return c, [(g[order[0]], g[order[1]], g[order[2]]) for g in heads]
    q, k, v = (c.roles[r] for r in ("q", "k", "v"))
    picked = [(q, k, v)[i] for i in order]
    roles = {**c.roles, "q": picked[0], "k": picked[1], "v": picked[2]}
    return Candidate(c.form, roles, c.in_out, c.score), heads


def _head_groups(parts: list[Part], C: int, fixed: Mapping[str, list[Part]]) -> Heads:
    """Per-head (q, k, v) linear modules: groups of three (hs, C) layers under one parent."""
    if all(r in fixed for r in ("q", "k", "v")) and len(fixed["q"]) > 1:
        return list(zip(fixed["q"], fixed["k"], fixed["v"], strict=True))
    if "qkv" in fixed or any(r in fixed for r in ("q", "k", "v")):
        return []
    small = [p for p in parts if p.kind == "linear" and p.shape and p.shape[1] == C]
    small = [p for p in small if p.shape is not None and p.shape[0] < C and C % p.shape[0] == 0]
    groups: dict[tuple[str, ...], list[Part]] = {}
    for p in small:
        groups.setdefault(p.path[:-1], []).append(p)
    found = [g for g in groups.values() if len(g) == 3 and len({x.shape for x in g}) == 1]
    if len(found) < 2 or len({g[0].shape for g in found}) != 1:
        return []
    return [_qkv_order(g) for g in found]


def _qkv_order(group: list[Part]) -> tuple[Part, Part, Part]:
    """q, k, v by their names, else in registration order."""
    by_name = {r: [p for p in group if r in role_hint(p.own_name)] for r in ("q", "k", "v")}
    if (
        all(len(ps) == 1 for ps in by_name.values())
        and len({ps[0] for ps in by_name.values()}) == 3
    ):
        return by_name["q"][0], by_name["k"][0], by_name["v"][0]
    a, b, c = sorted(group, key=lambda p: p.index)
    return a, b, c


def _assignments(
    form: str,
    plain: list[Part],
    fixed: dict[str, Part],
    C: int,
    heads: Heads,
    mhas: list[Part],
    called: Mapping[str, int],
    in_out: bool,
) -> Iterator[Candidate]:
    needed = FORMS[form]
    if any(r in fixed for r in ATTENTION_ROLES if r not in needed):
        return  # the caller named a role this form does not have
    free_roles = [r for r in needed if r not in fixed]
    free_parts = [p for p in plain if p not in fixed.values()]
    for chosen in itertools.permutations(free_parts, len(free_roles)):
        roles = {
            **{r: fixed[r] for r in needed if r in fixed},
            **dict(zip(free_roles, chosen, strict=True)),
        }
        D = _fits(form, roles, C, heads, mhas, in_out)
        if D is None:
            continue
        unused = len(plain) - len(roles)
        score = _score(form, roles, heads, mhas, called) - 4.0 * unused
        yield Candidate(form, roles, in_out, score)


def _fits(
    form: str,
    roles: dict[str, Part],
    C: int,
    heads: Heads,
    mhas: list[Part],
    in_out: bool,
) -> int | None:
    """The attention width D if the shapes fit the form, else None."""
    shape = {r: p.shape_as(in_out) for r, p in roles.items()}
    if any(s is None for s in shape.values()):
        return None
    if form == "packed":
        out, inp = shape["qkv"]  # type: ignore[misc]
        D = out // 3 if inp == C and out % 3 == 0 else None
    elif form == "separate":
        D = shape["q"][0] if shape["q"] == shape["k"] == shape["v"] and shape["q"][1] == C else None  # type: ignore[index]
    elif form == "heads":
        D = sum(q.shape[0] for q, _, _ in heads if q.shape)
    else:
        E = attention_module(mhas[0]).embed_dim
        D = E if E == C else None
    if D is None:
        return None
    if "proj" in shape and shape["proj"] != (C, D):
        return None
    fc1, fc2 = shape["fc1"], shape["fc2"]
    if fc1 is None or fc2 is None or fc1[1] != C or fc2 != (C, fc1[0]):
        return None
    return D


def _score(
    form: str,
    roles: dict[str, Part],
    heads: Heads,
    mhas: list[Part],
    called: Mapping[str, int],
) -> float:
    score = 0.0
    for role, part in roles.items():
        hint = role_hint(part.own_name)
        if hint:
            score += 3.0 if role in hint else -3.0
        scope = scope_hint(part.path)
        if scope:
            score += 2.0 if scope == ("attn" if role in ATTENTION_ROLES else "mlp") else -2.0
    inputs = [roles[r] for r in ("qkv", "q", "k", "v") if r in roles]
    inputs += [p for group in heads for p in group] + mhas
    chain: list[list[Part]] = [inputs, [roles["proj"]] if "proj" in roles else [], [roles["fc1"]]]
    chain.append([roles["fc2"]])
    steps = [step for step in chain if step]
    for earlier, later in itertools.pairwise(steps):
        calls_a = [called[p.name] for p in earlier if p.name in called]
        calls_b = [called[p.name] for p in later if p.name in called]
        if calls_a and calls_b:
            score += 1.0 if max(calls_a) < min(calls_b) else -1.0
        score += 0.25 if max(p.index for p in earlier) < min(p.index for p in later) else -0.25
    if form == "separate":
        q, k, v = roles["q"].index, roles["k"].index, roles["v"].index
        score += 0.1 * ((q < k) + (k < v))
    return score


def _evidence(
    c: Candidate,
    heads: Heads,
    called: Mapping[str, int],
    fixed: Mapping[str, list[Part]],
) -> str:
    """Which evidence placed each role: the caller, its name, its module, or shapes and order."""
    by: dict[str, list[str]] = {}
    if heads and "q" in fixed:
        by["the caller (given)"] = ["q", "k", "v"]
    elif heads and all(role_hint(p.own_name) for g in heads for p in g):
        by["name, one module per head"] = ["q", "k", "v"]
    for role, part in c.roles.items():
        if role in fixed:
            kind = "the caller (given)"
        elif role in role_hint(part.own_name):
            kind = "name"
        elif scope_hint(part.path) is not None:
            kind = "enclosing module and shape"
        elif part.name in called:
            kind = "shape and call order"
        else:
            kind = "shape and registration order"
        by.setdefault(kind, []).append(role)
    unnamed = [
        p for r in ("q", "k", "v") if (p := c.roles.get(r)) and r not in role_hint(p.own_name)
    ]
    unnamed_heads = (
        heads and "q" not in fixed and not all(role_hint(p.own_name) for g in heads for p in g)
    )
    if (unnamed and not fixed.keys() & {"q", "k", "v"}) or unnamed_heads:
        by.setdefault("registration order, as names do not tell them apart", []).append("q, k, v")
    if c.form == "mha":
        by.setdefault("nn.MultiheadAttention", []).extend(["qkv", "proj"])
    return "; ".join(f"{'/'.join(roles)} by {kind}" for kind, roles in by.items())


def _key(c: Candidate) -> tuple[object, ...]:
    return (c.form, c.in_out, tuple(sorted((r, p.name) for r, p in c.roles.items())))


def _no_fit(plain: list[Part], mhas: list[Part], heads: Heads, C: int) -> str:
    shapes = ", ".join(f"{p.name or '(the block)'} {p.shape}" for p in plain)
    what = "nn.MultiheadAttention and " if mhas else ("per-head q/k/v and " if heads else "")
    return (
        f"the linear layers do not fit a pre-norm block of width {C} ({what}{shapes or 'none'}); "
        "expected q/k/v (D, C) or packed (3D, C), proj (C, D), fc1 (H, C), fc2 (C, H); "
        "pass --map ROLE=NAME if the block has them"
    )
