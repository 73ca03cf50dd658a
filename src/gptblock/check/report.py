"""What ``check_block`` returns: one finding per check, and a diagnosis from the catalogue.

``CheckReport`` is plain data with two renderings: ``format()`` (``str(report)``), the
human-readable report ``gptblock check`` prints, and ``to_dict()``, what ``--json`` prints.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from typing import Any

from .catalogue import MISTAKES

__all__ = ["CheckReport", "Finding", "one_line"]


@dataclass(frozen=True)
class Finding:
    """The outcome of one check.

    Args:
        name: which check, e.g. ``"causality"``.
        passed: whether the block passed it.
        message: what was measured and found, in one or two sentences.

    Example:
        >>> Finding("causality", True, "no position sees a later one")
        Finding(name='causality', passed=True, message='no position sees a later one')
    """

    name: str
    passed: bool
    message: str


@dataclass(frozen=True)
class CheckReport:
    """Everything ``check_block`` found about one block.

    Args:
        target: what was checked, e.g. ``"Block(n_embd=32, n_head=4, block_size=16)"``.
        findings: one ``Finding`` per check that ran, in the order they ran.
        diagnosis: identifiers from ``gptblock.check.catalogue.MISTAKES``, in catalogue order;
            empty when no catalogued mistake was found.
        details: for each diagnosed id, what exactly this block does.
        notes: what the checker could not do or assumed (e.g. names it could not map).

    ``passed`` is true only when every finding passed and the diagnosis is empty.

    Example:
        >>> report = CheckReport("MyBlock()", [Finding("shape", True, "(6, 6, 32) -> (6, 6, 32)")])
        >>> report.passed, report.diagnosis
        (True, [])
        >>> print(report)
        check MyBlock()
          PASS  shape                 (6, 6, 32) -> (6, 6, 32)
        diagnosis: none
        result: PASS
    """

    target: str
    findings: list[Finding]
    diagnosis: list[str] = field(default_factory=list)
    details: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        unknown = [d for d in self.diagnosis if d not in MISTAKES]
        if unknown:
            raise ValueError(f"unknown mistake ids {unknown}; expected some of {list(MISTAKES)}")

    @property
    def passed(self) -> bool:
        """True when every check passed and no mistake was diagnosed."""
        return all(f.passed for f in self.findings) and not self.diagnosis

    def format(self, width: int = 100) -> str:
        """The report as text: one line per check, then each diagnosis with its fix.

        Args:
            width: where the notes and explanations wrap; a check's line never wraps.
        """
        lines = [f"check {self.target}"]
        for f in self.findings:
            lines.append(f"  {'PASS' if f.passed else 'FAIL'}  {f.name:<21} {f.message}")
        for note in self.notes:
            lines += _wrap(note, width, "  note: ", " " * 8)
        if self.diagnosis:
            lines.append("diagnosis: " + ", ".join(self.diagnosis))
        elif self.passed:
            lines.append("diagnosis: none")
        else:
            lines.append("diagnosis: no catalogued mistake identified; see the failed checks")
        for d in self.diagnosis:
            m = MISTAKES[d]
            lines += _wrap(m.title, width, f"  {d}: ", "    ")
            if d in self.details:
                lines += _wrap(self.details[d], width, "    found:  ", " " * 12)
            lines += _wrap(m.explanation, width, "    why:    ", " " * 12)
            lines += _wrap(m.fix, width, "    fix:    ", " " * 12)
            lines += _wrap(m.lesson, width, "    from:   ", " " * 12)
        failed = sum(not f.passed for f in self.findings)
        if self.passed:
            lines.append("result: PASS")
        else:
            n = len(self.diagnosis)
            lines.append(
                f"result: FAIL ({failed} of {len(self.findings)} checks failed, "
                f"{n} mistake{'' if n == 1 else 's'} diagnosed)"
            )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: the report plus each diagnosed mistake's catalogue entry."""
        return {
            "target": self.target,
            "passed": self.passed,
            "findings": [
                {"name": f.name, "passed": f.passed, "message": f.message} for f in self.findings
            ],
            "diagnosis": list(self.diagnosis),
            "mistakes": {
                d: {
                    "title": MISTAKES[d].title,
                    "found": self.details.get(d, ""),
                    "explanation": MISTAKES[d].explanation,
                    "fix": MISTAKES[d].fix,
                    "lesson": MISTAKES[d].lesson,
                }
                for d in self.diagnosis
            },
            "notes": list(self.notes),
        }


def _wrap(text: str, width: int, first: str, rest: str) -> list[str]:
    return textwrap.wrap(
        text, width, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False
    ) or [first.rstrip()]


def one_line(e: BaseException | None) -> str:
    """'TypeError: first line of the message', for a one-line report."""
    if e is None:
        return "unknown error"
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0].rstrip('.')}" if lines else type(e).__name__
