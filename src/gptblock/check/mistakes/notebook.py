"""A ``CheckReport`` where a notebook shows it: ``to_html`` (its ``_repr_html_``) and
``summary`` (its ``repr``, one line instead of the dataclass's every field).

The HTML says what ``format()`` says, every word of it escaped (a target's name, a message the
block's process sent): the verdict, the checks as a table, each mistake with what was found, why
it matters, its fix and the lessons' line, then the notes.
"""

from __future__ import annotations

from html import escape
from typing import Any

from .catalogue import MISTAKES

CheckReport = Any  # ``report.CheckReport``, which imports this module (a type only, not a circle)

__all__ = ["summary", "to_html"]

_COLOURS = {"PASS": "#1a7f37", "FAIL": "#cf222e", "UNVERIFIED": "#9a6700"}


def summary(report: CheckReport) -> str:
    """One line: the verdict, the target, how many checks passed and the mistakes found.

    Example:
        >>> from gptblock.check import CheckReport, Finding
        >>> summary(CheckReport("B()", [Finding("shape", True, "ok")], ["post_norm"]))
        '<CheckReport FAIL: B(), 1 of 1 checks passed, mistakes: post_norm (print it for the whole report)>'
    """
    passed = sum(f.passed for f in report.findings)
    mistakes = f", mistakes: {', '.join(report.diagnosis)}" if report.diagnosis else ""
    return (
        f"<CheckReport {report.verdict}: {report.target}, {passed} of {len(report.findings)} "
        f"checks passed{mistakes} (print it for the whole report)>"
    )


def to_html(report: CheckReport) -> str:
    """The report as an HTML fragment (no script, no style sheet: a notebook's own styles).

    Example:
        >>> from gptblock.check import CheckReport, Finding
        >>> page = to_html(CheckReport("<B>", [Finding("shape", False, "a < b")], ["post_norm"]))
        >>> "FAIL" in page and "&lt;B&gt;" in page and "a &lt; b" in page and "<B>" not in page
        True
    """
    verdict = report.verdict
    colour = _COLOURS.get(verdict, "inherit")
    out = [
        f'<div><p><b style="color:{colour}">{verdict}</b> <code>{escape(report.target)}</code></p>',
        "<table><tr><th>result</th><th>check</th><th>what was found</th></tr>",
    ]
    for f in report.findings:
        style = "" if f.passed else ' style="color:#cf222e"'
        out.append(
            f"<tr><td{style}>{escape(f.status)}</td><td>{escape(f.name)}</td>"
            f'<td style="text-align:left">{escape(f.message)}</td></tr>'
        )
    out.append("</table>")
    for d in report.diagnosis:
        m = MISTAKES[d]
        rows = [
            ("found", report.details.get(d, "")),
            ("why", m.explanation),
            ("fix", m.fix),
            ("from", m.lesson),
        ]
        out.append(f"<p><b>{escape(d)}</b>: {escape(m.title)}</p><ul>")
        out += [f"<li><b>{k}</b>: {escape(v)}</li>" for k, v in rows if v]
        out.append("</ul>")
    if report.alternatives:
        others = " | ".join(", ".join(a) or "no mistake" for a in report.alternatives)
        out.append(f"<p>unsure: explained equally well by {escape(others)}</p>")
    out += [f"<p><small>note: {escape(n)}</small></p>" for n in report.notes]
    text = report.format()  # its result line, wrapped, and how to verify an UNVERIFIED one
    result = " ".join(text[text.rindex("result: ") :].split())
    out.append(f"<p><b>{escape(result)}</b></p></div>")
    return "\n".join(out)
