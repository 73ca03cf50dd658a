"""Checking blocks in child processes that only answer requests (``check_isolated``): every
reading, comparison and verdict is made here; ``check_in_process`` sends the same requests to
``worker.Served``. docs/checker.md, "The block cannot break the checker"."""

from __future__ import annotations

import secrets
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import torch

from ... import errors
from ..building.target import check_spec, main_source
from ..compare.verdict import decide
from ..mistakes.report import OUT_OF_SCOPE, CheckReport, Finding, Raised, text
from ..serve.subject import one_thread
from .child import Child, Gone, ProtocolBroken, pickled, undumpable
from .worker import Call, Remote, Served

__all__ = ["DEFAULT_TIMEOUT", "FRESH_SEED", "WEIGHTS_SEED", "ask_isolated", "check_in_process",
           "check_isolated", "combine", "not_other", "two_sizes"]  # fmt: skip

Answer = TypeVar("Answer")

DEFAULT_TIMEOUT = 60.0  # seconds to load, build and check a block (a check takes well under one)
# In this process (trusted code) the inputs that confirm a comparison and the weights the
# copy is given are seeded, so a report is the same on every run (``gptblock check``: secret).
FRESH_SEED, WEIGHTS_SEED = 20260, 1


@dataclass
class _State:
    """A check's ``Progress``, at the file's sizes and then at the other ones."""

    description: str = ""  # the target's name until it is built
    where: str = "starting"
    findings: list[Finding] = field(default_factory=list)
    kept: CheckReport | None = None  # the file's sizes' report, while the other sizes run

    def stage(self, what: str) -> None:
        self.where = what

    def finding(self, finding: Finding) -> None:
        self.findings.append(finding)

    def stopped(self, name: str, said: str, note: str) -> CheckReport:
        findings = [*self.findings, Finding(name, False, said)]
        return CheckReport(self.description, findings, [], {}, [note])


def check_isolated(
    targets: Sequence[object],
    *,
    kwargs: Mapping[str, object],
    roles: Mapping[str, str],
    timeout: float = DEFAULT_TIMEOUT,
    roots: Sequence[str] = (),
) -> list[CheckReport]:
    """Check each target (a ``FILE.py:NAME`` or ``package.module:NAME`` text, or a picklable
    object) in a child process, with ``kwargs`` and ``roles`` as ``check_block``'s, killed
    after ``timeout`` seconds, ``roots`` on its ``sys.path`` (a student's folder, as the
    working directory the student ran it from); one report per target, in order.

    Raises:
        UserError: a target cannot be sent, loaded or built (the error the child raised).
        RuntimeError: the child process could not start the checker.
    """
    names = [t if isinstance(t, str) else _name(t) for t in targets]
    states = [_State(name, f"loading {name}") for name in names]

    def check(call: Call, j: int, i: int) -> CheckReport:
        try:
            call("load", index=j)
            return two_sizes(call, roles, states[i])
        except Raised as e:  # where the checker does not expect the block to raise
            note = f"if the block did not cause this, it is a bug in gptblock: {e.where}"
            said = f"the check stopped during {states[i].where}: {e}"
            return states[i].stopped("check", said, note)

    def cut(i: int, what: str) -> CheckReport:
        s = states[i]
        if s.kept is not None:  # cut short at the other sizes: the file's sizes decide
            said = f"checked at the file's sizes only: at other sizes its process {what}"
            return combine(s.kept, f"{said} during {s.where}", "", "")
        verb = {"loading": "load", "building": "build"}.get(s.where.split()[0])
        if verb:
            said = f"cannot {verb} {s.description}: its process {what} while {s.where}"
            raise errors.UserValueError(said)
        note = "the check was cut short; the findings before it are kept"
        return s.stopped("process", f"the process running the block {what} during {s.where}", note)

    with tempfile.TemporaryDirectory() as folder:
        sent = [_sent(t, Path(folder, str(i))) for i, t in enumerate(targets)]
        return _in_children(sent, kwargs, timeout, check, cut, noted=True, roots=roots)


def ask_isolated(
    targets: Sequence[str], ask: Callable[[Call, int], Answer], timeout: float = DEFAULT_TIMEOUT
) -> list[Answer | str]:
    """``ask(call, i)`` for each ``FILE.py:NAME`` target i loaded in a child; else why not."""

    def one(call: Call, j: int, i: int) -> Answer | str:
        try:
            call("load", index=j)
            return ask(call, i)
        except (Raised, errors.UserError) as e:
            return str(e)

    return _in_children(targets, {}, timeout, one, lambda i, what: f"its process {what}")


def _in_children(
    sent: Sequence[str | bytes],
    kwargs: Mapping[str, object],
    timeout: float,
    ask: Callable[[Call, int, int], Answer],
    cut: Callable[[int, str], Answer],
    noted: bool = False,
    roots: Sequence[str] = (),
) -> list[Answer]:
    """``ask(call, j, i)`` for target i (the child's j-th), else ``cut(i, how)`` and the rest in a
    new child; ``noted``: a child per file (one's code cannot answer for another's), its output
    noted."""
    for spec in [t for t in sent if isinstance(t, str)]:
        check_spec(spec)  # a malformed spec or a missing file needs no child to say so
    answers: list[Any] = []
    where = [t.rpartition(":")[0] if isinstance(t, str) else "" for t in sent]  # file, module
    with undumpable(), one_thread():
        while len(answers) < len(sent):
            first = last = len(answers)
            while last < len(sent) and (where[last] == where[first] or not noted):
                last += 1
            child = Child(sent[first:last], kwargs, roots)
            try:
                child.ready()
                for i in range(first, last):
                    child.left = timeout
                    try:
                        answers.append(ask(child.call, i - first, i))
                    except Gone as e:
                        flag = " (--timeout)" if noted else ""
                        stopped = f"did not finish within {timeout:g} s{flag} and was stopped"
                        answers.append(cut(i, stopped if str(e) == "timeout" else str(e)))
                        break
            finally:
                child.close()
            noisy = [o.describe() for o in child.outputs if o.size]
            if noisy and noted:
                said = f"the checked code wrote {' and '.join(noisy)}; not shown"
                answers[first:] = [replace(r, notes=[*r.notes, said]) for r in answers[first:]]
    return answers


def _sent(target: object, folder: Path) -> str | bytes:
    """A spec, a pickled object, or a ``__main__`` object's source in ``folder`` (unimportable)."""
    if isinstance(target, str):
        return target
    source = main_source(target)
    if source is not None:
        folder.mkdir()
        (folder / "__main__.py").write_text(source)
        return f"{folder / '__main__.py'}:{_name(target)}"
    instead = "; pass it as 'FILE.py:NAME', or check it with isolate=False"
    return pickled(target, _name(target), instead)


def _name(target: object) -> str:
    return str(getattr(target, "__qualname__", type(target).__name__))


def check_in_process(
    target: object, kwargs: Mapping[str, object], roles: Mapping[str, str]
) -> CheckReport:
    """``check_block`` in this process, for code the caller trusts (a block written to fool the
    checker can): ``check_isolated``'s requests, answered here."""
    local = Served(target, kwargs)
    try:
        with one_thread():
            return two_sizes(local, roles, _State())
    finally:
        local.undo()


def two_sizes(call: Call, roles: Mapping[str, str], progress: _State) -> CheckReport:
    """The check at the file's sizes, then (unless a mistake was diagnosed: it would stay the
    verdict) at the other sizes or why not, combined (``combine``: PASS needs both)."""
    first, at = _at(call, progress, roles, False)
    if isinstance(first, str):  # the file's sizes are always built (in this process)
        raise ProtocolBroken("no block at the file's sizes")
    if first.verdict == "FAIL" and first.diagnosis:
        return first
    progress.kept = first
    try:
        second, other = _at(call, progress, roles, True)
    except (Raised, errors.UserError) as e:  # a block raising where the checker does not
        second, other = not_other(f"the check stopped: {e}"), ""  # expect it, a --map of [0:32]
    return combine(first, second, at, other)


def _at(
    call: Call, progress: _State, roles: Mapping[str, str], other: bool
) -> tuple[CheckReport | str, str]:
    """The report at the file's sizes or the ``other`` ones, else why not, and their label; what
    a child says is bounded (``text``) and checked for form."""
    trusted = isinstance(call, Served)
    bound = (lambda value, limit: str(value)) if trusted else text
    progress.stage("building the block")
    try:
        said = call("build", other=other)[0]
    except errors.UserError as e:
        if not other:
            raise
        return not_other(bound(str(e), 400)), ""
    if said.get("none") is True:
        return "", ""
    description = bound(said.get("description", ""), 400)
    progress.description = description or progress.description
    notes = said["notes"] if isinstance(said.get("notes"), list) else []
    notes = [bound(n, 400) for n in notes][: None if trusted else 4]
    progress.stage("copying the block and calling it once to tell its width C")
    shape = call("width")[0]
    C, T, longest = shape.get("C"), shape.get("T"), shape.get("longest", 0)
    if not (isinstance(C, int) and isinstance(T, int) and 1 <= C <= 1 << 16 and 1 <= T <= 64):
        raise ProtocolBroken("a width that is not one")
    if not isinstance(longest, int) or not 0 <= longest <= 1 << 30:
        raise ProtocolBroken("a longest sequence that is not one")
    if other and C != said.get("width"):
        return not_other(f"it takes a width of {C}, not {bound(said.get('width'), 20)}"), ""
    progress.stage("copying the block and calling it once")
    copy = call("copy", C=C, T=T, longest=longest)[0]
    raised = bound(copy.get("raised", ""), 600)
    if other and copy.get("failed"):
        return not_other(f"calling it raised {bound(copy.get('failed'), 400)}"), ""
    if raised:
        raise errors.UserValueError(
            f"cannot check {description}: calling it on a {(T, T, C)} input raised {raised}"
        )
    note, failed = (str(copy.get(k, "")) for k in ("note", "float64"))
    service = Remote(call, C, T, copy.get("dtype"), note, longest, failed)
    # here, seeded: a report the same on every run; else from seeds the child never sees
    seeds = (FRESH_SEED, WEIGHTS_SEED) if trusted else (secrets.randbits(63), secrets.randbits(63))
    fresh, weights = (torch.Generator().manual_seed(s) for s in seeds)
    report = decide(service, description, roles, progress, fresh, weights, again=other)
    return replace(report, notes=[*notes, *report.notes]), bound(said.get("label", ""), 200)


def not_other(why: str) -> str:
    """The note of a block not checked at other sizes: not a failure."""
    return f"checked at the file's sizes only: at other sizes {why} (a size fixed in the code?)"


def combine(first: CheckReport, second: CheckReport | str, at: str, other: str) -> CheckReport:
    """One report of the checks at the file's sizes (``at``) and others (``second``, or why it
    did not run): the file's sizes decide, unless only the other sizes fail."""
    if isinstance(second, str) or first.verdict == "FAIL" or second.verdict != "FAIL":
        if not isinstance(second, str):
            said = {"PASS": "PASS", "FAIL": "FAIL", "UNVERIFIED": "not compared"}[second.verdict]
            if said == "PASS" and first.verdict == "FAIL":  # (s102: read as "right there")
                said += " in eval mode (the learner's conditions: at the file's sizes only)"
            out = [n.removeprefix(OUT_OF_SCOPE) for n in second.notes if n.startswith(OUT_OF_SCOPE)]
            second = f"checked again at {other}: {said}" + "".join(f" ({o})" for o in out[:1])
        return replace(first, notes=[*first.notes, *([second] if second else [])])
    failed = [f for f in second.findings if not f.passed]
    why = "; ".join(f"{f.name}: {f.message}" for f in failed[:2]) or ", ".join(second.diagnosis)
    finding = Finding("other sizes", False, f"{first.verdict} at {at}; at {other}: FAIL ({why})")
    notes = [*first.notes, *(n for n in second.notes if n not in first.notes)]
    findings = [*first.findings, finding]  # the rest is the other sizes' report's
    return replace(second, target=first.target, findings=findings, notes=notes, verify="")
