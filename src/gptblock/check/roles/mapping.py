"""The fallback when the forward pass does not show the roles: roles by shapes and call, then
registration, order (never names), or as ``--map`` says (docs/checker.md, "When the forward pass
does not show the roles"). Shapes: C channels, D attention width, H hidden width, hs head size.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F

from ..mistakes.steps import Parts, SubLayer
from .parts import Part, glob

__all__ = ["QKV", "ROLES", "MappedBlock", "Unmapped", "map_roles"]

Tensor = torch.Tensor
Heads = list[tuple[Part, Part, Part]]  # per head, its (q, k, v) modules
# one assignment of the parts to roles: q, k, v one part each, or one per head; the others one;
# "mha": an nn.MultiheadAttention, that makes qkv and proj
Roles = dict[str, list[Part]]
ROLES = ("ln1", "ln2", "q", "k", "v", "qkv", "proj", "fc1", "fc2")
QKV = ROLES[2:5]  # told apart only by order: a form with them separate tries their other orders
SHAPES = {**dict.fromkeys(QKV, "(D, C)"), "qkv": "(3D, C)", "proj": "(C, D)", "fc1": "(H, C)",
          "fc2": "(C, H)"}  # fmt: skip
READS_C = (*QKV, "qkv", "fc1")  # the rest (proj, fc2) write C
HEAD_ATTRIBUTES = ("num_heads", "n_head", "n_heads", "nhead", "num_attention_heads", "h", "heads")
HEAD_SIZE_ATTRIBUTES = ("head_size", "head_dim", "d_k", "hs", "d_head", "dim_head")
FORMS = {  # the roles each way of making q, k, v needs from the block's plain linear parts
    "packed": ("qkv", "proj", "fc1", "fc2"),
    "separate": (*QKV, "proj", "fc1", "fc2"),
    "heads": ("proj", "fc1", "fc2"),
    "mha": ("fc1", "fc2"),
}


@dataclass(frozen=True)
class MappedBlock:
    """A block's parts in their roles (``readings.Readings``: however they were found)."""

    readings: tuple[Parts, ...]  # most likely first
    fallback: tuple[Parts, ...]  # q/k/v in the other orders
    heads: tuple[int, ...]  # head counts to try, most likely first
    x: Tensor  # (B, T, C) float64: the input to compare on
    describe: Callable[[int], str]  # the roles note for a reading (then for a fallback)
    names: tuple[dict[str, str], ...] = ()  # per reading, then per fallback: role -> its names
    ignored: tuple[str, ...] = ()  # parameters no role uses


class Unmapped(Exception):
    """Why the parts are no block (its text): raised while mapping, returned by ``map_roles``."""


def _width(roles: Roles, C: int) -> int:
    """D, where the parts' shapes fit a block of width C (q, k, v all one shape), else 0."""
    linear = [(r, p.shape) for r, ps in roles.items() if r != "mha" for p in ps]
    shape = {r: s for r, s in linear if s and fits(r, s, C)}
    if len(shape) < len(roles) - ("mha" in roles) or len({s for r, s in linear if r in QKV}) > 1:
        return 0
    if "mha" in roles:
        D = C if roles["mha"][0].mha.embed_dim == C else 0
    else:
        D = shape["qkv"][0] // 3 if "qkv" in shape else shape["q"][0] * len(roles["q"])
    return D if shape.get("proj", (C, D)) == (C, D) and shape["fc2"] == (C, shape["fc1"][0]) else 0


def _order_score(roles: Roles, called: Mapping[str, int]) -> float:
    """+1 per step called after the one before it (-1 before), +0.25 registered so."""
    inputs = [p for r in ("mha", "qkv", *QKV) for p in roles.get(r, [])]  # they make q, k, v
    steps = [inputs, *(roles[r] for r in ("proj", "fc1", "fc2") if r in roles)]
    score = 0.0
    for earlier, later in itertools.pairwise(steps):
        calls_a = [called[p.name] for p in earlier if p.name in called]
        calls_b = [called[p.name] for p in later if p.name in called]
        if calls_a and calls_b:
            score += 1.0 if max(calls_a) < min(calls_b) else -1.0
        score += 0.25 if max(p.index for p in earlier) < min(p.index for p in later) else -0.25
    if "q" in roles:
        q, k, v = (roles[r][0].index for r in QKV)
        score += 0.1 * ((q < k) + (k < v))
    return score


def _build(roles: Roles, C: int, lns: tuple[SubLayer | None, SubLayer | None]) -> Parts:
    fs = {r: [p.function() for p in ps] for r, ps in roles.items() if r != "mha"}
    one = {r: f[0] for r, f in fs.items()}
    packed, proj = roles["mha"][0].attention() if "mha" in roles else (one.get("qkv"), one["proj"])

    def qkv(h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        if packed is not None:
            q, k, v = packed(h).chunk(3, dim=-1)  # (B, T, 3D) -> 3 x (B, T, D)
            return q, k, v
        # each role's heads: nh x (B, T, hs) -> (B, T, D)
        q, k, v = (torch.cat([f(h) for f in fs[r]], dim=-1) for r in QKV)
        return q, k, v

    return Parts(C, _width(roles, C), qkv, proj, one["fc1"], one["fc2"], *lns)


def _names(roles: Roles) -> dict[str, str]:
    names = {r: glob([p.name for p in roles[r]]) for r in ROLES if r in roles}  # 'sa.heads.*.query'
    if "mha" in roles:
        prefix = f"{roles['mha'][0].name}." if roles["mha"][0].name else ""
        names = {"qkv": f"{prefix}in_proj_weight", "proj": f"{prefix}out_proj", **names}
    return names


def fits(role: str, shape: tuple[int, ...], C: int) -> bool:
    """Whether (out, in) ``shape`` reads C (q, k, v, qkv, fc1) or writes C (proj, fc2)."""
    if role == "qkv" and shape[0] % 3:
        return False
    return shape[1] == C if role in READS_C else shape[0] == C


def map_roles(
    module: nn.Module,
    C: int,
    parts: list[Part],
    called: Mapping[str, int],
    roles: Mapping[str, list[Part]] | None = None,
    T: int = 7,
) -> MappedBlock | Unmapped:
    """``parts`` in their roles in a block of width ``C``, by ``called`` (``parts.observe``'s
    order, may be empty), with ``roles`` fixed by the caller; ties are all kept, and q, k, v's
    other orders (only order tells them apart) are the ``fallback``; compared on x (T, T, C)."""
    fixed = dict(roles or {})
    try:
        norms, chosen = _norms(parts, C, called, fixed)
        tied = _assign(parts, C, called, fixed)
    except Unmapped as e:
        return e
    plain: SubLayer = lambda h: F.layer_norm(h, (C,))  # noqa: E731
    n1, n2 = (p.function() if p else None for p in norms) if norms else (plain, plain)
    norm_names = {r: p.name for r, p in zip(("ln1", "ln2"), norms, strict=False) if p}
    first = tied[0]
    given = [r for r in ROLES[2:] if r in fixed]
    by = f"{'/'.join(given)} by the caller (given); " if given else ""
    by += "qkv/proj by nn.MultiheadAttention; " if "mha" in first else ""
    ran = any(p.name in called for r, ps in first.items() if r != "mha" for p in ps)
    how = [chosen, f"{by}the others by shape and {'call' if ran else 'registration'} order"]
    others = []  # q, k, v in their other orders: only order tells them apart
    if "q" in first and not fixed.keys() & set(QKV):
        how[-1] += "; q, k, v by registration order, the other orders tried too"
        for swapped in list(itertools.permutations(QKV))[1:]:
            others.append(first | dict(zip(QKV, map(first.__getitem__, swapped), strict=True)))
    if len(tied) > 1:
        how.append(f"{len(tied)} readings fit equally well and are all tried")
    readings = [_build(c, C, (n1, n2)) for c in [*tied, *others]]
    used = {n for c in tied for p in [*norms, *itertools.chain(*c.values())] if p for n in p.params}
    per_head = first.get("q", [])  # one q module per head: as many heads
    if "mha" in first:
        nh: tuple[int, ...] = (first["mha"][0].mha.num_heads,)
    else:
        nh = (len(per_head),) if len(per_head) > 1 else _head_counts(module, readings[0].D)
    names = tuple({**norm_names, **_names(c)} for c in [*tied, *others])
    ignored = tuple(n for p in parts for n in p.params if n not in used)
    said = f" ({'; '.join(how)})"
    said += f"; parameters with no role: {', '.join(ignored)}" if ignored else ""

    def describe(reading: int = 0) -> str:
        return f"roles: {', '.join(f'{r}={n}' for r, n in names[reading].items())}{said}"

    # (no fresh weights here: the checker chose every parameter's value before the probes ran,
    # and the weights read must be those values: gptblock.check.roles.provenance)
    x = torch.randn(T, T, C, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    main, fallback = tuple(readings[: len(tied)]), tuple(readings[len(tied) :])
    return MappedBlock(main, fallback, nh, x, describe, names, ignored)


def _norms(
    parts: list[Part], C: int, called: Mapping[str, int], fixed: dict[str, list[Part]]
) -> tuple[list[Part | None], str]:
    """ln1's and ln2's parts ([]: F.layer_norm; ln2 None: ln1's for both), and how."""
    if "ln1" in fixed or "ln2" in fixed:
        given = [fixed[r][0] if r in fixed else None for r in ("ln1", "ln2")]
        return given, f"{'/'.join(r for r in ('ln1', 'ln2') if r in fixed)} by the caller (given)"
    found = [p for p in parts if p.kind == "norm" and p.width in (None, C)]
    if not found:
        return [], "no LayerNorm module: F.layer_norm without weights assumed"
    if len(found) == 1:
        return [found[0], None], "one LayerNorm for both branches"
    used = sorted((p for p in found if p.name in called), key=lambda p: called[p.name])
    if len(found) > 2 and len(used) != 2:
        listed = ", ".join(p.name for p in found)
        raise Unmapped(
            f"{len(found)} LayerNorms ({listed}): cannot tell which two are the block's; "
            "pass --map ln1=NAME ln2=NAME"
        )
    orders = ("by registration order", "by the forward pass (one unused)", "by the forward pass")
    return [*(used + [p for p in found if p not in used])[:2]], f"norms {orders[len(used)]}"


def _head_counts(module: nn.Module, D: int) -> tuple[int, ...]:
    """Those an attribute of a submodule (or its ``config``) names, else all divisors."""
    named: set[int] = set()
    for sub in module.modules():
        for owner in (sub, getattr(sub, "config", None)):
            for attr in HEAD_ATTRIBUTES + HEAD_SIZE_ATTRIBUTES:
                value = getattr(owner, attr, None)
                if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                    continue
                n = value if attr in HEAD_ATTRIBUTES else D // value if D % value == 0 else 0
                if n >= 1 and D % n == 0:
                    named.add(n)
    return tuple(sorted(named)) or tuple(n for n in range(1, D + 1) if D % n == 0)


def _assign(
    parts: list[Part], C: int, called: Mapping[str, int], fixed: Mapping[str, list[Part]]
) -> list[Roles]:
    heads = _head_groups(parts, C, fixed)
    mhas = [p for p in parts if p.kind == "mha"]
    grouped = {r: [g[i] for g in heads] for i, r in enumerate(QKV)} if heads else {}
    plain = [p for p in parts if p.kind in ("linear", "matrix") and not any(p in g for g in heads)]
    single = {r: ps[0] for r, ps in fixed.items() if r not in ("ln1", "ln2") and len(ps) == 1}
    if len(mhas) > 1:
        raise Unmapped(f"{len(mhas)} nn.MultiheadAttention modules: check one block at a time")
    if mhas and (mhas[0].mha.bias_k is not None or mhas[0].mha.add_zero_attn):
        raise Unmapped(
            "nn.MultiheadAttention with add_bias_kv / add_zero_attn attends to an extra learned "
            "position: not the lessons' block"
        )
    if len(plain) > 9:  # too many permutations to search
        raise Unmapped(
            f"{len(plain)} linear layers: too many to tell apart; pass --map with the roles"
        )
    if not mhas and not plain:
        raise Unmapped(
            "no attention: no nn.MultiheadAttention and no linear layers that make q, k, v and "
            "an output projection"
        )
    forms = ["mha"] if mhas else ["heads"] if heads else ["packed", "separate"]
    conventions = (False, True) if any(p.kind == "matrix" for p in plain) else (False,)
    scored: list[tuple[float, Roles]] = []
    for form, in_out in itertools.product(forms, conventions):
        needed = FORMS[form]
        if any(r in single for r in ROLES[2:7] if r not in needed):
            continue  # the caller named a role this form does not have
        free = [r for r in needed if r not in single]
        rest = [p.laid(in_out) for p in plain if p not in single.values()]
        for chosen in itertools.permutations(rest, len(free)):
            roles = {r: [single[r].laid(in_out)] for r in needed if r in single}
            roles |= {r: [p] for r, p in zip(free, chosen, strict=True)}
            unused = len(plain) - len(roles)
            roles |= {"mha": mhas} if mhas else grouped
            if _width(roles, C):
                scored.append((_order_score(roles, called) - 4.0 * unused, roles))
    if not scored:
        shapes = ", ".join(f"{p.name or '(the block)'} {p.shape}" for p in plain)
        what = "nn.MultiheadAttention and " if mhas else ("per-head q/k/v and " if heads else "")
        raise Unmapped(
            f"the linear layers do not fit a pre-norm block of width {C} ({what}"
            f"{shapes or 'none'}); expected q/k/v (D, C) or packed (3D, C), proj (C, D), "
            "fc1 (H, C), fc2 (C, H); pass --map ROLE=NAME if the block has them"
        )
    best = max(score for score, _ in scored)
    tied = [c for score, c in scored if score >= best - 1e-9]
    if len({tuple(_names(c).items()) for c in tied}) > 4:  # more than the comparison should try
        listed = "; ".join(", ".join(f"{r}={n}" for r, n in _names(c).items()) for c in tied[:3])
        raise Unmapped(f"the linear layers fit {len(tied)} ways equally well ({listed}, ...)")
    return tied


def _head_groups(parts: list[Part], C: int, fixed: Mapping[str, list[Part]]) -> Heads:
    """Per-head (q, k, v): groups of three (hs, C) linear modules under one parent."""
    given = [fixed[r] for r in QKV if r in fixed]
    if len(given) == 3 and len(given[0]) > 1:
        return list(zip(*given, strict=True))
    if given or "qkv" in fixed:
        return []
    small = [p for p in parts if p.kind == "linear" and p.shape and p.shape[1] == C]
    small = [p for p in small if p.shape is not None and p.shape[0] < C and C % p.shape[0] == 0]
    groups: dict[str, list[Part]] = {}
    for p in small:
        groups.setdefault(p.name.rpartition(".")[0], []).append(p)
    found = [g for g in groups.values() if len(g) == 3 and len({x.shape for x in g}) == 1]
    if len(found) < 2 or len({g[0].shape for g in found}) != 1:
        return []
    return [(g[0], g[1], g[2]) for g in found]
