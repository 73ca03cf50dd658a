"""Roles given by hand as a slice and a layout of a parameter (``--map q=attn.w[:,0:32]:in_out``).

A ``--map`` value is ``PATH[SLICES]:LAYOUT`` (docs/checker.md's table): ``PATH`` a parameter (or,
without ``[...]`` and ``:...``, a module or glob: ``mapping.resolve_roles``); one ``start:stop``
(or ``:``) per dimension of the stored tensor, no steps; ``LAYOUT`` ``out_in`` (the default,
``nn.Linear``'s) or ``in_out`` (used as ``x @ W``). A 3-D tensor is one matrix per head, heads
first, read in the layout that fits its role when none is written; the heads concatenate along
the role's per-head side, as the lesson's do. The bias is the parameter that pairs with the
weight (``weight``/``bias``, ``W_Q``/``b_Q``), sliced along the output. Each value is parsed once
(``parse_given``) for the claims (``claims``), the mapping (``fix_roles``) and the suggestion; a
matrix that does not fit its role is a ``UserValueError`` that says why.

Shapes: C channels, D attention width, H the MLP's hidden width, nh heads, hs head size.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

import torch
import torch.nn as nn

from ...errors import UserValueError
from .mapping import SHAPES, fits, resolve_roles
from .parts import Part, _affine, paired_bias

__all__ = ["Fixed", "Given", "fix_roles", "given_part", "parse_given"]

Tensor = torch.Tensor
_SPEC = re.compile(r"^(?P<path>[\w.]+)(?:\[(?P<slices>[^\]]*)\])?(?::(?P<layout>\w+))?$")
_BOUND = re.compile(r"^\s*(-?\d*)\s*(?::\s*(-?\d*)\s*)?$")


@dataclass(frozen=True)
class Given:
    """One role given as a parameter, a slice of it (one per stored dimension, or ``None``: the
    whole tensor), its layout ("": none written) and what the user wrote.

    Example:
        >>> parse_given(nn.Linear(32, 96), "weight[:, 0:32]:in_out")
        Given(path='weight', slices=(slice(None, None, None), slice(0, 32, None)), layout='in_out', text='weight[:, 0:32]:in_out')
    """

    path: str
    slices: tuple[slice, ...] | None
    layout: str
    text: str


def parse_given(module: nn.Module, text: str) -> Given | None:
    """A ``--map`` value read here (it has a slice or a layout, or names a 3-D parameter: one
    matrix per head, which no module holds), or ``None``: a name for ``resolve_roles``.

    Raises:
        UserValueError: brackets or a layout that are not well formed.

    Example:
        >>> block = nn.Linear(2, 2)
        >>> parse_given(block, "weight"), parse_given(block, "heads.*.query")  # names, globs
        (None, None)
        >>> parse_given(block, "weight:in_out").layout, parse_given(block, "weight[0:2, :]").slices
        ('in_out', (slice(0, 2, None), slice(None, None, None)))
    """
    if "[" not in text and ":" not in text:
        p = dict(module.named_parameters()).get(text)
        return Given(text, None, "", text) if p is not None and p.dim() == 3 else None
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
    slices = None
    if match["slices"] is not None:
        slices = tuple(_slice(text, s) for s in match["slices"].split(","))
    return Given(match["path"], slices, match["layout"] or "", text)


def _slice(text: str, bound: str) -> slice:
    found = _BOUND.match(bound)
    if found is None or ":" not in bound:
        raise UserValueError(
            f"--map value {text!r}: {bound.strip()!r} is not START:STOP (steps and single "
            "indices are not taken)"
        )
    start, stop = (int(s) if s else None for s in found.groups())
    return slice(start, stop)


class _Matrix(nn.Module):
    """A role's linear layer read from a live parameter at each call (so that the values the
    checker gives the block show)."""

    role: str
    weight_of: Tensor
    bias_of: Tensor | None
    given: Given

    def __init__(self, role: str, weight: nn.Parameter, bias: nn.Parameter | None, g: Given):
        super().__init__()
        # plain attributes, not parameters: the block owns them (and the checker sets them)
        self.__dict__.update(role=role, weight_of=weight, bias_of=bias, given=g)

    def canonical(self) -> tuple[Tensor, Tensor | None]:
        """(out, in) weight and (out,) bias."""
        g, w, b = self.given, self.weight_of.detach(), self.bias_of
        b = b.detach() if b is not None else None
        in_out = g.layout == "in_out"
        if g.slices is not None:
            out = g.slices[w.dim() - (1 if in_out else 2)]  # the stored dimension of the output
            w = w[g.slices]
            if b is not None:  # (nh, hs) per head: heads, output
                b = b[g.slices[0], out] if b.dim() == 2 == w.dim() - 1 else b[out]
        w = w.transpose(-1, -2) if in_out else w  # (out, in), or (nh, out_h, in_h) per head
        if w.dim() == 3:
            nh, out_h, in_h = w.shape
            if self.role == "proj":  # heads concatenate the input: (C, nh*hs)
                w = w.permute(1, 0, 2).reshape(out_h, nh * in_h)
            else:  # heads concatenate the output: (nh*hs, C)
                w = w.reshape(nh * out_h, in_h)
            b = b.reshape(-1) if b is not None else None
        return w, b

    def forward(self, h: Tensor) -> Tensor:
        return _affine(*self.canonical())(h)


def given_part(module: nn.Module, C: int, role: str, g: Given, index: int) -> Part:
    """A ``linear`` part for ``role`` read from ``g``, checked against the role; ``index`` its
    place (after the block's own parts).

    Raises:
        UserValueError: a norm, no such parameter, a slice out of range, a shape that does not fit.
    """
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
    shape = tuple(p.shape)
    if p.dim() not in (2, 3):
        raise UserValueError(
            f"{say}: {g.path} has shape {shape}; expected a matrix (out, in) / (in, out) or one "
            "per head (nh, C, hs)"
        )
    if g.slices is not None and len(g.slices) != len(shape):
        raise UserValueError(
            f"{say}: {len(g.slices)} slices for {g.path} of shape {shape}; give one per "
            "dimension (':' for all)"
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
    for layout in ("out_in", "in_out") if p.dim() == 3 and not g.layout else (g.layout,):
        m = _Matrix(role, p, named[bias] if bias else None, replace(g, layout=layout))
        w, b = m.canonical()
        if _fits(role, tuple(w.shape), C):
            break
    if not _fits(role, tuple(w.shape), C):
        raise UserValueError(
            f"{say}: reads as (out, in) = {tuple(w.shape)}, but {role} is {SHAPES[role]} with "
            f"C = {C}; check the slice, or the layout (out_in / in_out)"
        )
    if b is not None and b.numel() != w.shape[0]:  # a slice or layout that misses the bias
        raise UserValueError(
            f"{say}: its bias {bias} gives {b.numel()} values for {w.shape[0]} outputs; check "
            "the slice, or the layout (out_in / in_out)"
        )
    params = (g.path, bias) if bias else (g.path,)
    return Part(g.text, "linear", index, m, params, (int(w.shape[0]), int(w.shape[1])))


def _fits(role: str, shape: tuple[int, ...], C: int) -> bool:
    return fits(role, shape, C) and (role != "qkv" or shape[0] % 3 == 0)


@dataclass(frozen=True)
class Fixed:
    """The parts the caller's roles fix, and the block's parts left for the rest of the roles."""

    kept: list[Part]  # the block's parts, less those whose parameters are given in slices
    parts: list[Part]  # every part the mapping chooses from: ``kept``, then those of slices
    roles: dict[str, list[Part]]  # every given role -> its parts


def fix_roles(module: nn.Module, C: int, parts: list[Part], roles: Mapping[str, str]) -> Fixed:
    """The parts ``roles`` names: slices and layouts here, plain names and globs by
    ``gptblock.check.roles.mapping.resolve_roles``.

    Raises:
        UserValueError: a slice or layout that does not fit (``given_part``).
        ValueError: a plain name that matches no part.
    """
    sliced: dict[str, Part] = {}
    for role, text in roles.items():
        if (g := parse_given(module, text)) is not None:
            sliced[role] = given_part(module, C, role, g, len(parts) + len(sliced))
    covered = {n for p in sliced.values() for n in p.params}
    # a parameter given in slices is read only through them: its own part takes no role
    kept = [p for p in parts if not covered & set(p.params)]
    plain = {r: n for r, n in roles.items() if r not in sliced}
    given = {r: [p] for r, p in sliced.items()}
    return Fixed(kept, [*kept, *sliced.values()], {**resolve_roles(kept, plain), **given})
