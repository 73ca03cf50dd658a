"""The catalogued mistakes as changes to the lessons' steps, and the search for the one a block is.

Each ``Deviation`` is one concrete way to make a catalogued mistake: a function ``Steps -> Steps``
that swaps one step of ``gptblock.check.steps.CORRECT`` (the mask, the score scale, the softmax
axis, the axis attention runs along, the wiring of the residual stream). Deviations compose, so
"post-norm and no scaling" is two deviations applied in turn; ``variants(max_size)`` lists every
composition of at most ``max_size`` deviations, smallest first, and ``explain`` runs them with a
block's own weights until one reproduces the block's output.

Shapes: B batch, T time, C channels, nh heads, hs head size.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import torch

from .steps import CANDIDATE_ACTIVATIONS, CORRECT, Params, Steps, SubLayer, run_steps

__all__ = [
    "DEVIATIONS",
    "TOLERANCE",
    "Deviation",
    "Explanation",
    "Match",
    "compose",
    "distance",
    "explain",
    "variants",
]

Tensor = torch.Tensor


# ----- the mistaken steps ----------------------------------------------------------------------


def _post_norm(x: Tensor, attn: SubLayer, mlp: SubLayer, ln1: SubLayer, ln2: SubLayer) -> Tensor:
    x = ln1(x + attn(x))
    return ln2(x + mlp(x))


def _attn_overwrites(
    x: Tensor, attn: SubLayer, mlp: SubLayer, ln1: SubLayer, ln2: SubLayer
) -> Tensor:
    x = attn(ln1(x))
    return x + mlp(ln2(x))


def _mlp_overwrites(
    x: Tensor, attn: SubLayer, mlp: SubLayer, ln1: SubLayer, ln2: SubLayer
) -> Tensor:
    x = x + attn(ln1(x))
    return mlp(ln2(x))


def _both_overwrite(
    x: Tensor, attn: SubLayer, mlp: SubLayer, ln1: SubLayer, ln2: SubLayer
) -> Tensor:
    return mlp(ln2(attn(ln1(x))))


def _normalised_stream(
    x: Tensor, attn: SubLayer, mlp: SubLayer, ln1: SubLayer, ln2: SubLayer
) -> Tensor:
    x = ln1(x)  # the stream itself is replaced by its normalised copy
    x = x + attn(x)
    x = ln2(x)
    return x + mlp(x)


def _unmasked(T: int, device: torch.device) -> Tensor:
    return torch.zeros(T, T, dtype=torch.bool, device=device)


def _reversed(T: int, device: torch.device) -> Tensor:
    """torch.tril (True on the *allowed* positions) read as True = blocked."""
    return torch.tril(torch.ones(T, T, dtype=torch.bool, device=device))


# ----- the mistakes as deviations --------------------------------------------------------------


@dataclass(frozen=True)
class Deviation:
    """One concrete way to make a catalogued mistake: a change to one step of ``Steps``.

    Args:
        mistake: the catalogue id it is reported as (``gptblock.check.catalogue.MISTAKES``).
        group: deviations of one group change the same step, so a variant uses at most one of
            them.
        label: what exactly the block does; ``{C}``, ``{hs}``, ``{nh}``, ``{right}`` (hs**-0.5),
            ``{by_C}`` (C**-0.5), ``{by_hs}`` (1/hs) and ``{sqrt_hs}`` are filled in.
        apply: the change.

    Example:
        >>> deviation = next(d for d in DEVIATIONS if d.mistake == "wrong_scale")
        >>> deviation.describe(C=32, n_head=4)
        'scores scaled by C ** -0.5 = 0.1768 (C=32) instead of hs ** -0.5 = 0.3536 (hs=8)'
        >>> compose([deviation]).scale(32, 8) == 32**-0.5
        True
    """

    mistake: str
    group: str
    label: str
    apply: Callable[[Steps], Steps]

    def describe(self, C: int, n_head: int) -> str:
        """The label with this block's numbers filled in."""
        hs = C // n_head
        return self.label.format(
            C=C, hs=hs, nh=n_head, right=hs**-0.5, by_C=C**-0.5, by_hs=1 / hs, sqrt_hs=hs**0.5
        )


DEVIATIONS: tuple[Deviation, ...] = (
    Deviation(
        "future_leak",
        "mask",
        "no causal mask: every position attends to every position, later ones included",
        lambda s: replace(s, blocked=_unmasked),
    ),
    Deviation(
        "mask_reversed",
        "mask",
        "the mask blocks the positions <= t (True on the allowed positions, read as True = "
        "blocked): each position attends only to later ones",
        lambda s: replace(s, blocked=_reversed),
    ),
    Deviation(
        "batch_mixing",
        "axis",
        "attention runs along the batch axis: the (B, T, C) input is read as (T, B, C)",
        lambda s: replace(s, time_axis=0),
    ),
    Deviation(
        "no_scaling",
        "scale",
        "scores are not scaled (expected a factor hs ** -0.5 = {right:.4g}, hs={hs})",
        lambda s: replace(s, scale=lambda C, hs: 1.0),
    ),
    Deviation(
        "wrong_scale",
        "scale",
        "scores scaled by C ** -0.5 = {by_C:.4g} (C={C}) instead of hs ** -0.5 = {right:.4g} (hs={hs})",
        lambda s: replace(s, scale=lambda C, hs: C**-0.5),
    ),
    Deviation(
        "wrong_scale",
        "scale",
        "scores divided by hs = {hs} instead of by sqrt(hs) = {sqrt_hs:.4g}",
        lambda s: replace(s, scale=lambda C, hs: hs**-1.0),
    ),
    Deviation(
        "wrong_scale",
        "scale",
        "scores multiplied by sqrt(hs) = {sqrt_hs:.4g} instead of divided by it (hs={hs})",
        lambda s: replace(s, scale=lambda C, hs: hs**0.5),
    ),
    Deviation(
        "softmax_dim",
        "softmax",
        "softmax over the query axis (dim=-2) instead of over the keys (dim=-1)",
        lambda s: replace(s, softmax_dim=-2),
    ),
    Deviation(
        "post_norm",
        "wiring",
        "post-norm: x = ln1(x + sa(x)); x = ln2(x + ffwd(x))",
        lambda s: replace(s, wiring=_post_norm),
    ),
    Deviation(
        "no_residual",
        "wiring",
        "the attention branch overwrites the stream: x = sa(ln1(x)) instead of x = x + sa(ln1(x))",
        lambda s: replace(s, wiring=_attn_overwrites),
    ),
    Deviation(
        "no_residual",
        "wiring",
        "the MLP branch overwrites the stream: x = ffwd(ln2(x)) instead of x = x + ffwd(ln2(x))",
        lambda s: replace(s, wiring=_mlp_overwrites),
    ),
    Deviation(
        "no_residual",
        "wiring",
        "both branches overwrite the stream: x = ffwd(ln2(sa(ln1(x)))), no residual at all",
        lambda s: replace(s, wiring=_both_overwrite),
    ),
    Deviation(
        "no_residual",
        "wiring",
        "the stream is replaced by its normalised copy: x = ln1(x); x = x + sa(x); "
        "x = ln2(x); x = x + ffwd(x)",
        lambda s: replace(s, wiring=_normalised_stream),
    ),
)
"""Every way of making a catalogued mistake that the steps can reproduce, in catalogue order."""


def compose(deviations: tuple[Deviation, ...] | list[Deviation]) -> Steps:
    """``CORRECT`` with each deviation's change applied in turn."""
    steps = CORRECT
    for deviation in deviations:
        steps = deviation.apply(steps)
    return steps


def variants(max_size: int) -> Iterator[tuple[Deviation, ...]]:
    """Every combination of at most ``max_size`` deviations, one per group at most, smallest first.

    The empty combination (the correct block) comes first, so a search that stops at the
    first match returns the smallest set of mistakes that explains a block.

    Example:
        >>> [len(v) for v in variants(1)][:3]
        [0, 1, 1]
        >>> sum(1 for _ in variants(1)) == 1 + len(DEVIATIONS)
        True
    """
    groups: dict[str, list[Deviation]] = {}
    for deviation in DEVIATIONS:
        groups.setdefault(deviation.group, []).append(deviation)
    for size in range(max_size + 1):
        for chosen in itertools.combinations(groups.values(), size):
            yield from itertools.product(*chosen)


# ----- finding the variant that reproduces a block ---------------------------------------------

TOLERANCE = 1e-4
"""A variant reproduces a block when its output differs by at most this much, relative to the
largest output entry. Two float64 implementations of one function agree to ~1e-12 and a float32
block to ~1e-6; a LayerNorm eps the checker cannot read (a hand-written norm; 1e-5 is assumed)
moves outputs by ~eps/2 = 5e-6. Variants with different diagnoses differ by more than 1e-2,
100x this tolerance: the smallest gap, ~1.7e-2, is between the correct block and wrong_scale
with 2 heads at initialisation, where attention is nearly uniform (tests/test_check.py measures
it). Exact and tanh GELU can differ by less than this tolerance; neither is a mistake, and the
closer one is reported."""

MIN_DEFINED = 0.5
"""A variant whose output is NaN at more than half of the positions (a mask that blocks
whole rows) is too undefined to be evidence, and is never accepted."""


@dataclass(frozen=True)
class Match:
    """A variant and the unknowns under which it reproduces the block."""

    deviations: tuple[Deviation, ...]  # the mistakes, concretely; empty for the correct block
    n_head: int  # nh
    activation: str  # a key of CANDIDATE_ACTIVATIONS
    error: float  # max |block - variant| / max |variant|, over the positions compared

    @property
    def mistakes(self) -> list[str]:
        """The catalogue ids of ``deviations``, in order."""
        return [d.mistake for d in self.deviations]

    def describe(self) -> str:
        """'post_norm + no_scaling (relu, 4 heads)'."""
        names = " + ".join(self.mistakes) or "no mistake"
        return f"{names} ({self.activation}, {self.n_head} heads)"


@dataclass(frozen=True)
class Explanation:
    """What ``explain`` found: the smallest matching variant, ties, or the closest miss."""

    match: Match | None  # the first smallest variant that reproduces the block
    alternatives: tuple[Match, ...]  # other variants of the same size that also do
    closest: Match | None  # when nothing matches: the variant that came nearest


def distance(y: Tensor, y_ref: Tensor) -> float:
    """How far the block's output ``y`` is from a variant's ``y_ref``, relative to ``y_ref``.

    Positions (rows of C) where ``y_ref`` is not finite are skipped: the variant leaves them
    undefined, and a block may return NaN or zeros there. Anywhere else a non-finite ``y`` is
    infinitely far. ``inf`` also when fewer than ``MIN_DEFINED`` of the positions are defined.

    Shape:
        y, y_ref: (B, T, C).
    """
    defined = torch.isfinite(y_ref).all(dim=-1)  # (B, T)
    if defined.double().mean().item() < MIN_DEFINED:
        return float("inf")
    ours, ref = y[defined], y_ref[defined]  # (n, C)
    if not torch.isfinite(ours).all():
        return float("inf")
    scale = ref.abs().max().clamp_min(1e-12)
    return float((ours - ref).abs().max() / scale)


def explain(
    p: Params, x: Tensor, y: Tensor, heads: tuple[int, ...], max_size: int = 3
) -> Explanation:
    """Find the smallest set of mistakes whose variant maps ``x`` to ``y`` with weights ``p``.

    Tries every variant of at most ``max_size`` deviations (smallest first), each with every head
    count in ``heads`` and every activation in ``CANDIDATE_ACTIVATIONS``, and stops at the first
    size at which one reproduces ``y`` within ``TOLERANCE``.

    Shape:
        x, y: (B, T, C).
    """
    closest: Match | None = None
    found: list[Match] = []
    for deviations in variants(max_size):
        if found and len(deviations) > len(found[0].deviations):
            break  # every smaller variant has been tried; larger ones are not simpler
        match = _best_unknowns(p, x, y, heads, deviations)
        if closest is None or match.error < closest.error:
            closest = match
        if match.error <= TOLERANCE:
            found.append(match)
    if not found:
        return Explanation(None, (), closest)
    # Distinct deviations of one mistake can coincide (1/hs equals C ** -0.5 when nh == hs):
    # those are one diagnosis, not alternatives.
    first, seen = found[0], {tuple(found[0].mistakes)}
    others = []
    for m in found[1:]:
        if tuple(m.mistakes) not in seen:
            seen.add(tuple(m.mistakes))
            others.append(m)
    return Explanation(first, tuple(others), None)


def _best_unknowns(
    p: Params, x: Tensor, y: Tensor, heads: tuple[int, ...], deviations: tuple[Deviation, ...]
) -> Match:
    """The variant ``deviations`` under the head count and activation closest to ``y``.

    All activations are compared before choosing, because exact and tanh GELU differ by only
    ~1e-5 of the output (less than ``TOLERANCE``): the closer one names the block's activation.
    """
    steps = compose(deviations)
    best: Match | None = None
    for n_head in heads:
        for name, activation in CANDIDATE_ACTIVATIONS.items():
            y_ref = run_steps(p, x, n_head, activation, steps)
            match = Match(deviations, n_head, name, distance(y, y_ref))
            if best is None or match.error < best.error:
                best = match
        if best is not None and best.error <= TOLERANCE:
            return best
    if best is None:
        raise ValueError(f"heads must list at least one head count, got {heads!r}")
    return best
