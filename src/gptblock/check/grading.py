"""``grade``: a class's submissions, each checked as ``gptblock check`` checks one, ``jobs`` at
once; one that crashes, exits, hangs or does not parse is an ``ERROR`` or ``TIMEOUT`` row.
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from multiprocessing.pool import ThreadPool
from pathlib import Path
from typing import Any

from .. import __version__
from ..devices import busy_cores
from ..errors import UserError, UserValueError
from ..files import atomic_write_bytes, atomic_write_json
from .compare.probes import PROBES
from .isolation.check import DEFAULT_TIMEOUT, check_isolated
from .isolation.child import undumpable
from .mistakes.report import COMPARISON, Finding, one_line
from .serve.subject import one_thread
from .submissions import NotGraded, Submission, find_block, submissions

__all__ = ["CHECKS", "Row", "grade", "gradescope", "write_csv", "write_json"]

CHECKS = (*PROBES, COMPARISON)  # every report's checks: Gradescope's tests
COLUMNS = ("student", "path", "class", "verdict", "mistakes", "failed_checks", "classes_found",
           "seconds", "gptblock", "report")  # fmt: skip
_TIMED_OUT = "did not finish within"  # isolation's words for a child stopped at --timeout


@dataclass(frozen=True)
class Row:
    """One submission graded."""

    student: str  # the submission's file or folder name, without its suffix
    path: str  # the submission as found
    block: str  # ``FILE:CLASS`` checked, or ``""`` when no class was
    verdict: str  # the report's, ``ERROR`` (not loaded, built or found; crashed), ``TIMEOUT``
    mistakes: tuple[str, ...] = ()  # the diagnosed mistakes' ids
    failed: tuple[str, ...] = ()  # the checks that did not pass
    report: str = ""  # the report's text, or the reason for an ``ERROR`` / ``TIMEOUT``
    seconds: float = 0.0  # from finding its block to the verdict
    found: tuple[str, ...] = ()  # the classes that could have been the block
    checks: tuple[Finding, ...] = field(default=(), repr=False)  # every check's finding

    def to_dict(self) -> dict[str, Any]:
        return {
            "student": self.student,
            "path": self.path,
            "class": self.block,
            "verdict": self.verdict,
            "mistakes": list(self.mistakes),
            "failed_checks": list(self.failed),
            "classes_found": list(self.found),
            "seconds": round(self.seconds, 2),
            "gptblock": __version__,
            "checks": [
                {"name": f.name, "status": f.status, "message": f.message} for f in self.checks
            ],
            "report": self.report,
        }


def grade(
    paths: Iterable[str | os.PathLike[str] | Submission], *,
    kwargs: Mapping[str, object] | None = None, name: str | None = None, jobs: int | None = None,
    timeout: float = DEFAULT_TIMEOUT, on_row: Callable[[Row], None] | None = None,
) -> list[Row]:  # fmt: skip
    """Check every submission in ``paths`` (``submissions``' files and folders, or
    ``Submission``\\ s) in a child process of its own; a row each, in order.

    Args:
        kwargs: constructor arguments for every block (each to the parameter of the same name,
            or of the same role: ``d_model`` to ``n_embd``).
        name: the class (or factory) to check in each submission, instead of finding it.
        jobs: submissions checked at once; default: the cores no other process keeps busy.
        timeout: seconds a submission may take to load, build and answer the checks.
        on_row: called with each row as it is done (in the order they finish).

    Raises:
        UserValueError: ``jobs`` or ``timeout`` out of range; a path as ``submissions`` says.
        KeyboardInterrupt: interrupted; the rows done were given to ``on_row``, and no new
            submission is started.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> folder = Path(tempfile.mkdtemp())
        >>> _ = (folder / "ada.py").write_text("import torch\\n")
        >>> _ = (folder / "bob.py").write_text("def f(:\\n")
        >>> for r in grade([folder], jobs=1):
        ...     print(r.student, r.verdict, r.report)
        ada ERROR no nn.Module subclass in it that could be a block
        bob ERROR bob.py: SyntaxError at line 1: invalid syntax
    """
    subs = [s for p in paths for s in ([p] if isinstance(p, Submission) else submissions([p]))]
    if jobs is None:  # the cores no other process keeps busy (``devices.busy_cores``)
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        jobs = max(1, (cpus or 1) - round(busy_cores() or 0))
    if not isinstance(jobs, int) or jobs < 1:
        raise UserValueError(f"jobs must be a whole number >= 1, got {jobs!r}")
    if not 0 < timeout <= 1e6:  # also NaN; inf overflows the system's clock
        raise UserValueError(f"timeout must be a positive number <= 1e6, got {timeout!r}")

    def one(todo: tuple[int, tuple[Submission, Submission]]) -> tuple[int, Row]:
        i, (sub, copy) = todo
        try:
            return i, grade_one(copy, dict(kwargs or {}), name, timeout, sub.path)
        except BaseException as e:  # a row still, or the batch would wait for it forever
            said = f"gptblock could not grade it ({one_line(e)}): a bug in gptblock"
            return i, Row(sub.student, str(sub.path), "", "ERROR", report=said)

    rows: dict[int, Row] = {}
    # Once for the batch: both change process-wide state that each check would otherwise set
    # and restore under the others' feet (the threads' checks then leave it as it is). The
    # pool's threads are daemons: an interrupted batch does not wait, and leaving the pool
    # (``terminate``) starts no new submission. Each submission is checked from a copy made
    # before any runs: one that writes into another's files (s83 unseen set) changes a copy
    # checked already or none.
    with (
        tempfile.TemporaryDirectory(prefix="gptblock-grade-", ignore_cleanup_errors=True) as copies,
        undumpable(),
        one_thread(),
        ThreadPool(max(1, min(jobs, len(subs)))) as pool,
    ):
        todo = [(i, _copied(sub, Path(copies) / str(i))) for i, sub in enumerate(subs)]
        for i, row in pool.imap_unordered(one, todo):
            rows[i] = row
            if on_row is not None:
                on_row(row)
    return [rows[i] for i in sorted(rows)]


def _copied(sub: Submission, home: Path) -> tuple[Submission, Submission]:
    """``sub`` and its copy in ``home`` (its folder whole, links kept as links)."""
    home.mkdir()
    to = home / sub.path.name
    if sub.path.is_dir():
        shutil.copytree(sub.path, to, symlinks=True)
    else:
        shutil.copy2(sub.path, to)
    files = tuple(to / f.relative_to(sub.path) if sub.path.is_dir() else to for f in sub.files)
    return sub, Submission(sub.student, to, files)


def grade_one(
    sub: Submission, kwargs: Mapping[str, object], name: str | None, timeout: float,
    shown: Path | None = None,
) -> Row:  # fmt: skip
    """One submission's row (``shown``: its path as given, ``sub`` a copy of it); a block whose
    process the check ended (isolation's ``process`` finding) is ``TIMEOUT`` or ``ERROR``, the
    findings before it kept in the report."""
    start = time.monotonic()
    shown = shown or sub.path
    row = partial(Row, sub.student, str(shown))
    try:
        found = find_block(sub, name)
    except NotGraded as e:
        return row("", "ERROR", report=str(e), seconds=time.monotonic() - start, found=e.found)
    more: dict[str, Any] = {"found": found.found}
    try:
        roots = [str(sub.path)] if sub.path.is_dir() else []  # its own imports (s88 unseen set)
        report = check_isolated(
            [f"{found.file}:{found.name}"], kwargs=kwargs, roles={}, timeout=timeout, roots=roots
        )[0]
        ended = [f.message for f in report.findings if f.name == "process" and not f.passed]
        verdict, said = report.verdict, str(report)
        more.update(
            mistakes=tuple(report.diagnosis),
            failed=tuple(f.name for f in report.findings if f.status != "PASS"),
            checks=tuple(report.findings),
        )
    except UserError as e:  # it cannot be loaded or built: its code exited, raised or hung
        ended, said = [str(e)], str(e)
    except BaseException as e:  # one row, whatever failed (Gone too): the batch goes on
        ended = [""]
        said = f"gptblock could not check it ({one_line(e)}); if the machine is fine, a bug"
    if ended:
        verdict = "TIMEOUT" if _TIMED_OUT in ended[0] else "ERROR"
        said = said if said.startswith(ended[0]) else f"{ended[0]}\n{said}"  # why, first (s88)

    def own(text: str) -> str:  # the copy's paths as the submission's
        return text.replace(str(sub.path), str(shown))

    more["checks"] = tuple(replace(f, message=own(f.message)) for f in more.get("checks", ()))
    root = sub.path if sub.path.is_dir() else sub.path.parent
    block, seconds = f"{found.file.relative_to(root)}:{found.name}", time.monotonic() - start
    return row(block, verdict, report=own(said), seconds=seconds, **more)


def write_csv(rows: Iterable[Row], path: str | os.PathLike[str]) -> None:
    """The gradebook as CSV (``COLUMNS``; lists space-separated, the failed checks by ``"; "``)."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(COLUMNS)
    joined = {"mistakes": " ", "failed_checks": "; ", "classes_found": " "}  # a list, one cell
    for d in (r.to_dict() for r in rows):
        writer.writerow([joined[c].join(d[c]) if c in joined else d[c] for c in COLUMNS])
    atomic_write_bytes(path, out.getvalue().encode("utf-8"))


def write_json(rows: Iterable[Row], path: str | os.PathLike[str]) -> None:
    """The gradebook as a JSON list of ``Row.to_dict()``."""
    atomic_write_json(path, [r.to_dict() for r in rows], indent=2)


def gradescope(row: Row) -> dict[str, Any]:
    """Gradescope's autograder ``results.json`` for one submission: a test per check in
    ``CHECKS`` (a point each, its finding as output; a check that did not run scores 0) and a
    ``result`` test (a point for PASS), the report as the output, ``score`` their sum."""
    said = {f.name: f for f in row.checks}
    more = [f"{f.name} {f.status}: {f.message}" for f in row.checks if f.name not in CHECKS]
    more += [f"mistake: {m}" for m in row.mistakes] + [row.report] * (not row.checks)
    tests = [
        (n, f is not None and f.status == "PASS",
         f"{f.status}: {f.message}" if f else "not run: see the result")
        for n, f in ((n, said.get(n)) for n in CHECKS)
    ] + [("result", row.verdict == "PASS", "\n".join([row.verdict, *more]))]  # fmt: skip
    return {
        "score": float(sum(ok for _, ok, _ in tests)),
        "execution_time": round(row.seconds),
        "output": row.report,
        "tests": [{"name": n, "score": float(ok), "max_score": 1.0,
                   "status": "passed" if ok else "failed", "output": out} for n, ok, out in tests],
        "extra_data": {"verdict": row.verdict, "class": row.block, "gptblock": __version__},
    }  # fmt: skip
