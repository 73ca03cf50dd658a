"""The catalogued mistakes as changes to the steps (``Deviation``: one ``way`` of an entry), and
every combination of them (``variants``, smallest first, for ``search.explain``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from functools import reduce
from typing import Any

from .catalogue import MISTAKES
from .steps import CORRECT, Steps

__all__ = ["DEVIATIONS", "LESSONS", "MODERN", "Deviation", "compose", "variants"]

# The group of a deviation that changes this field of ``Steps`` (else the field's name): the
# mask is two fields, which of the mask deviations change only one of.
_GROUPS = {"blocked": "mask", "masking": "mask", "time_axis": "axis", "softmax_dim": "softmax",
           "rotated": "targets", "rope_table": "table", "kv_order": "order"}  # fmt: skip
MODERN_GROUPS = ("targets", "table", "order")  # the modern attention's: a rotation, grouped heads


@dataclass(frozen=True)
class Deviation:
    """One concrete way to make a catalogued mistake (``mistake``, its id): the ``Steps``
    fields it replaces (``changes``). Deviations of one ``group`` change the same step, so a
    variant uses at most one of them; ``label`` says what the block then does.

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
    changes: tuple[tuple[str, Any], ...]

    def apply(self, steps: Steps) -> Steps:
        return replace(steps, **dict(self.changes))

    def describe(self, C: int, n_head: int, hs: int | None = None) -> str:
        """The label with this block's numbers filled in (``hs`` by default C // n_head)."""
        hs = C // n_head if hs is None else hs
        return self.label.format(
            C=C, hs=hs, nh=n_head, right=hs**-0.5, by_C=C**-0.5, by_hs=1 / hs, sqrt_hs=hs**0.5
        )


DEVIATIONS: tuple[Deviation, ...] = tuple(
    Deviation(m.id, _GROUPS.get(changes[0][0], changes[0][0]), label, changes)
    for m in MISTAKES.values()
    for label, changes in m.ways
)
"""Every way of making a catalogued mistake that the steps can reproduce, in catalogue order."""
MODERN = tuple(d for d in DEVIATIONS if d.group in MODERN_GROUPS)
"""The modern attention's mistakes, tried only on a modern block (``compare.modern``)."""
LESSONS = tuple(d for d in DEVIATIONS if d.group not in MODERN_GROUPS)
"""The lessons' block's mistakes: what ``search.explain`` tries."""


def compose(deviations: tuple[Deviation, ...] | list[Deviation]) -> Steps:
    """``CORRECT`` with each deviation's change applied in turn."""
    return reduce(lambda steps, deviation: deviation.apply(steps), deviations, CORRECT)


def variants(
    max_size: int, pool: Iterable[Deviation] | None = None
) -> Iterator[tuple[Deviation, ...]]:
    """Every combination of at most ``max_size`` deviations of ``pool`` (``LESSONS``), one per
    group, smallest first (the correct block first): the first size that matches is the smallest.

    Example:
        >>> [len(v) for v in variants(1)][:3]
        [0, 1, 1]
        >>> sum(1 for _ in variants(1)) == 1 + len(LESSONS)
        True
    """
    groups: dict[str, list[Deviation]] = {}
    for deviation in LESSONS if pool is None else pool:
        groups.setdefault(deviation.group, []).append(deviation)
    for size in range(max_size + 1):
        for chosen in itertools.combinations(groups.values(), size):
            yield from itertools.product(*chosen)
