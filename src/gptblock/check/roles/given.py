"""Roles given by hand as a slice and a layout of a parameter (``--map q=attn.w[:,0:32]:in_out``).

A ``--map`` value is ``PATH[SLICES]:LAYOUT`` (docs/checker.md's table): ``PATH`` a parameter (or,
without ``[...]`` and ``:...``, a module or glob: ``mapping.resolve_roles``); one ``start:stop``
(or ``:``) per dimension of the stored tensor, no steps; ``LAYOUT`` ``out_in`` (the default,
``nn.Linear``'s) or ``in_out`` (used as ``x @ W``). A 3-D tensor is one matrix per head, heads
first, read in the layout that fits its role when none is written; the heads concatenate along
the role's per-head side, as the lesson's do. The bias is the parameter that pairs with the
weight (``weight``/``bias``, ``W_Q``/``b_Q``), sliced along the output. A matrix that does not fit
its role is a ``UserValueError`` that says why.

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

__all__ = ["Fixed", "Given", "fix_roles", "given_parts", "is_given", "parse_given"]

Tensor = torch.Tensor
LAYOUTS = ("out_in", "in_out")
_SPEC = re.compile(r"^(?P<path>[\w.]+)(?:\[(?P<slices>[^\]]*)\])?(?::(?P<layout>\w+))?$")
_BOUND = re.compile(r"^\s*(-?\d*)\s*(?::\s*(-?\d*)\s*)?$")


@dataclass(frozen=True)
class Given:
    """One role given as a parameter, a slice of it (one per stored dimension, or ``None``: the
    whole tensor) and its layout, and what the user wrote.

    Example:
        >>> parse_given("attn.c_attn.weight[:, 0:32]:in_out")
        Given(path='attn.c_attn.weight', slices=(slice(None, None, None), slice(0, 32, None)), layout='in_out', text='attn.c_attn.weight[:, 0:32]:in_out')
    """

    path: str
    slices: tuple[slice, ...] | None
    layout: str
    text: str


def parse_given(text: str) -> Given | None:
    """The slice and layout in a ``--map`` value (a plain name: the whole tensor, out_in), or
    ``None`` for a glob.

    Raises:
        UserValueError: brackets or a layout that are not well formed.

    Example:
        >>> parse_given("attn.W_Q:in_out").layout, parse_given("heads.*.query")
        ('in_out', None)
        >>> parse_given("attn.W_Q[0:2, :, 0:8]").slices
        (slice(0, 2, None), slice(None, None, None), slice(0, 8, None))
    """
    if "[" not in text and ":" not in text:
        return None if "*" in text else Given(text, None, "out_in", text)
    match = _SPEC.match(text.strip())
    if match is None:
        raise UserValueError(
            f"--map value {text!r}: expected PATH[START:STOP, ...]:LAYOUT, e.g. "
            "attn.c_attn.weight[:, 0:32]:in_out"
        )
    layout = match["layout"] or "out_in"
    if layout not in LAYOUTS:
        raise UserValueError(f"--map value {text!r}: layout {layout!r}; expected out_in or in_out")
    slices = None
    if match["slices"] is not None:
        slices = tuple(_slice(text, s) for s in match["slices"].split(","))
    return Given(match["path"], slices, layout, text)


def is_given(module: nn.Module, text: str) -> bool:
    """Whether a ``--map`` value is read here: it has a slice or a layout, or it names a 3-D
    parameter (one matrix per head), which no module holds.

    Example:
        >>> is_given(nn.Linear(2, 2), "weight[:, 0:1]"), is_given(nn.Linear(2, 2), "weight")
        (True, False)
    """
    if "[" in text or ":" in text:
        return True
    p = dict(module.named_parameters()).get(text)
    return p is not None and p.dim() == 3


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

    def __init__(self, role: str, weight: nn.Parameter, bias: nn.Parameter | None, g: Given):
        super().__init__()
        # plain attributes, not parameters: the block owns them (and the checker sets them)
        self.__dict__.update(role=role, weight_of=weight, bias_of=bias, given=g)

    def canonical(self) -> tuple[Tensor, Tensor | None]:
        """(out, in) weight and (out,) bias."""
        g: Given = self.__dict__["given"]
        w: Tensor = self.__dict__["weight_of"].detach()
        b: Tensor | None = self.__dict__["bias_of"]
        b = b.detach() if b is not None else None
        in_out = g.layout == "in_out"
        out_dim = w.dim() - (1 if in_out else 2)  # the stored dimension that is the output
        if g.slices is not None:
            w = w[g.slices]
            if b is not None and b.dim() == 2 == w.dim() - 1:  # (nh, hs) per head: heads, output
                b = b[g.slices[0], g.slices[out_dim]]
            elif b is not None:
                b = b[g.slices[out_dim]]
        if w.dim() == 3:  # (nh, in, out) or (nh, out, in) per head
            w = w.transpose(1, 2) if in_out else w  # (nh, out_h, in_h)
            nh, out_h, in_h = w.shape
            if self.__dict__["role"] == "proj":  # heads concatenate the input: (C, nh*hs)
                w = w.permute(1, 0, 2).reshape(out_h, nh * in_h)
            else:  # heads concatenate the output: (nh*hs, C)
                w = w.reshape(nh * out_h, in_h)
            b = b.reshape(-1) if b is not None else None
        else:
            w = w.t() if in_out else w
        return w, b

    def forward(self, h: Tensor) -> Tensor:
        return _affine(*self.canonical())(h)


def given_parts(module: nn.Module, C: int, roles: Mapping[str, str], start: int) -> dict[str, Part]:
    """A ``linear`` part per role of ``roles`` (``{role: --map value}``) given with a slice or
    layout, checked against the role; numbered from ``start`` (after the block's own parts).

    Raises:
        UserValueError: no such parameter, a slice out of range, a shape that does not fit.
    """
    named = dict(module.named_parameters())
    out: dict[str, Part] = {}
    for role, text in roles.items():
        g = parse_given(text)
        if g is None:
            continue
        if role in ("ln1", "ln2"):
            raise UserValueError(f"{role}={text}: a norm is given as its module, not a slice")
        p = named.get(g.path)
        if p is None:
            near = ", ".join(n for n in named if n.rpartition(".")[2] == g.path.rpartition(".")[2])
            raise UserValueError(
                f"{role}={text}: the block has no parameter {g.path!r}"
                + (f" (parameters of that name: {near})" if near else "")
            )
        if p.dim() not in (2, 3):
            raise UserValueError(
                f"{role}={text}: {g.path} has shape {tuple(p.shape)}; expected a matrix "
                "(out, in) / (in, out) or one per head (nh, C, hs)"
            )
        if g.slices is not None:
            _check_slices(role, g, tuple(p.shape))
        if p.dim() == 3 and re.search(r":\w+$", text) is None:  # per head, no layout written
            g = _fitting(role, C, p, g)
        bias = paired_bias(named, g.path, p)
        m = _Matrix(role, p, named[bias] if bias else None, g)
        w, b = m.canonical()
        _check_fits(role, text, C, tuple(w.shape))
        if b is not None and b.numel() != w.shape[0]:  # a slice or layout that misses the bias
            raise UserValueError(
                f"{role}={text}: its bias {bias} gives {b.numel()} "
                f"values for {w.shape[0]} outputs; check the slice, or the layout (out_in / in_out)"
            )
        params = (g.path,) + ((bias or "",) if b is not None else ())
        shape = (int(w.shape[0]), int(w.shape[1]))
        out[role] = Part(text, "linear", start + len(out), m, params, shape)
    return out


def _fitting(role: str, C: int, p: nn.Parameter, g: Given) -> Given:
    """``g`` read in_out when only that layout fits the role (``W_Q`` (nh, C, hs) for q)."""
    shape = tuple(_Matrix(role, p, None, g).canonical()[0].shape)
    ok = fits(role, shape, C) and (role != "qkv" or shape[0] % 3 == 0)
    return g if ok else replace(g, layout="in_out")


def _check_slices(role: str, g: Given, shape: tuple[int, ...]) -> None:
    slices = g.slices or ()
    if len(slices) != len(shape):
        raise UserValueError(
            f"{role}={g.text}: {len(slices)} slices for {g.path} of shape {shape}; give one "
            "per dimension (':' for all)"
        )
    for s, n in zip(slices, shape, strict=True):
        start, stop = s.start or 0, n if s.stop is None else s.stop
        if not 0 <= start < stop <= n:
            raise UserValueError(
                f"{role}={g.text}: slice {start}:{stop} is out of range for a dimension of "
                f"size {n} ({g.path} has shape {shape})"
            )


def _check_fits(role: str, text: str, C: int, shape: tuple[int, ...]) -> None:
    if not fits(role, shape, C) or (role == "qkv" and shape[0] % 3):
        raise UserValueError(
            f"{role}={text}: reads as (out, in) = {shape}, but {role} is {SHAPES[role]} with "
            f"C = {C}; check the slice, or the layout (out_in / in_out)"
        )


@dataclass(frozen=True)
class Fixed:
    """The parts the caller's roles fix, and the block's parts left for the rest of the roles."""

    kept: list[Part]  # the block's parts, less those whose parameters are given in slices
    sliced: dict[str, Part]  # role -> a part read from a slice / layout
    roles: dict[str, list[Part]]  # every given role -> its parts

    @property
    def parts(self) -> list[Part]:
        """Every part the mapping chooses from."""
        return [*self.kept, *self.sliced.values()]


def fix_roles(module: nn.Module, C: int, parts: list[Part], roles: Mapping[str, str]) -> Fixed:
    """The parts ``roles`` names: slices and layouts here, plain names and globs by
    ``gptblock.check.roles.mapping.resolve_roles``.

    Raises:
        UserValueError: a slice or layout that does not fit (``given_parts``).
        ValueError: a plain name that matches no part.
    """
    explicit = {r: n for r, n in roles.items() if is_given(module, n)}
    sliced = given_parts(module, C, explicit, len(parts))
    covered = {n for p in sliced.values() for n in p.params}
    # a parameter given in slices is read only through them: its own part takes no role
    kept = [p for p in parts if not covered & set(p.params)]
    plain = {r: n for r, n in roles.items() if r not in sliced}
    return Fixed(
        kept, sliced, {**resolve_roles(kept, plain), **{r: [p] for r, p in sliced.items()}}
    )
