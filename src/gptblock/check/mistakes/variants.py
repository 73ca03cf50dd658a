"""The catalogued mistakes as changes to the lessons' steps, and every combination of them.

Each ``Deviation`` is one concrete way to make a catalogued mistake: a function ``Steps -> Steps``
that swaps one step of ``gptblock.check.mistakes.steps.CORRECT`` (the norms, the head split or merge, the
mask, the score scale, the softmax axis, the axis attention runs along, the wiring of the
residual stream). Deviations compose, so "post-norm and no scaling" is two deviations applied in
turn; ``variants(max_size)`` lists every composition of at most ``max_size`` deviations,
smallest first, which ``gptblock.check.mistakes.search.explain`` runs with a block's own parts.

Shapes: B batch, T time, C channels, D attention width, nh heads, hs head size.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import torch
from torch.nn import functional as F

from .steps import CORRECT, Steps, SubLayer

__all__ = ["DEVIATIONS", "Deviation", "compose", "variants"]

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


def _shared_norm(
    ln1: SubLayer | None, ln2: SubLayer | None
) -> tuple[SubLayer | None, SubLayer | None]:
    return ln1, ln1  # the MLP branch reuses the attention branch's LayerNorm


def _unmasked(T: int, device: torch.device) -> Tensor:
    return torch.zeros(T, T, dtype=torch.bool, device=device)


def _reversed(T: int, device: torch.device) -> Tensor:
    """torch.tril (True on the *allowed* positions) read as True = blocked."""
    return torch.tril(torch.ones(T, T, dtype=torch.bool, device=device))


def _fill_zero(scores: Tensor, blocked: Tensor, dim: int) -> Tensor:
    return F.softmax(scores.masked_fill(blocked, 0.0), dim=dim)  # 0 is a score like any other


def _mask_after_softmax(scores: Tensor, blocked: Tensor, dim: int) -> Tensor:
    return F.softmax(scores, dim=dim).masked_fill(blocked, 0.0)  # rows no longer sum to 1


def _split_without_transpose(t: Tensor, n_head: int) -> Tensor:
    B, T, D = t.shape
    return t.reshape(B, n_head, T, D // n_head)  # (B, T, D) -> (B, nh, T, hs), heads and time mixed


def _merge_without_transpose(y: Tensor) -> Tensor:
    B, nh, T, hs = y.shape
    return y.reshape(B, T, nh * hs)  # (B, nh, T, hs) -> (B, T, D), heads and time mixed


def _merge_heads_major(y: Tensor) -> Tensor:
    B, nh, T, hs = y.shape
    return y.transpose(0, 1).reshape(B, T, nh * hs)  # (nh, B, T, hs) in memory, read as (B, T, D)


def _merge_interleaved(y: Tensor) -> Tensor:
    B, nh, T, hs = y.shape
    return y.permute(0, 2, 3, 1).reshape(B, T, hs * nh)  # (B, T, hs, nh): channel d*nh + h


# ----- the mistakes as deviations --------------------------------------------------------------


@dataclass(frozen=True)
class Deviation:
    """One concrete way to make a catalogued mistake: a change to one step of ``Steps``.

    Args:
        mistake: the catalogue id it is reported as (``gptblock.check.mistakes.catalogue.MISTAKES``).
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
        "mask_zero",
        "mask",
        "the future scores are set to 0 instead of -inf before the softmax, so each position "
        "still gives later positions weight exp(0)",
        lambda s: replace(s, masking=_fill_zero),
    ),
    Deviation(
        "mask_after_softmax",
        "mask",
        "the causal mask zeroes the weights after the softmax: each row was normalised over "
        "the future too and no longer sums to 1",
        lambda s: replace(s, masking=_mask_after_softmax),
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
        "heads_mixed",
        "split",
        "q, k and v are reshaped to (B, nh, T, hs) with view(B, nh, T, hs) instead of "
        "view(B, T, nh, hs).transpose(1, 2): each 'head' holds pieces of several positions",
        lambda s: replace(s, split=_split_without_transpose),
    ),
    Deviation(
        "heads_mixed",
        "merge",
        "the heads' outputs (B, nh, T, hs) are reshaped to (B, T, C) without transpose(1, 2): "
        "each position's output holds pieces of other positions",
        lambda s: replace(s, merge=_merge_without_transpose),
    ),
    Deviation(
        "heads_mixed",
        "merge",
        "the heads' outputs, batched head-major as (nh * B, T, hs), are reshaped to (B, T, C) "
        "without splitting the heads off the batch first: each output mixes other sequences' "
        "and heads' values",
        lambda s: replace(s, merge=_merge_heads_major),
    ),
    Deviation(
        "heads_mixed",
        "merge",
        "the heads' outputs are concatenated in the wrong order: channel d of head h lands at "
        "d * nh + h instead of h * hs + d (a permute(0, 2, 3, 1) instead of transpose(1, 2))",
        lambda s: replace(s, merge=_merge_interleaved),
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
    Deviation(
        "shared_norm",
        "norms",
        "the MLP branch reuses the attention branch's LayerNorm: ffwd(ln1(x)) instead of "
        "ffwd(ln2(x))",
        lambda s: replace(s, norms=_shared_norm),
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
    first size with a match returns the smallest set of mistakes that explains a block.

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
