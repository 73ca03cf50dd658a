"""Finding the parts of a pre-norm block by their role, whatever the block calls them.

``map_roles`` takes the block's weight-holding parts (``gptblock.check.parts.discover``) and
decides which is which: the two LayerNorms (``ln1`` before attention, ``ln2`` before the MLP),
the query / key / value projections (``q``, ``k``, ``v``: per head, separate or packed into one
``qkv``), the output projection ``proj`` and the MLP's two layers ``fc1`` and ``fc2``. Four kinds
of evidence decide together:

* shapes: q/k/v are (D, C) or per head (hs, C), a packed projection (3D, C), ``proj`` (C, D),
  ``fc1`` (H, C) and ``fc2`` (C, H); an assignment whose shapes do not fit is impossible;
* names (``gptblock.check.vocabulary``): a part's own name (``query``, ``c_attn``, ``w_2``) and
  the module it sits in (``attn``, ``mlp``, ``ffwd``);
* the forward pass (``parts.observe``): the order in which the block calls its modules: the
  LayerNorm called first is ``ln1``, the attention's layers come before the MLP's, ``fc1`` before
  ``fc2``;
* registration order, the weakest: the tie-breaker, and the order of q, k, v when nothing else
  tells them apart (``linears.0/1/2`` are q, k, v, as every source registers them).

Every possible assignment of the linear parts is scored by this evidence and the best one wins.
Assignments that tie are all kept as *readings* of the block, which the reference comparison
tries in turn (a raw matrix parameter's orientation, (out, in) or (in, out), is never in its
name, so both are tried). Where the parts cannot be told apart at all, ``Unmapped`` says what
could not be decided, and ``roles`` (``gptblock check --map ROLE=NAME``) settles it.

The head count is not in the weights: it is the number of per-head modules, an
``nn.MultiheadAttention``'s ``num_heads``, an attribute (``n_head``, ``num_heads``, ``h``, a
head size ``head_size`` / ``d_k``, also on a ``config``), or else every divisor of D is tried.

Shapes: C channels, D attention width, H the MLP's hidden width, nh heads, hs head size.
"""

from __future__ import annotations

import fnmatch
import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F

from .parts import Part
from .steps import QKV, Parts, SubLayer
from .vocabulary import norm_hint, role_hint, scope_hint

__all__ = ["ROLES", "MappedBlock", "Unmapped", "map_roles", "resolve_roles"]

Tensor = torch.Tensor
ROLES = ("ln1", "ln2", "q", "k", "v", "qkv", "proj", "fc1", "fc2")
HEAD_ATTRIBUTES = ("num_heads", "n_head", "n_heads", "nhead", "num_attention_heads", "h", "heads")
HEAD_SIZE_ATTRIBUTES = ("head_size", "head_dim", "d_k", "hs", "d_head", "dim_head")
MAX_LINEARS = 9  # more candidate linear layers than this are not searched: pass roles instead
MAX_READINGS = 4  # tied assignments kept for the comparison to try


@dataclass(frozen=True)
class MappedBlock:
    """A block's parts in their roles: one or more readings for the comparison to try."""

    readings: tuple[Parts, ...]  # most likely first
    names: tuple[dict[str, str], ...]  # per reading, then per fallback: role -> the block's names
    how: tuple[str, ...]  # what decided the roles, and what was assumed
    heads: tuple[int, ...]  # head counts to try, most likely first
    ignored: tuple[str, ...]  # parameters no role uses
    fallback: tuple[Parts, ...] = ()  # q/k/v in the other orders, when names did not tell them

    def describe(self, reading: int = 0) -> str:
        """'roles: ln1=ln_1, ln2=ln_2, qkv=attn.c_attn, ...; how they were decided'."""
        roles = ", ".join(f"{r}={n}" for r, n in self.names[reading].items())
        text = f"roles: {roles}"
        if self.how:
            text += f" ({'; '.join(self.how)})"
        if self.ignored:
            text += f"; parameters with no role: {', '.join(self.ignored)}"
        return text


@dataclass(frozen=True)
class Unmapped:
    """Why a block's parts could not be given their roles."""

    reason: str


class _Unmappable(Exception):
    """The parts do not make a pre-norm block, or cannot be told apart; the message says why."""


def resolve_roles(parts: list[Part], roles: Mapping[str, str]) -> dict[str, list[Part]]:
    """The parts named by ``{role: name}`` (a part's name, one of its parameters, or a glob
    such as ``heads.*.query`` for one part per head, in registration order).

    Raises:
        ValueError: an unknown role, or a name that matches no part.
    """
    out: dict[str, list[Part]] = {}
    for role, name in roles.items():
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; the roles are {', '.join(ROLES)}")
        found = [p for p in parts if p.name == name or name in p.params]
        found = found or [p for p in parts if fnmatch.fnmatchcase(p.name, name)]
        if not found:
            known = ", ".join(p.name or "(the block)" for p in parts[:16])
            raise ValueError(f"{role}={name}: no such part; the block's parts are {known}")
        out[role] = found
    if "qkv" in out and out.keys() & {"q", "k", "v"}:
        raise ValueError("give either qkv (packed) or q, k and v, not both")
    return out


def map_roles(
    module: nn.Module,
    C: int,
    parts: list[Part],
    called: Mapping[str, int],
    roles: Mapping[str, list[Part]] | None = None,
) -> MappedBlock | Unmapped:
    """Give the block's parts their roles.

    Args:
        module: the block (its attributes may name the head count).
        C: the width of its residual stream.
        parts: ``parts.discover(module)``.
        called: ``parts.observe``'s call order (may be empty).
        roles: parts fixed by the caller (``resolve_roles``); they are taken as given.

    Returns:
        ``MappedBlock``, or ``Unmapped`` saying what could not be decided.

    Example:
        >>> from gptblock import TransformerBlock
        >>> from gptblock.check.parts import discover
        >>> block = TransformerBlock(16, 2)
        >>> mapped = map_roles(block, 16, discover(block), {})
        >>> mapped.names[0]["qkv"], mapped.heads
        ('self_attn.in_proj_weight', (2,))
        >>> print(map_roles(nn.Linear(16, 16), 16, discover(nn.Linear(16, 16)), {}).reason)
        the linear layers do not fit a pre-norm block of width 16 ((the block) (16, 16)); expected
        q/k/v (D, C) or packed (3D, C), proj (C, D), fc1 (H, C), fc2 (C, H); pass --map ROLE=NAME if
        the block has them
    """
    fixed = dict(roles or {})
    try:
        (ln1, ln2), norm_names, norm_how = _norms(parts, C, called, fixed)
        readings, names, how, heads_found, used, fallback = _linears(parts, C, called, fixed)
    except _Unmappable as e:
        return Unmapped(str(e))
    heads = heads_found or _head_counts(module, readings[0].D)

    def normed(ps: list[Parts]) -> tuple[Parts, ...]:
        return tuple(Parts(p.C, p.D, p.qkv, p.proj, p.fc1, p.fc2, ln1, ln2) for p in ps)

    used |= {
        n for p in parts if p.kind == "norm" and p.name in norm_names.values() for n in p.params
    }
    ignored = tuple(n for p in parts for n in p.params if n not in used)
    return MappedBlock(
        normed(readings),
        tuple({**norm_names, **n} for n in names),
        (*norm_how, *how),
        heads,
        ignored,
        normed(fallback),
    )


# ----- the LayerNorms ----------------------------------------------------------------------------


def _plain_norm(C: int) -> SubLayer:
    return lambda h: F.layer_norm(h, (C,))


def _norms(
    parts: list[Part], C: int, called: Mapping[str, int], fixed: dict[str, list[Part]]
) -> tuple[tuple[SubLayer | None, SubLayer | None], dict[str, str], list[str]]:
    """(ln1, ln2), their names and how they were told apart."""
    if "ln1" in fixed or "ln2" in fixed:
        ln1 = fixed["ln1"][0] if "ln1" in fixed else None
        ln2 = fixed["ln2"][0] if "ln2" in fixed else None
        found = [p for p in (ln1, ln2) if p is not None]
        names = {r: p.name for r, p in (("ln1", ln1), ("ln2", ln2)) if p is not None}
        return (
            (ln1.norm() if ln1 else None, ln2.norm() if ln2 else None),
            names,
            [f"{'/'.join(names)} by the caller (given)"] if found else [],
        )
    norms = [p for p in parts if p.kind == "norm" and p.width in (None, C)]
    if not norms:
        plain = _plain_norm(C)
        return (plain, plain), {}, ["no LayerNorm module: F.layer_norm without weights assumed"]
    if len(norms) == 1:
        return (norms[0].norm(), None), {"ln1": norms[0].name}, ["one LayerNorm for both branches"]
    hinted = {n: norm_hint(p.path) for n, p in enumerate(norms)}
    if len(norms) > 2:
        ones = [p for n, p in enumerate(norms) if hinted[n] == 1]
        twos = [p for n, p in enumerate(norms) if hinted[n] == 2]
        used = sorted((p for p in norms if p.name in called), key=lambda p: called[p.name])
        if (len(ones) != 1 or len(twos) != 1) and len(used) == 2:
            ones, twos = used[:1], used[1:]  # the only two the forward pass calls
        if len(ones) != 1 or len(twos) != 1:
            listed = ", ".join(p.name for p in norms)
            raise _Unmappable(
                f"{len(norms)} LayerNorms ({listed}): cannot tell which two are the block's; "
                "pass --map ln1=NAME ln2=NAME"
            )
        norms, hinted = [ones[0], twos[0]], {0: 1, 1: 2}
    a, b = norms
    if a.name in called and b.name in called:
        first, how = (a, b) if called[a.name] < called[b.name] else (b, a), "by the forward pass"
    elif (a.name in called) != (b.name in called) and hinted[0] is None:
        first, how = (a, b) if a.name in called else (b, a), "by the forward pass (one unused)"
    elif hinted[0] or hinted[1]:
        first, how = (a, b) if (hinted[0] or 3 - (hinted[1] or 2)) == 1 else (b, a), "by names"
    else:
        first, how = (a, b), "by registration order"
    one, two = first
    return (one.norm(), two.norm()), {"ln1": one.name, "ln2": two.name}, [f"norms {how}"]


# ----- the linear layers -------------------------------------------------------------------------

ATTENTION_ROLES = ("q", "k", "v", "qkv", "proj")
FORMS = {  # the roles each way of making q, k, v needs from the block's plain linear parts
    "packed": ("qkv", "proj", "fc1", "fc2"),
    "separate": ("q", "k", "v", "proj", "fc1", "fc2"),
    "heads": ("proj", "fc1", "fc2"),
    "mha": ("fc1", "fc2"),
}


@dataclass(frozen=True)
class _Candidate:
    form: str
    roles: dict[str, Part]
    in_out: bool  # raw matrices read as stored (in, out)
    score: float


def _linears(
    parts: list[Part], C: int, called: Mapping[str, int], fixed: dict[str, list[Part]]
) -> tuple[list[Parts], list[dict[str, str]], list[str], tuple[int, ...], set[str], list[Parts]]:
    mhas = [p for p in parts if p.kind == "mha"]
    heads = _head_groups(parts, C, fixed)
    plain = [p for p in parts if p.kind in ("linear", "matrix")]
    plain = [p for p in plain if not any(p in group for group in heads)]
    single = {r: ps[0] for r, ps in fixed.items() if r not in ("ln1", "ln2") and len(ps) == 1}
    if len(mhas) > 1:
        raise _Unmappable(f"{len(mhas)} nn.MultiheadAttention modules: check one block at a time")
    if len(plain) > MAX_LINEARS:
        raise _Unmappable(
            f"{len(plain)} linear layers: too many to tell apart; pass --map with the roles"
        )
    forms = ["mha"] if mhas else [f for f in ("packed", "separate") if True]
    if heads and not mhas:
        forms = ["heads"]
    if not mhas and not plain:
        raise _Unmappable(
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
        raise _Unmappable(_no_fit(plain, mhas, heads, C))
    best = max(c.score for c in scored)
    tied = [c for c in scored if c.score >= best - 1e-9]
    if len({_key(c) for c in tied}) > MAX_READINGS:
        listed = "; ".join(_describe_roles(c, heads, mhas) for c in tied[:3])
        raise _Unmappable(f"the linear layers fit {len(tied)} ways equally well ({listed}, ...)")
    readings = [_build(c, heads, mhas, C) for c in tied]
    names = [_names(c, heads, mhas) for c in tied]
    how = [_evidence(tied[0], heads, called, fixed)]
    if len(tied) > 1:
        how.append(f"{len(tied)} readings fit equally well and are all tried")
    used = {n for c in tied for p in c.roles.values() for n in p.params}
    used |= {n for group in heads for p in group for n in p.params}
    used |= {n for p in mhas for n in p.params}
    nh: tuple[int, ...] = (len(heads),) if heads else ()
    if mhas:
        nh = (_attention_module(mhas[0]).num_heads,)
    fallback: list[Parts] = []
    if "q, k, v" in how[0] and not fixed.keys() & {"q", "k", "v"}:  # registration order decided
        for order in list(itertools.permutations(range(3)))[1:]:
            c, hs = _permuted(tied[0], heads, order)
            fallback.append(_build(c, hs, mhas, C))
            names.append(_names(c, hs, mhas))
    return readings, names, how, nh, used, fallback


def _permuted(
    c: _Candidate, heads: list[tuple[Part, Part, Part]], order: tuple[int, ...]
) -> tuple[_Candidate, list[tuple[Part, Part, Part]]]:
    """``c`` with q, k, v taken in ``order`` instead (per head, for per-head attention)."""
    if c.form == "heads":
        return c, [(g[order[0]], g[order[1]], g[order[2]]) for g in heads]
    q, k, v = (c.roles[r] for r in ("q", "k", "v"))
    picked = [(q, k, v)[i] for i in order]
    roles = {**c.roles, "q": picked[0], "k": picked[1], "v": picked[2]}
    return _Candidate(c.form, roles, c.in_out, c.score), heads


def _head_groups(
    parts: list[Part], C: int, fixed: dict[str, list[Part]]
) -> list[tuple[Part, Part, Part]]:
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
    heads: list[tuple[Part, Part, Part]],
    mhas: list[Part],
    called: Mapping[str, int],
    in_out: bool,
) -> Iterator[_Candidate]:
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
        yield _Candidate(form, roles, in_out, score)


def _fits(
    form: str,
    roles: dict[str, Part],
    C: int,
    heads: list[tuple[Part, Part, Part]],
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
        E = _attention_module(mhas[0]).embed_dim
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
    heads: list[tuple[Part, Part, Part]],
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
    c: _Candidate,
    heads: list[tuple[Part, Part, Part]],
    called: Mapping[str, int],
    fixed: Mapping[str, list[Part]],
) -> str:
    """Which evidence placed each role: the caller, its name, its module, or shapes and order."""
    by: dict[str, list[str]] = {}
    if heads and "q" in fixed:
        by["the caller (given)"] = ["q", "k", "v"]
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


def _key(c: _Candidate) -> tuple[object, ...]:
    return (c.form, c.in_out, tuple(sorted((r, p.name) for r, p in c.roles.items())))


def _build(c: _Candidate, heads: list[tuple[Part, Part, Part]], mhas: list[Part], C: int) -> Parts:
    lin = {r: p.linear(c.in_out) for r, p in c.roles.items()}
    if c.form == "mha":
        qkv, proj, D = _mha(_attention_module(mhas[0]))
    elif c.form == "heads":
        fs = [tuple(p.linear() for p in group) for group in heads]

        def qkv(h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            outs = [[f(h) for f in group] for group in fs]  # nh x 3 x (B, T, hs)
            q, k, v = (torch.cat([o[i] for o in outs], dim=-1) for i in range(3))  # (B, T, D)
            return q, k, v

        proj, D = lin["proj"], sum(q.shape[0] for q, _, _ in heads if q.shape)
    elif c.form == "packed":
        packed = lin["qkv"]

        def qkv(h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            q, k, v = packed(h).chunk(3, dim=-1)  # (B, T, 3D) -> 3 x (B, T, D)
            return q, k, v

        proj, D = lin["proj"], c.roles["qkv"].shape_as(c.in_out)[0] // 3  # type: ignore[index]
    else:
        fq, fk, fv = lin["q"], lin["k"], lin["v"]

        def qkv(h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            return fq(h), fk(h), fv(h)

        proj, D = lin["proj"], c.roles["q"].shape_as(c.in_out)[0]  # type: ignore[index]
    return Parts(C, D, qkv, proj, lin["fc1"], lin["fc2"], None, None)


def _attention_module(part: Part) -> nn.MultiheadAttention:
    if not isinstance(part.module, nn.MultiheadAttention):
        raise TypeError(f"{part.name} is not an nn.MultiheadAttention")
    return part.module


def _mha(mha: nn.MultiheadAttention) -> tuple[QKV, SubLayer, int]:
    """q/k/v and the output projection of an nn.MultiheadAttention, from its weights."""
    if getattr(mha, "bias_k", None) is not None or getattr(mha, "add_zero_attn", False):
        raise _Unmappable(
            "nn.MultiheadAttention with add_bias_kv / add_zero_attn attends to an extra learned "
            "position: not the lessons' block"
        )
    E = int(mha.embed_dim)
    if mha._qkv_same_embed_dim:
        w = mha.in_proj_weight.detach()  # (3E, E)
    else:
        w = torch.cat([mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight]).detach()
    b = mha.in_proj_bias.detach() if mha.in_proj_bias is not None else None
    wo = mha.out_proj.weight.detach()  # (E, E)
    bo = mha.out_proj.bias.detach() if mha.out_proj.bias is not None else None

    def qkv(h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        bias = b.to(h.dtype) if b is not None else None
        q, k, v = F.linear(h, w.to(h.dtype), bias).chunk(3, dim=-1)  # (B, T, 3E) -> 3 x (B, T, E)
        return q, k, v

    def proj(y: Tensor) -> Tensor:
        return F.linear(y, wo.to(y.dtype), bo.to(y.dtype) if bo is not None else None)

    return qkv, proj, E


def _names(c: _Candidate, heads: list[tuple[Part, Part, Part]], mhas: list[Part]) -> dict[str, str]:
    names: dict[str, str] = {}
    if c.form == "mha":
        names["qkv"] = f"{_prefix(mhas[0].name)}in_proj_weight"
        names["proj"] = f"{_prefix(mhas[0].name)}out_proj"
    if c.form == "heads":
        for i, role in enumerate(("q", "k", "v")):
            names[role] = _pattern([g[i].name for g in heads])
    for role in ROLES:
        if role in c.roles:
            part = c.roles[role]
            names[role] = part.name + (" (in, out)" if part.kind == "matrix" and c.in_out else "")
    return names


def _describe_roles(c: _Candidate, heads: list[tuple[Part, Part, Part]], mhas: list[Part]) -> str:
    return ", ".join(f"{r}={n}" for r, n in _names(c, heads, mhas).items())


def _prefix(name: str) -> str:
    return f"{name}." if name else ""


def _pattern(names: list[str]) -> str:
    """'sa.heads.*.query' for 'sa.heads.0.query', 'sa.heads.1.query', ..."""
    split = [n.split(".") for n in names]
    if len({len(s) for s in split}) != 1:
        return ", ".join(names)
    common = [parts[0] if len(set(parts)) == 1 else "*" for parts in zip(*split, strict=True)]
    return ".".join(common)


def _no_fit(
    plain: list[Part], mhas: list[Part], heads: list[tuple[Part, Part, Part]], C: int
) -> str:
    shapes = ", ".join(f"{p.name or '(the block)'} {p.shape}" for p in plain)
    what = "nn.MultiheadAttention and " if mhas else ("per-head q/k/v and " if heads else "")
    return (
        f"the linear layers do not fit a pre-norm block of width {C} ({what}{shapes or 'none'}); "
        "expected q/k/v (D, C) or packed (3D, C), proj (C, D), fc1 (H, C), fc2 (C, H); "
        "pass --map ROLE=NAME if the block has them"
    )


def _head_counts(module: nn.Module, D: int) -> tuple[int, ...]:
    """Head counts named by an attribute of any submodule (or its ``config``), else all divisors."""
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
    if named:
        return tuple(sorted(named))
    return tuple(n for n in range(1, D + 1) if D % n == 0)
