"""Finding the parts of a pre-norm block by their role, whatever the block calls them.

``map_roles`` takes the block's weight-holding parts (``gptblock.check.roles.parts.discover``) and
decides which is which: the two LayerNorms (``ln1`` before attention, ``ln2`` before the MLP),
the query / key / value projections (``q``, ``k``, ``v``: per head, separate or packed into one
``qkv``), the output projection ``proj`` and the MLP's two layers ``fc1`` and ``fc2``. Four kinds
of evidence decide together:

* shapes: q/k/v are (D, C) or per head (hs, C), a packed projection (3D, C), ``proj`` (C, D),
  ``fc1`` (H, C) and ``fc2`` (C, H); an assignment whose shapes do not fit is impossible;
* names (``gptblock.check.roles.vocabulary``): a part's own name (``query``, ``c_attn``, ``w_2``) and
  the module it sits in (``attn``, ``mlp``, ``ffwd``);
* the forward pass (``parts.observe``): the order in which the block calls its modules: the
  LayerNorm called first is ``ln1``, the attention's layers come before the MLP's, ``fc1`` before
  ``fc2``;
* registration order, the weakest: the tie-breaker, and the order of q, k, v when nothing else
  tells them apart (``linears.0/1/2`` are q, k, v, as every source registers them; if that
  reading reproduces nothing, the others are tried: ``MappedBlock.fallback``).

The LayerNorms are decided here; every possible assignment of the linear parts is scored by this
evidence in ``gptblock.check.roles.linears`` and the best one wins. Assignments that tie are all kept as *readings* of the block, which the reference comparison
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
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F

from ..mistakes.steps import Parts, SubLayer
from .linear_steps import LINEAR_ROLES, NotABlock
from .linears import assign_linears
from .parts import Part
from .vocabulary import norm_hint

__all__ = ["ROLES", "MappedBlock", "Unmapped", "map_roles", "resolve_roles"]

Tensor = torch.Tensor
ROLES = ("ln1", "ln2", *LINEAR_ROLES)
HEAD_ATTRIBUTES = ("num_heads", "n_head", "n_heads", "nhead", "num_attention_heads", "h", "heads")
HEAD_SIZE_ATTRIBUTES = ("head_size", "head_dim", "d_k", "hs", "d_head", "dim_head")


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
        >>> from gptblock.check.roles.parts import discover
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
        found = assign_linears(parts, C, called, fixed)
    except NotABlock as e:
        return Unmapped(str(e))
    heads = found.heads or _head_counts(module, found.readings[0].D)

    def normed(ps: list[Parts]) -> tuple[Parts, ...]:
        return tuple(Parts(p.C, p.D, p.qkv, p.proj, p.fc1, p.fc2, ln1, ln2) for p in ps)

    norm_params = {n for p in parts if p.name in norm_names.values() for n in p.params}
    ignored = tuple(n for p in parts for n in p.params if n not in found.used | norm_params)
    return MappedBlock(
        normed(found.readings),
        tuple({**norm_names, **n} for n in found.names),
        (*norm_how, *found.how),
        heads,
        ignored,
        normed(found.fallback),
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
            raise NotABlock(
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
        a_first = hinted[0] == 1 or hinted[1] == 2
        first, how = (a, b) if a_first else (b, a), "by names"
    else:
        first, how = (a, b), "by registration order"
    one, two = first
    return (one.norm(), two.norm()), {"ln1": one.name, "ln2": two.name}, [f"norms {how}"]


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
