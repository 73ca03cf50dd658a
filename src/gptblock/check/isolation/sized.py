"""A block in another process checked at the file's sizes and at other sizes.

``at_two_sizes`` asks the block's process (``gptblock.check.worker``) to build the block at the
sizes its file implies, checks it (``verdict.decide``), then at another set of sizes
(``sizes.other_sizes``), and combines the two reports (``sizes.combine``: PASS needs both). A
block that cannot be built, or raises on its first call, at the file's sizes is a ``UserError``
naming what it raised and the learner's line; at the other sizes, a note.

Shapes: B batch, T time, C channels.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

import torch

from ... import errors
from ..building.sizes import combine, not_other
from ..compare.verdict import Progress, decide
from ..mistakes.report import CheckReport, Finding, Raised, text
from .remote import Call, ProtocolBroken, Remote

__all__ = ["Told", "at_two_sizes", "two_sizes"]


class Told:
    """The progress of the check at other sizes: its stages told to the target's (where a
    report cut short says it stopped), its findings kept apart; of none, a quiet progress."""

    def __init__(self, outer: Progress | None) -> None:
        self.outer = outer

    def stage(self, what: str) -> None:
        if self.outer is not None:
            self.outer.stage(f"at other sizes: {what}")

    def built(self, description: str) -> None:
        pass

    def finding(self, finding: Finding) -> None:
        pass


def at_two_sizes(
    call: Call,
    progress: Progress,
    roles: Mapping[str, str],
    fresh: torch.Generator,
    weights: torch.Generator,
) -> CheckReport:
    """The report on the loaded target, at its file's sizes and at others (``two_sizes``).

    Raises:
        UserError: the block cannot be built, or called, at the file's sizes.
        ProtocolBroken: the block's process answered something that is not an answer.
    """
    return two_sizes(lambda p, other: _at(call, p, roles, fresh, weights, other), progress)


def two_sizes(
    at: Callable[[Progress, bool], tuple[CheckReport, str] | str], progress: Progress | None
) -> CheckReport:
    """The check ``at`` the file's sizes (``False``: the report and the sizes' label), then at
    the other sizes (``True``: or why not, a note), combined (``sizes.combine``: PASS needs
    both); for a block in another process (``at_two_sizes``) or in this one (``run``). A
    mistake diagnosed at the file's sizes is not checked again: it would stay the verdict."""
    first = at(progress or Told(None), False)
    if isinstance(first, str):  # the file's sizes raise rather than say why not
        raise RuntimeError(f"no report at the file's sizes: {first}")
    if first[0].verdict == "FAIL" and first[0].diagnosis:
        return first[0]
    try:
        second = at(Told(progress), True)
    except (Raised, errors.UserError) as e:  # a block raising where the checker does not
        second = not_other(f"the check stopped: {e}")  # expect it, a --map of a slice [0:32]
    report, other = (second, "") if isinstance(second, str) else second
    return combine(first[0], report, first[1], other)


def _at(
    call: Call,
    progress: Progress,
    roles: Mapping[str, str],
    fresh: torch.Generator,
    weights: torch.Generator,
    other: bool,
) -> tuple[CheckReport, str] | str:
    """The report at the file's sizes or the ``other`` ones and their label; at the other
    sizes, why not instead when the block cannot be built or called there."""
    progress.stage("building the block")
    try:
        said = call("build", other=other)[0]
    except errors.UserError as e:
        if not other:
            raise
        return not_other(text(str(e), 400))
    if said.get("none") is True:
        return ""
    description = text(said.get("description", ""), 400)
    progress.built(description)
    notes = said.get("notes")
    notes = [text(n, 400) for n in notes][:4] if isinstance(notes, list) else []
    progress.stage("copying the block and calling it once to tell its width C")
    shape = call("width")[0]
    C, T, longest = shape.get("C"), shape.get("T"), shape.get("longest", 0)
    if not (isinstance(C, int) and isinstance(T, int) and 1 <= C <= 1 << 16 and 1 <= T <= 64):
        raise ProtocolBroken("a width that is not one")
    if not isinstance(longest, int) or not 0 <= longest <= 1 << 30:
        raise ProtocolBroken("a longest sequence that is not one")
    if other and C != said.get("width"):
        return not_other(f"it takes a width of {C}, not {text(said.get('width'), 20)}")
    progress.stage("copying the block and calling it once")
    copy = call("copy", C=C, T=T, longest=longest)[0]
    raised = text(copy.get("raised", ""), 600)
    if other and copy.get("failed"):
        return not_other(f"calling it raised {text(copy.get('failed'), 400)}")
    if raised:
        raise errors.UserValueError(
            f"cannot check {description}: calling it on a {(T, T, C)} input raised {raised}"
        )
    dtype = getattr(torch, str(copy.get("dtype")), None)
    if not isinstance(dtype, torch.dtype):
        raise ProtocolBroken(f"a copy in {text(copy.get('dtype'), 40)!r}")
    remote = Remote(call, C, T, dtype, str(copy.get("note", "")), longest)
    report = decide(remote, description, roles, progress, fresh, weights, again=other)
    return replace(report, notes=[*notes, *report.notes]), text(said.get("label", ""), 200)
