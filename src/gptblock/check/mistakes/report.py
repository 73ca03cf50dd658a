"""What ``check_block`` returns: one finding per check, and a diagnosis from the catalogue,
rendered as text, JSON and HTML (every word escaped); the three share one walk of the report
(``_entry``, ``_diagnosis``...)."""

from __future__ import annotations

import textwrap
from dataclasses import asdict, dataclass, field
from html import escape
from typing import Any

from ..serve.loop import CAUGHT
from ..serve.loop import one_line as said
from .catalogue import MISTAKES

__all__ = [
    "CAUGHT", "COMPARISON", "OUT_OF_SCOPE", "CheckReport", "Finding", "Raised", "one_line", "text",
]  # fmt: skip

COMPARISON = "reference comparison"  # the name of the comparison's finding
OUT_OF_SCOPE = "not compared, as the references do not model it: "  # then the parts: UNVERIFIED


@dataclass(frozen=True)
class Finding:
    """The outcome of one check: which (``name``), whether the block ``passed`` it, and the
    ``message`` of what was measured and found, in one or two sentences.

    Example:
        >>> Finding("causality", True, "no position sees a later one")
        Finding(name='causality', passed=True, message='no position sees a later one', label='')
    """

    name: str
    passed: bool
    message: str
    label: str = ""  # what the line says instead of PASS / FAIL: "FOUND" for a mistake found

    @property
    def status(self) -> str:
        return self.label or ("PASS" if self.passed else "FAIL")


@dataclass(frozen=True)
class CheckReport:
    """Everything ``check_block`` found about one block.

    ``verdict`` is ``PASS`` when the block was compared, every finding passed and nothing was
    diagnosed; ``FAIL`` when a finding failed or a mistake was diagnosed; ``UNVERIFIED`` when
    every black-box check passed but the block was not compared. ``passed`` is ``verdict ==
    "PASS"``; ``confident`` when it was compared and no alternative explains it as well.

    Example:
        >>> shape = Finding("shape", True, "(6, 6, 32) -> (6, 6, 32)")
        >>> report = CheckReport("MyBlock()", [shape], compared=True)
        >>> report.passed, report.diagnosis, report.confident
        (True, [], True)
        >>> print(report)
        check MyBlock()
          PASS  shape                 (6, 6, 32) -> (6, 6, 32)
        diagnosis: none
        result: PASS
    """

    target: str  # what was checked, e.g. ``"Block(n_embd=32, n_head=4, block_size=16)"``
    findings: list[Finding]  # one per check that ran, in the order they ran
    # ids of ``catalogue.MISTAKES``, in catalogue order; empty when none was found
    diagnosis: list[str] = field(default_factory=list)
    details: dict[str, str] = field(default_factory=dict)  # each id's: what this block does
    # what the checker could not do or assumed (e.g. names it could not map)
    notes: list[str] = field(default_factory=list)
    # other sets of mistakes that explain it equally well: unsure, ``diagnosis`` the likeliest
    alternatives: list[list[str]] = field(default_factory=list)
    # whether its arithmetic was compared with the reference (without it a mistake the probes
    # cannot see, a wrong scale, may remain)
    compared: bool = False
    verify: str = ""  # when not compared, the ``--map`` arguments that let it read the weights

    def __post_init__(self) -> None:
        named = [*self.diagnosis, *(d for ds in self.alternatives for d in ds)]
        unknown = [d for d in named if d not in MISTAKES]
        if unknown:
            raise ValueError(f"unknown mistake ids {unknown}; expected some of {list(MISTAKES)}")

    @property
    def confident(self) -> bool:
        # a comparison that failed matched no catalogued variant: it confirms no probe's diagnosis
        failed = any(f.name == COMPARISON and not f.passed for f in self.findings)
        return self.compared and not self.alternatives and not failed

    @property
    def verdict(self) -> str:
        if self.diagnosis or not all(f.passed for f in self.findings):
            return "FAIL"
        return "PASS" if self.compared else "UNVERIFIED"

    @property
    def passed(self) -> bool:
        return self.verdict == "PASS"

    def format(self, width: int = 100) -> str:
        """The report as text: one line per check, then each diagnosis with its fix; notes and
        explanations wrap at ``width``, a check's line never does."""
        lines = [f"check {self.target}"]
        lines += [f"  {f.status:<5} {f.name:<21} {f.message}" for f in self.findings]
        for note in self.notes:
            lines += _wrap(note, width, "  note: ", " " * 8)
        diagnosis = _diagnosis(self)  # only the unsure one wraps
        lines += _wrap(diagnosis, width) if self.alternatives else [diagnosis]
        for d in self.diagnosis:
            lines += _wrap(MISTAKES[d].title, width, f"  {d}: ", "    ")
            for k, v in _entry(self, d):
                lines += _wrap(v, width, f"    {k + ':':<8}", " " * 12)
        for paragraph in _result(self):
            lines += _wrap(paragraph, width) if self.verdict == "UNVERIFIED" else [paragraph]
        return "\n".join(lines)

    __str__ = format

    def __repr__(self) -> str:
        """One line: the verdict, the target, how many checks passed and the mistakes found."""
        passed = sum(f.passed for f in self.findings)
        mistakes = f", mistakes: {', '.join(self.diagnosis)}" if self.diagnosis else ""
        return (
            f"<CheckReport {self.verdict}: {self.target}, {passed} of {len(self.findings)} "
            f"checks passed{mistakes} (print it for the whole report)>"
        )

    def _repr_html_(self) -> str:
        """What a notebook shows: an HTML fragment (no script, no style sheet)."""
        colour = {"PASS": "#1a7f37", "FAIL": "#cf222e", "UNVERIFIED": "#9a6700"}[self.verdict]
        out = [
            f'<div><p><b style="color:{colour}">{self.verdict}</b> <code>{escape(self.target)}</code></p>',
            "<table><tr><th>result</th><th>check</th><th>what was found</th></tr>",
        ]
        for f in self.findings:
            style = "" if f.passed else ' style="color:#cf222e"'
            out.append(
                f"<tr><td{style}>{escape(f.status)}</td><td>{escape(f.name)}</td>"
                f'<td style="text-align:left">{escape(f.message)}</td></tr>'
            )
        out.append("</table>")
        out += [f"<p><small>note: {escape(n)}</small></p>" for n in self.notes]
        out.append(f"<p>{escape(_diagnosis(self))}</p>")  # as the text says it, in its order
        for d in self.diagnosis:
            items = [f"<li><b>{k}</b>: {escape(v)}</li>" for k, v in _entry(self, d) if v]
            out += [f"<p><b>{escape(d)}</b>: {escape(MISTAKES[d].title)}</p><ul>", *items, "</ul>"]
        result = " ".join(" ".join(_result(self)).split())
        return "\n".join([*out, f"<p><b>{escape(result)}</b></p></div>"])

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: the report plus each diagnosed mistake's catalogue entry."""
        keys = {"why": "explanation", "from": "lesson"}  # the text's words: the JSON's keys
        entries = {d: {keys.get(k, k): v for k, v in _entry(self, d)} for d in self.diagnosis}
        mistakes = {d: {"title": MISTAKES[d].title, "found": "", **e} for d, e in entries.items()}
        findings = [{**asdict(f), "label": f.status} for f in self.findings]
        said = {"passed": self.passed, "verdict": self.verdict, "confident": self.confident}
        return {**asdict(self), **said, "findings": findings, "mistakes": mistakes}


def _entry(report: CheckReport, d: str) -> list[tuple[str, str]]:
    m = MISTAKES[d]
    found = [("found", report.details[d])] if d in report.details else []
    return [*found, ("why", m.explanation), ("fix", m.fix), ("from", m.lesson)]


def _diagnosis(report: CheckReport) -> str:
    if report.alternatives:
        named = ", ".join(report.diagnosis) or "no mistake"
        others = " | ".join(", ".join(a) or "no mistake" for a in report.alternatives)
        return f"diagnosis (unsure): {named}; explained equally well by: {others}"
    if report.diagnosis:
        more = "" if report.confident else " (black-box checks only: there may be more)"
        if report.compared and not report.confident:
            more = " (the comparison matched no catalogued mistake: there may be more)"
        return "diagnosis: " + ", ".join(report.diagnosis) + more
    if report.verdict != "FAIL":
        more = "" if report.compared else " found by the black-box checks (not compared)"
        return "diagnosis: none" + more
    return "diagnosis: no catalogued mistake identified; see the failed checks"


def _result(report: CheckReport) -> list[str]:
    n = len(report.findings)
    if report.verdict == "PASS":
        return ["result: PASS"]
    if report.verdict == "FAIL":
        failed, found = sum(not f.passed for f in report.findings), len(report.diagnosis)
        plural = "" if found == 1 else "s"
        if not failed:  # the comparison found it: every check that is no comparison passed
            said = f"found by the comparison; the other {n - 1} checks passed"
            return [f"result: FAIL ({found} mistake{plural} {said})"]
        return [f"result: FAIL ({failed} of {n} checks failed, {found} mistake{plural} diagnosed)"]
    why = "its weights could not be read, or only inside its own process"
    if any(note.startswith(OUT_OF_SCOPE) for note in report.notes):  # s94: not its weights
        why = "it has a part no reference models, named in a note above"
    unverified = (
        f"result: UNVERIFIED (the {n} black-box checks passed, but the block was not compared "
        f"with a reference it could be confirmed against ({why}): a wrong scale, say, would not "
        "show)"
    )
    return [unverified] + [f"to verify it, run again with: {report.verify}"] * bool(report.verify)


def _wrap(text: str, width: int, first: str = "", rest: str = "    ") -> list[str]:
    return textwrap.wrap(
        text, width, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False
    ) or [first.rstrip()]


class Raised(Exception):
    """An error the block raised in another process, as ``one_line`` described it there."""

    where = ""  # the last lines of its traceback there


def text(value: object, limit: int = 2000) -> str:
    """``value`` as one line of at most ``limit`` characters: what another process sent, made
    safe to print inside a report (it cannot start a line of its own)."""
    line = " ".join(str(value).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def one_line(e: BaseException | None) -> str:
    """'TypeError: first line of the message', for a one-line report (``loop.one_line``; an
    error the block's process reported, as it said it)."""
    return text(e, 400) if isinstance(e, Raised) else said(e)
