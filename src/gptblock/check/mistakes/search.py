"""``explain``: the smallest set of catalogued mistakes whose variant reproduces a block, under
every head count, activation and reading not ruled out; others of that size are alternatives."""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import torch

from .catalogue import LESSONS, compose
from .report import CAUGHT
from .steps import (
    CANDIDATE_ACTIVATIONS,
    Deviation,
    MissingPart,
    Parts,
    Rope,
    attention,
    run_steps,
    way,
)

__all__ = ["MIN_DEFINED", "TOLERANCE", "Explanation", "Match", "distance", "explain", "smallest"]

Tensor = torch.Tensor
M = TypeVar("M")

TOLERANCE = 1e-4
"""Relative to the largest output entry: float64 agrees to ~1e-12, float32 to ~1e-6, different
diagnoses differ by more than 1e-2 (tests/test_check_search.py); exact and tanh GELU by less."""


MIN_DEFINED = 0.5
"""A variant NaN at more than half of the positions (a mask blocking whole rows) is no evidence."""


def fitted_scale(ratio: float) -> Deviation:
    """``wrong_scale``'s way for a factor none of its ways has: ``ratio`` x hs ** -0.5, fitted to
    a block's output by ``explain`` below."""
    label = (f"scores scaled by {{value:.4g}} = {ratio:.4g} x hs ** -0.5 (hs={{hs}}), a factor "
             "fitted to the block's output, instead of hs ** -0.5 = {right:.4g}")  # fmt: skip
    return replace(way(label, scale=lambda C, hs: ratio * hs**-0.5), mistake="wrong_scale")


def variants(
    max_size: int, pool: Iterable[Deviation] | None = None
) -> Iterator[tuple[Deviation, ...]]:
    """Every combination of at most ``max_size`` deviations of ``pool`` (``LESSONS``), one per
    group, smallest first (the correct block first): the first size that matches is the smallest."""
    groups: dict[str, list[Deviation]] = {}
    for deviation in LESSONS if pool is None else pool:
        groups.setdefault(deviation.group, []).append(deviation)
    for size in range(max_size + 1):
        for chosen in itertools.combinations(groups.values(), size):
            yield from itertools.product(*chosen)


@dataclass(frozen=True)
class Match:
    """A variant and the unknowns under which it reproduces the block."""

    deviations: tuple[Deviation, ...]  # the mistakes, concretely; empty for the correct block
    n_head: int  # nh
    activation: str  # a key of CANDIDATE_ACTIVATIONS
    error: float  # max |block - variant| / max |variant|, over the positions compared
    reading: int = 0  # which reading of the block's parts (an index into explain's `readings`)
    rope: Rope | None = None  # the rotary embedding the block means (one of explain's ``turns``)
    qk_norm: tuple[Tensor, Tensor] | None = None

    @property
    def mistakes(self) -> list[str]:  # the catalogue ids, each once, in order
        return list(dict.fromkeys(d.mistake for d in self.deviations))

    def describe(self) -> str:
        """'post_norm + no_scaling (relu, 4 heads)'."""
        names = " + ".join(d.mistake for d in self.deviations) or "no mistake"
        return f"{names} ({self.activation}, {self.n_head} heads)"


@dataclass(frozen=True)
class Explanation:
    """What ``explain`` found: the smallest matching variant, ties, or the closest miss."""

    match: Match | None  # the first smallest variant that reproduces the block
    alternatives: tuple[Match, ...]  # variants of the same size with other mistakes that also do
    closest: Match | None  # when nothing matches: the variant that came nearest


def distance(y: Tensor, y_ref: Tensor, least: float = MIN_DEFINED) -> float:
    """The checker's one measure, relative to ``y_ref``'s largest entry; rows where ``y_ref`` is
    not finite (masked entirely) are skipped, unless fewer than ``least`` of them are left."""
    if y.shape != y_ref.shape:
        return float("inf")
    defined = torch.isfinite(y_ref).all(dim=-1)  # (...)
    if not defined.all():  # (most often all are: no rows to pick)
        if defined.double().mean().item() < least:
            return float("inf")
        if not defined.any():  # (``least`` 0) nowhere defined: nothing differs
            return 0.0
        y, y_ref = y[defined], y_ref[defined]  # (n, F)
    ours, ref = y.double(), y_ref.double()
    if not torch.isfinite(ours).all():
        return float("inf")
    scale = ref.abs().max().clamp_min(1e-12)
    return float((ours - ref).abs().max() / scale)


def smallest(
    candidates: Iterable[tuple[Deviation, ...]],
    attempt: Callable[[tuple[Deviation, ...]], M | None],
) -> list[M]:
    """What ``attempt`` accepts of ``candidates`` (smallest first) at the smallest size it accepts
    one, once per set of mistakes (1/hs is C ** -0.5 when nh == hs): a match, its alternatives."""
    found: list[tuple[set[str], M]] = []
    size = 0
    for deviations in candidates:
        if found and len(deviations) > size:
            break  # every smaller variant has been tried; larger ones are not simpler
        mistakes = {d.mistake for d in deviations}
        if mistakes not in (m for m, _ in found) and (match := attempt(deviations)) is not None:
            found.append((mistakes, match))
            size = len(deviations)
    return [match for _, match in found]


def explain(
    readings: Sequence[Parts],
    x: Tensor,
    y: Tensor,
    heads: tuple[int, ...],
    max_size: int = 3,
    pool: Iterable[Deviation] | None = None,
    turns: Sequence[tuple[Rope | None, tuple[Tensor, Tensor] | None]] = ((None, None),),
    alone: bool = False,
    measure: Callable[[Tensor, Tensor], float] = distance,
) -> Explanation:
    """The smallest set of mistakes of ``pool`` (at most ``max_size``) whose variant maps ``x``
    (B, T, C) to ``y`` within ``TOLERANCE``, with one of ``readings`` (most likely first), ``heads``
    and ``turns`` (rotary embedding, qk norm gains); ``alone``: to the merged heads (B, T, D)."""

    def remember(f: Any) -> Any:  # a tensor hashes by its id, and the cache keeps it alive
        return f and functools.lru_cache(maxsize=4)(f)

    # the variants call the norms and q/k/v on the very same tensors: the block's modules run once
    memoised = [
        replace(p, qkv=remember(p.qkv), ln1=remember(p.ln1), ln2=remember(p.ln2)) for p in readings
    ]
    tried: list[Match] = []  # each reading's best under each variant: the nearest miss among them

    def unknowns(
        parts: Parts, deviations: tuple[Deviation, ...], reading: int, like: Match | None = None
    ) -> Match:
        # every activation compared: exact and tanh GELU differ by less than TOLERANCE
        steps = compose(deviations)
        best = Match(deviations, heads[0], next(iter(CANDIDATE_ACTIVATIONS)), float("inf"), reading)
        activations = list(CANDIDATE_ACTIVATIONS.items())[: 1 if alone else None]
        n_heads, rotations = heads, turns
        if like is not None:  # ``like``'s unknowns only (a scale being fitted to it)
            n_heads, rotations = (like.n_head,), [(like.rope, like.qk_norm)]
            activations = [(like.activation, CANDIDATE_ACTIVATIONS[like.activation])]
        for n_head in n_heads:
            for (name, activation), (rope, qk) in itertools.product(activations, rotations):
                try:
                    if alone:
                        y_ref = attention(*parts.qkv(x), n_head, rope, steps, qk, C=parts.C)
                    else:
                        y_ref = run_steps(parts, x, n_head, activation, steps, rope, qk)
                except MissingPart:
                    return best  # this variant needs a part the block does not have
                except CAUGHT:
                    continue  # the block's own modules refuse this variant's input (or head count)
                match = Match(deviations, n_head, name, measure(y, y_ref), reading, rope, qk)
                if match.error < best.error:
                    best = match
            if best.error <= TOLERANCE:
                break
        return best

    def attempt(deviations: tuple[Deviation, ...]) -> Match | None:
        for r, parts in enumerate(memoised):
            tried.append(unknowns(parts, deviations, r))
            if tried[-1].error <= TOLERANCE:
                return tried[-1]
        return None

    def kept(m: Match) -> tuple[Deviation, ...]:  # its mistakes but the scale's
        return tuple(d for d in m.deviations if d.group != "scale")

    def fitted(near: Match) -> list[Match]:
        """A scale none of wrong_scale's ways has, fitted to ``near``, its other mistakes kept."""
        parts, others = memoised[near.reading], kept(near)
        ratio = _fitted(lambda r: unknowns(parts, (*others, fitted_scale(r)), 0, near).error)
        if abs(math.log(ratio)) <= 1e-3:  # the right scale, less precisely found
            return []
        return [m for m in [attempt((*others, fitted_scale(ratio)))] if m is not None]

    pool = None if pool is None else tuple(pool)
    scaled = any(d.group == "scale" for d in pool or LESSONS)  # a scale may be fitted
    for size in range(max_size + 1):  # each size's catalogued variants, then a fitted scale
        found = smallest((v for v in variants(size, pool) if len(v) == size), attempt)
        fewer = [m for m in tried if len(kept(m)) == size - 1 and m.error < math.inf]
        if not found and scaled and fewer:  # fitted to the nearest variant of one mistake fewer
            found = fitted(min(fewer, key=lambda m: m.error))
        if found:
            return Explanation(found[0], tuple(found[1:]), None)
    return Explanation(None, (), min(tried, key=lambda m: m.error, default=None))


def _fitted(error: Callable[[float], float]) -> float:
    """The ratio r in 1e-3 ... 1e3 where ``error(r)`` is least: on a grid in log r, then refined
    by golden-section search between the grid's neighbours of its least point."""
    grid = [i / 2 for i in range(-14, 15)]  # log r
    least = min(range(len(grid)), key=lambda i: error(math.exp(grid[i])))
    lo, hi = grid[max(least - 1, 0)], grid[min(least + 1, len(grid) - 1)]
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = error(math.exp(a)), error(math.exp(b))
    for _ in range(30):  # the bracket shrinks to 0.62 ** 30 = 6e-7 of its width
        if fa < fb:  # the least is in [lo, b]
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = error(math.exp(a))
        else:  # in [a, hi]
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = error(math.exp(b))
    return math.exp((lo + hi) / 2)
