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
from ..roles.modern_plain import unpack_modern
from ..roles.plain import unpack_readings
from ..roles.provenance import Traced, choose, trace
from ..roles.readings import Readings
from ..serve.subject import Tested
from .accounting import account
from .conditions import hold
from .gradient import GRADIENT_TOLERANCE, input_gradient_error
from .probes import PROBES, ProbeResult

__all__ = ["EXPLAINS", "MAX_MISTAKES", "Progress", "Service", "decide"]

Tensor = torch.Tensor
MAX_MISTAKES = 3  # the comparison tries every combination of up to this many mistakes

# A mistake found by the comparison that also causes a probe failure: the failure is not a
# separate mistake. (batch_mixing explains a shape failure that occurs only when B != T.)
EXPLAINS: dict[str, set[str]] = {
    "mask_reversed": {"future_leak", "nonfinite"},
    "mask_zero": {"future_leak"},
    "mask_after_softmax": {"future_leak"},
    "softmax_dim": {"future_leak"},
    "heads_mixed": {"future_leak", "batch_mixing"},  # a head-major merge mixes sequences
    "batch_mixing": {"shape"},
    "rmsnorm_dim": {"future_leak", "batch_mixing"},  # a mean over time or batch mixes positions
    "rmsnorm_mean": {"nonfinite"},  # the root of a negative mean
}


class Progress(Protocol):
    """Where a check is, for a caller that must say what the block was doing if it never ends."""

    def stage(self, what: str) -> None: ...

    def built(self, description: str) -> None: ...

    def finding(self, finding: Finding) -> None: ...


class Service(Protocol):
    """What ``decide`` asks of the block (``gptblock.check.served.Served``, or the checker's
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
        traced: Traced | None = None  # what the parts read were traced to
        if passed and label != "FOUND":
            # The modern comparison was read from traces the block's process sent: its PASS
            # is a claim until the parts read are held here to the chosen weights, to fresh
            # inputs, the input gradient and the learner's conditions, as the lessons' block's
            # are. In this process (trusted) only a failure counts.
            progress.stage("confirming the modern comparison on fresh inputs")
            backward = all(f.passed for f in findings if f.name == "gradients")
            received = unpack_modern(modern, subject.C, subject.dtype, chosen)
            what = "the modern block rebuilt from the parts its process sent"
            try:
                if isinstance(received, str):
                    why = received
                else:
                    rebuilt, traced = received
                    held = _confirm(
                        subject, rebuilt.run, (2, subject.T), fresh, backward, what, "modern", True
                    )
                    notes += [held] if isinstance(held, str) and held else []
                    why = held if isinstance(held, Finding) else ""
            except CAUGHT as e:  # parts whose shapes do not chain: the block's process made them up
                why, traced = f"the parts sent cannot be run as a block ({one_line(e)})", None
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
                    confirm = _confirm_match(
                        subject, readings, reading, match, fresh, backward, again
                    )
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
                    made = trace(read[reading], chosen, subject.dtype, heads)
                    found = account(
                        service.set_parameters, subject, chosen, made, fresh, findings, details
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
    explains, in catalogue order."""
    explained = set().union(*(EXPLAINS.get(m, set()) for m in found + implied)) - set(found)
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


def _confirm_match(
    subject: Tested,
    read: Readings,
    reading: int,
    match: Match,
    fresh: torch.Generator,
    backward: bool,
    again: bool = False,
) -> Finding | str:
    """``_confirm`` for the variant found, the lessons' block with its mistakes: a mistaken
    block fails already, so only its outputs on fresh inputs are held."""
    parts = [*read.readings, *read.fallback][reading]
    steps = compose(match.deviations)
    activation = CANDIDATE_ACTIVATIONS[match.activation]
    reference = lambda x: run_steps(parts, x, match.n_head, activation, steps)  # noqa: E731
    full = not match.deviations
    held = "lessons" if full else ""
    B, T, _ = read.x.shape
    return _confirm(subject, reference, (B, T), fresh, backward, match.describe(), held,
                    full and not again)  # fmt: skip


def _confirm(
    subject: Tested,
    reference: Callable[[Tensor], Tensor],
    first: tuple[int, int],
    fresh: torch.Generator,
    backward: bool,
    what: str,
    whose: str,
    conditions: bool,
) -> Finding | str:
    """A failed comparison when ``reference`` (``what``, in float64) does not also reproduce the
    block on fresh inputs, ``first`` (B, T) by C and (T, T, C) (the block's longest T), or,
    when ``whose`` reference it is ("lessons", "modern") is named, its input gradient (when the
    block's backward pass ran: ``backward``) and, with ``conditions``, the learner's conditions
    (``conditions.hold``); else ``""``, or a note on a condition that could not be compared.
    The lessons' block and the modern block are confirmed alike.

    Raises:
        ValueError, RuntimeError: ``reference`` cannot run on a fresh input.
    """
    T, C = subject.T, subject.C
    for shape in ((*first, C), (T, T, C)):
        x = torch.randn(*shape, generator=fresh, dtype=torch.float64)
        with torch.no_grad():
            ours = reference(x)  # (B, T, C); raises where the parts do not chain
        if ours.shape != x.shape:
            raise ValueError(f"the reference maps {shape} to {tuple(ours.shape)}")
        try:
            theirs = subject(x.to(device=subject.device, dtype=subject.dtype))
        except CAUGHT as e:
            msg = f"the block raised {one_line(e)} on a fresh {shape} input"
            return Finding("reference comparison", False, msg)
        error = distance(theirs.to(torch.float64).cpu(), ours)
        if not error <= TOLERANCE:
            msg = (
                f"{what} reproduces the block on the traced input, but not on a fresh {shape} "
                f"input (off by {error:.2g} of its scale): its outputs are not those of one "
                "fixed block"
            )
            return Finding("reference comparison", False, msg)
    if not whose:
        return ""  # the block fails already: a mistake
    if backward:  # else its backward pass fails already
        error = input_gradient_error(subject, reference, fresh)
        if not error <= GRADIENT_TOLERANCE:
            msg = (
                f"the block's outputs are the {whose} block's, but its gradient with respect "
                f"to its input is not (off by {error:.2g} of its scale): its backward pass is "
                "not its forward pass's"
            )
            return Finding("reference comparison", False, msg)
    return hold(subject, reference, fresh, backward) if conditions else ""
