"""A zoo of blocks written in the styles of widely used sources, each correct and with mistakes.

Each module holds the styles of one family (``STYLES``, a list of ``common.Style``): the
lessons' (``lessons``), GPT-2's descendants (``gpt``), PyTorch's own modules (``torch_modules``),
einsum and packed-projection attention (``einsum``), the naming schemes of Llama, Hugging Face,
BERT, GPT-NeoX, fairseq and timm (``named``), the Annotated Transformer (``annotated``), blocks
that reuse their tensors in place (``bookkeeping``) and the eight code shapes issue 18 reported
(``reported``). Every block was written for this zoo from its
source's style, none inherits from gptblock. ``cases()`` lists each style correct, with each of
its bugs, and with its pairs; ``score`` runs the checker on them (see ``hitrate.py``).
"""

import functools
from dataclasses import dataclass

from . import annotated, bookkeeping, einsum, gpt, lessons, named, reported, torch_modules
from .common import Style, expected

MODULES = [lessons, gpt, torch_modules, einsum, named, annotated, bookkeeping, reported]
STYLES: list[Style] = [s for m in MODULES for s in m.STYLES]


@dataclass(frozen=True)
class Case:
    name: str  # "lecture-flat/wrong_scale+post_norm"
    style: Style
    bugs: frozenset
    expected: frozenset  # catalogue ids; empty for a correct block

    def build(self):
        return self.style.factory(**self.style.kwargs, bugs=self.bugs)


def cases():
    """Every style correct, with each of its bugs, and with each of its pairs."""
    out = []
    for style in STYLES:
        for bugs in [(), *((b,) for b in style.bugs), *style.pairs]:
            label = "+".join(bugs) or "correct"
            out.append(
                Case(f"{style.name}/{label}", style, frozenset(bugs), frozenset(expected(bugs)))
            )
    return out


@dataclass(frozen=True)
class Outcome:
    case: Case
    diagnosis: tuple
    passed: bool
    confident: bool
    result: str = ""  # the report's verdict: PASS, FAIL or UNVERIFIED

    @property
    def verdict(self):
        """'pass' / 'exact' (right), 'unverified' (not compared, says so), 'unsure' (says it
        cannot tell), 'false pass' (a mistaken block reported PASS), 'wrong' (stated, and wrong:
        a correct block reported FAIL included)."""
        if self.result == "UNVERIFIED":
            return "unverified"
        if not self.case.expected:
            return "pass" if self.passed else ("unsure" if not self.confident else "wrong")
        if self.passed:
            return "false pass"
        if self.confident and set(self.diagnosis) == set(self.case.expected):
            return "exact"
        if not self.confident or (not self.diagnosis and not self.passed):
            return "unsure"
        return "wrong"


def run_case(case, check):
    """The checker's outcome on one case; ``check`` is ``check_block`` (or an isolated one)."""
    report = check(case.build())
    outcome = Outcome(
        case, tuple(report.diagnosis), report.passed, report.confident, report.verdict
    )
    return outcome, report


@functools.cache
def outcome(name):
    """``run_case`` of the case called ``name`` with ``check_block``, once a process: the zoo's
    test and the tests that read one case's report share it."""
    from gptblock import check_block

    return run_case(_by_name()[name], check_block)


@functools.cache
def _by_name():
    return {case.name: case for case in cases()}
