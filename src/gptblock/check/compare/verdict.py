"""The verdict: every check and the comparison, computed from what the block answers.

``decide`` runs the black-box probes (``gptblock.check.probes``) on the block's answers, has
its parts read into numbers (``gptblock.check.plain``), runs the lessons' block and every
combination of up to three catalogued mistakes (``gptblock.check.search``) on those numbers,
and combines the evidence into a ``CheckReport``. It needs nothing of the block but a
``Service``: in ``gptblock check`` the block runs in another process and each answer is a
claim, so a variant found on the traced input is confirmed on fresh inputs drawn from a seed
the block never sees (``fresh``), and its input gradient with the reference's: a block can
then be ``PASS`` only if its answers are the lessons' block's on inputs it could not foresee.
A match without mistakes is also held to the reference where a learner runs the block
(``conditions``: float32, train mode, every length and batch size) and to its parameters
(``accounting``: each acts, each head's weights its own), for the lessons' block and the modern.

A probe failure that proves a mistake on its own (a future leak, batch mixing, dropout in eval,
non-finite outputs, a broken shape, dtype or device) is diagnosed even when the roles cannot be
found, unless a mistake found by the comparison already explains it (a reversed mask also leaks
the future and leaves the last position NaN).

Shapes: B batch, T time, C channels.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import torch

from ..mistakes.catalogue import MISTAKES
from ..mistakes.report import CAUGHT, CheckReport, Finding, one_line
from ..mistakes.search import TOLERANCE, Match, distance, explain
from ..mistakes.steps import CANDIDATE_ACTIVATIONS, run_steps
from ..mistakes.variants import compose
from ..roles.plain import unpack_readings
from ..roles.provenance import Traced, choose, trace
from ..roles.readings import Readings
from ..serve.subject import Tested
from .accounting import account
from .conditions import hold
from .gradient import GRADIENT_TOLERANCE, input_gradient_error
from .modern_confirm import confirm as confirm_modern
from .probes import PROBES, ProbeResult

__all__ = ["MAX_MISTAKES", "Progress", "Service", "decide"]

Tensor = torch.Tensor
MAX_MISTAKES = 3  # the comparison tries every combination of up to this many mistakes


class Progress(Protocol):
    """Where a check is, for a caller that must say what the block was doing if it never ends."""

    def stage(self, what: str) -> None: ...

    def built(self, description: str) -> None: ...

    def finding(self, finding: Finding) -> None: ...


class Service(Protocol):
    """What ``decide`` asks of the block (``gptblock.check.isolation.worker.Served``, or the checker's
    view of one in another process)."""

    @property
    def tested(self) -> Tested: ...

    @property
    def note(self) -> str: ...

    def parameters(self) -> dict[str, Tensor]: ...

    def set_parameters(self, values: Mapping[str, Tensor]) -> None: ...

    def dropout_off(self) -> str: ...

    def read(self, roles: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, Tensor]]: ...

    def suggest(self) -> str: ...

    @property
    def trusted(self) -> bool:
        """Whether the answers come from this process (``Served``), not the block's (claims)."""
        ...

    def modern(self) -> dict[str, Any]: ...


def decide(
    service: Service,
    description: str,
    roles: Mapping[str, str],
    progress: Progress,
    fresh: torch.Generator,
    weights: torch.Generator,
    *,
    again: bool = False,
) -> CheckReport:
    """The report on the block ``service`` answers for.

    Args:
        service: the block's answers.
        description: what the report calls the block.
        roles: parts the caller named (``--map``).
        progress: told each stage and finding.
        fresh: draws the inputs that confirm a variant; its seed must be unknown to the block.
        weights: draws the values of the block's parameters (``provenance.choose``); its seed
            too.
        again: at other sizes, once checked at the file's, where a PASS adds "equal to the
            reference there too": the shape probe, the comparison and its confirmation only.

    Raises:
        UserValueError: a given role names nothing the block has.
    """
    subject = service.tested
    progress.stage("giving the block's copy the checker's weights")
    chosen = choose(service.parameters(), subject.C, weights)
    service.set_parameters(chosen)
    notes = [service.note] if service.note else []
    results: list[ProbeResult] = []
    findings: list[Finding] = []
    for name, probe in list(PROBES.items())[: 1 if again else None]:
        progress.stage(f"the {name} probe")
        results.append(_run(probe, subject))
        findings.append(Finding(name, results[-1].passed, results[-1].message))
        progress.finding(findings[-1])
        if results[-1].stop:
            notes.append("the other checks need the shape contract and were not run")
            break
    implied = [r.implies for r in results if r.implies]  # mistakes the probes prove
    details = {r.implies: r.message for r in results if r.implies}
    found: list[str] = []  # mistakes the reference comparison reproduces
    others: list[list[str]] = []  # other sets of mistakes that reproduce it as well
    compared, verify = False, ""
    modern: dict[str, Any] = {}

    dropout = ""
    if not results[-1].stop and "dropout_in_eval" in implied:
        progress.stage("switching the block's dropout off")
        dropout = service.dropout_off()
    if results[-1].stop:
        pass
    elif "dropout_in_eval" in implied and not dropout:
        notes.append("no comparison with the reference: the outputs are random in eval mode")
    elif not roles and (modern := _modern(service, progress)) and modern.get("finding", 0) is None:
        notes.extend(modern["notes"])  # a part the references do not model: not compared
    elif modern.get("finding"):
        notes.extend(modern["notes"])
        name, passed, message, label = modern["finding"]
        why: Finding | str = ""
        traced: Traced | None = None
        if passed and label != "FOUND":
            # The modern comparison was read from traces the block's process sent: its PASS
            # is a claim until the parts read are held here to the chosen weights, to fresh
            # inputs and to the input gradient. In this process (trusted) only a failure counts.
            progress.stage("confirming the modern comparison on fresh inputs")
            backward = all(f.passed for f in findings if f.name == "gradients")
            why, traced = confirm_modern(modern, subject, chosen, fresh, backward)
            if not isinstance(why, Finding) and why.startswith("note: "):
                notes.append(why.removeprefix("note: "))
                why = ""
            why = why if isinstance(why, Finding) or not service.trusted else ""
        if isinstance(why, Finding):
            findings.append(why)
            progress.finding(why)
            compared = True
        elif why:
            notes.append(
                "the modern block's comparison, read from the traces the block's process sent, "
                f"is not confirmed outside it ({why}): not verified (check_in_process, for code you "
                "trust, gives its verdict)"
            )
        else:
            findings.append(Finding(name, passed, message, label))
            progress.finding(findings[-1])
            compared, found, others = True, modern["mistakes"], modern["alternatives"]
            details.update(modern["details"])
            if passed and label != "FOUND" and traced is not None and not again:
                found = account(
                    service.set_parameters, subject, chosen, traced, fresh, findings, details
                )
    else:
        if dropout:
            notes.append(f"compared with every dropout of the block {dropout}")
        progress.stage("reading the weights from the forward pass")
        unpacked = unpack_readings(*service.read(roles), subject, chosen, notes)
        if isinstance(unpacked, str):
            notes.append(f"weights not read, black-box results only: {unpacked}")
            if not again:
                progress.stage("suggesting a --map")
                verify = service.suggest()
        else:
            readings, read = unpacked
            progress.stage("the reference comparison")
            finding: Finding | None = None
            try:
                finding, match, ties, reading = _compare(subject, readings)
                # matching nothing, with a part no reference models: out of scope, not FAIL
                scope = [] if match or finding.passed else modern.get("scope", [])
                if match is not None:
                    progress.stage("confirming the comparison on fresh inputs and conditions")
                    backward = all(f.passed for f in findings if f.name == "gradients")
                    confirm = _confirm(subject, readings, reading, match, fresh, backward, again)
                    if isinstance(confirm, Finding):
                        finding, match = confirm, None
                    elif confirm:
                        notes.append(confirm)
            except CAUGHT as e:  # a layout the reference cannot run is the checker's limit
                notes.append(readings.describe(0))
                notes.append(f"no comparison with the reference: it failed with {one_line(e)}")
                finding = None
            if finding is not None:
                notes.append(readings.describe(reading))
                if scope:
                    notes.append(
                        f"not compared, as the references do not model it: {'; '.join(scope)} "
                        f"(the lessons' block: {finding.message})"
                    )
                else:
                    findings.append(finding)
                    progress.finding(finding)
                    compared = True
                if match is not None:
                    found = match.mistakes
                    others = [m.mistakes for m in ties]
                    details.update(  # the variant's account of a mistake is more specific
                        {d.mistake: d.describe(subject.C, match.n_head) for d in match.deviations}
                    )
                if match is not None and not match.deviations and not again:
                    heads = dict.fromkeys(("q", "k", "v"), match.n_head)
                    traced = trace(read[reading], chosen, subject.dtype, heads)
                    found = account(
                        service.set_parameters, subject, chosen, traced, fresh, findings, details
                    )

    diagnosis = _diagnose(found, implied)
    alternatives = [a for a in (_diagnose(o, implied) for o in others) if a != diagnosis]
    details = {m: details[m] for m in diagnosis if m in details}
    return CheckReport(
        description, findings, diagnosis, details, notes, alternatives, compared, verify
    )


def _modern(service: Service, progress: Progress) -> dict[str, Any]:
    """The modern block's comparison (``gptblock.check.modern``), ``{}`` for the lessons' block."""
    progress.stage("the modern reference comparison")
    return service.modern()


def _diagnose(found: list[str], implied: list[str]) -> list[str]:
    """The mistakes found by comparison, plus those the probes prove that no diagnosed mistake
    explains (``Mistake.explains``: a reversed mask also leaks the future), in catalogue order."""
    explained = {e for m in found + implied for e in MISTAKES[m].explains} - set(found)
    return [m for m in MISTAKES if m in found or (m in implied and m not in explained)]


def _run(probe: Callable[[Tested], ProbeResult], subject: Tested) -> ProbeResult:
    """Run one probe; a block that raises fails that probe instead of stopping the check."""
    try:
        return probe(subject)
    except CAUGHT as e:
        return ProbeResult(False, f"the block raised {one_line(e)}")


def _compare(
    subject: Tested, read: Readings
) -> tuple[Finding, Match | None, tuple[Match, ...], int]:
    """Search the variants for the one that reproduces the block: the finding, the match, the
    equally good alternatives and which reading of the block."""
    x = read.x.to(subject.device)
    y = subject(x.to(subject.dtype)).to(torch.float64)
    offset = 0
    with torch.no_grad():
        result = explain(read.readings, x, y, read.heads, MAX_MISTAKES)
        if result.match is None and read.fallback:  # q, k, v in another order, then?
            again = explain(read.fallback, x, y, read.heads, MAX_MISTAKES)
            if again.match is not None:
                result, offset = again, len(read.readings)
    reading = offset + (result.match.reading if result.match else 0)
    name = "reference comparison"
    if result.match is None:
        closest = result.closest
        near = (
            f"; the closest is {closest.describe()}, off by {closest.error:.2g}" if closest else ""
        )
        msg = (
            f"no variant with up to {MAX_MISTAKES} catalogued mistakes reproduces the block "
            f"within {TOLERANCE:g} of its output scale{near}"
        )
        return Finding(name, False, msg), None, (), 0
    match = result.match
    within = f"max error {match.error:.1e} of the output scale <= {TOLERANCE:g}"
    if not match.deviations and not result.alternatives:
        msg = f"computes the lessons' block ({match.activation}, {match.n_head} heads): {within}"
        return Finding(name, True, msg), match, (), reading
    msg = f"matches the lessons' block only with {match.describe()}: {within}"
    if result.alternatives:
        others = "; ".join(m.describe() for m in result.alternatives)
        msg += f" (equally small and also matching: {others})"
    return Finding(name, True, msg, "FOUND"), match, result.alternatives, reading


def _confirm(
    subject: Tested,
    read: Readings,
    reading: int,
    match: Match,
    fresh: torch.Generator,
    backward: bool,
    again: bool = False,
) -> Finding | str:
    """A failed comparison when the variant found does not also reproduce the block on fresh
    inputs (of the traced shape and the probes'), or, for the lessons' block: its input
    gradient (when its backward pass ran: ``backward``) and, but ``again``, the learner's
    conditions (``conditions.hold``); else ``""``, or a note on a condition that could not be
    compared."""
    parts = [*read.readings, *read.fallback][reading]
    steps = compose(match.deviations)
    activation = CANDIDATE_ACTIVATIONS[match.activation]
    B, T, C = read.x.shape
    for shape in ((B, T, C), (subject.T, subject.T, C)):
        x = torch.randn(*shape, generator=fresh, dtype=torch.float64)
        with torch.no_grad():
            ours = run_steps(parts, x, match.n_head, activation, steps)
        try:
            theirs = subject(x.to(device=subject.device, dtype=subject.dtype))
        except CAUGHT as e:
            msg = f"the block raised {one_line(e)} on a fresh {shape} input"
            return Finding("reference comparison", False, msg)
        error = distance(theirs.to(torch.float64).cpu(), ours)
        if not error <= TOLERANCE:
            msg = (
                f"{match.describe()} reproduces the block on the traced input, but not on a "
                f"fresh {shape} input (off by {error:.2g} of its scale): its outputs are not "
                "those of one fixed block"
            )
            return Finding("reference comparison", False, msg)
    if match.deviations:
        return ""  # the block fails already: a mistake
    reference = lambda x: run_steps(parts, x, match.n_head, activation, steps)  # noqa: E731
    if backward:  # else its backward pass fails already
        error = input_gradient_error(subject, reference, fresh)
        if not error <= GRADIENT_TOLERANCE:
            msg = (
                "the block's outputs are the lessons' block's, but its gradient with respect "
                f"to its input is not (off by {error:.2g} of its scale)"
            )
            return Finding("reference comparison", False, msg)
    return "" if again else hold(subject, reference, fresh, backward)
