"""The verdict (``decide``): the probes, then the comparison (``search``), a match confirmed
(``conditions.confirm``) on inputs from a seed the block never sees and, without mistakes, in its
parameters (``account``). docs/checker.md, "How it decides" and "Every parameter accounted for"."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any, Protocol

import torch

from ..mistakes.catalogue import MISTAKES, compose, searched
from ..mistakes.report import CAUGHT, COMPARISON, OUT_OF_SCOPE, CheckReport, Finding, one_line
from ..mistakes.search import TOLERANCE, Explanation, explain
from ..mistakes.steps import CANDIDATE_ACTIVATIONS, Deviation, run_steps
from ..roles.plain import unpack_modern, unpack_readings
from ..roles.provenance import Traced, choose, unread
from ..serve.subject import Probed
from .conditions import Condition, confirm
from .modern import Compared, judge_cache, matched
from .probes import MIXED, PROBES, ProbeResult, elsewhere, listed

__all__ = ["MAX_MISTAKES", "Progress", "Service", "decide"]

Tensor = torch.Tensor
LARGE = 30.0  # the large weights' factor: behind a norm's gain, scores 30^4 times as large
MAX_MISTAKES = 3  # the comparison tries every combination of up to this many mistakes


class Progress(Protocol):
    """Where a check is, for a caller that must say what the block was doing if it never ends."""

    def stage(self, what: str) -> None: ...
    def finding(self, finding: Finding) -> None: ...


class Service(Probed, Protocol):
    """What ``decide`` asks of the block: ``isolation.worker.Remote``, over a child process or,
    in process, a local ``Served``."""

    note: str
    failed: str  # what its first call raised in float64, if it did
    trusted: bool  # the answers come from this process, not the block's

    def parameters(self) -> dict[str, Tensor]: ...
    def set_parameters(self, values: Mapping[str, Tensor]) -> None: ...
    def dropout_off(self) -> str: ...
    def read(self, roles: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, Tensor]]: ...
    def suggest(self) -> str: ...
    def modern(self) -> Compared | list[str]: ...
    def scope(self) -> list[str]: ...
    def cache(self, x: Tensor) -> tuple[dict[str, Any], dict[str, Tensor]]: ...


def decide(
    service: Service, description: str, roles: Mapping[str, str], progress: Progress,
    fresh: torch.Generator, weights: torch.Generator, *, again: bool = False,
) -> CheckReport:  # fmt: skip
    """The report on the block ``service`` answers for (``roles``: ``--map``'s). ``fresh`` draws
    the confirming inputs and ``weights`` the parameters' values: their seeds are unknown to the
    block. ``again``: at other sizes, the shape probe and the comparison only."""
    progress.stage("giving the block's copy the checker's weights")
    chosen = choose(service.parameters(), service.C, weights)
    service.set_parameters(chosen)
    notes = [service.note] if service.note else []
    findings: list[Finding] = []
    first = _first_call(service) if not again else None  # asked again last: the same block?
    implied: dict[str, str] = {}  # the mistakes the probes prove, with what was measured
    if service.dtype != torch.float64 and MIXED.search(service.failed):  # (s99 unseen set)
        said = f"in float64: the block raised {service.failed}: a part of it computes in float32"
        findings.append(Finding("dtype (float64)", False, said))
        implied["dtype_device"] = said
    stop, dropout = False, ""
    for name, probe in list(PROBES.items())[: 1 if again else None]:
        progress.stage(f"the {name} probe")
        try:
            result = probe(service)
        except CAUGHT as e:  # a block that raises fails that probe instead of stopping the check
            result = ProbeResult(False, f"the block raised {one_line(e)}")
        findings.append(Finding(name, result.passed, result.message))
        progress.finding(findings[-1])
        implied.update({result.implies: result.message} if result.implies else {})
        if stop := result.stop:
            notes.append("the other checks need the shape contract and were not run")
            break
    if not stop and "dropout_in_eval" in implied:
        progress.stage("switching the block's dropout off")
        if not (dropout := service.dropout_off()):
            notes.append("no comparison with the reference: the outputs are random in eval mode")
            stop = True
    backward = all(f.passed for f in findings if f.name == "gradients")  # its backward ran
    done = Compared(None)  # the comparison, with the modern or the lessons' reference
    if not stop:
        pool = searched({f.name for f in findings if f.passed})  # what the probes leave open
        done = _compared(
            service, roles, chosen, fresh, backward, again, dropout, notes, progress, pool
        )
    if done.finding is not None:
        findings.append(done.finding)
        progress.finding(done.finding)
        if not done.finding.passed and MIXED.search(done.finding.message):  # a condition's
            implied.setdefault("dtype_device", done.finding.message)  # dtypes met (s99: T = 1)
    if not (stop or again):  # paths taken only in half precision, or only while training
        progress.stage("the causality and batch probes in train mode and in bfloat16")
        failed = not (done.details or (done.finding and done.finding.passed))
        train = elsewhere(service, train=True) if failed else {}  # (else compared there)
        half = elsewhere(service, dtype=torch.bfloat16) if service.dtype == torch.float64 else {}
        # only where the weights could not be read (s97): where the comparison ran, or a part no
        # reference models was named, a float32 constant promoting bfloat16 (the public zoo's
        # bentrevett scale, the modern zoo's gptj table, float32 rotary tables) is no mistake
        if done.finding is not None or any(n.startswith(OUT_OF_SCOPE) for n in notes):
            half.pop("dtype", None)
        for where, found in (("train mode (dropout off)", train), ("bfloat16", half)):
            for name, result in found.items():
                said = f"in {where}: {result.message}"
                findings.append(Finding(f"{name} ({where.split()[0]})", False, said))
                progress.finding(findings[-1])
                implied.setdefault(result.implies or "", said)
        implied.pop("", None)
    if first is not None and not stop and "dropout_in_eval" not in implied:
        findings += _same_again(service, *first)
    unused = "" if done.traced is None or again else account(service, chosen, done.traced, fresh)
    findings += [Finding("parameters", False, unused)] * bool(unused)  # not all of a PASS's act
    # a PASS read through a packed projection: its heads' rows as the lessons' heads take them
    strided = "" if done.traced is None or again else "; ".join(done.traced.strided)
    findings += [Finding("heads", False, strided)] * bool(strided)
    if done.traced is not None:  # a PASS: ``account`` tells which parameters act
        implied.pop("unused_parameters", None)
    if not (stop or again) and all(f.passed for f in findings if f.name == "finite outputs"):
        progress.stage("the finite-outputs probe with large weights")
        if large := _large_weights(service, chosen):
            findings.append(large)
            progress.finding(large)
            implied.setdefault("nonfinite", large.message)
    own = {m: said for m, said in (("unused_parameters", unused), ("heads_mixed", strided)) if said}
    details = {**implied, **done.details, **own}
    diagnosis = _diagnose(list(own) or list(done.details), implied)
    alternatives = [a for o in done.alternatives if (a := _diagnose(o, implied)) != diagnosis]
    details = {m: details[m] for m in diagnosis if m in details}
    compared = done.finding is not None
    return CheckReport(
        description, findings, diagnosis, details, notes, alternatives, compared, done.verify
    )


def _first_call(service: Service) -> tuple[Tensor, Tensor] | None:
    """An input of its own draw (the checker's inputs stay as they were) and the block's output."""
    x = torch.randn(2, service.T, service.C, generator=torch.Generator().manual_seed(7))
    x = x.to(device=service.device, dtype=service.dtype)
    try:
        return x, service(x)
    except CAUGHT:  # the probes say why
        return None


def _same_again(service: Service, x: Tensor, y: Tensor) -> list[Finding]:
    """The first call's input once more, after every other call: a block that turns wrong after
    some number of calls (a counter, state kept between calls) fails here."""
    try:
        y2 = service(x)
    except CAUGHT as e:
        return [Finding("same again", False, f"the block raised {one_line(e)} when called again")]
    if not service.moved(y, y2).any():
        return []
    off = float((y2 - y).abs().nan_to_num(0.0).max() / (1.0 + y.abs().nan_to_num(0.0).max()))
    said = "the check's first input, given again after its other calls, gives another output "
    said += f"(off by {off:.2g} of the output scale): the block changes from call to call"
    return [Finding("same again", False, said)]


def account(
    subject: Service, chosen: Mapping[str, Tensor], traced: Traced, fresh: torch.Generator
) -> str:
    """What a block that matched without mistakes does not use, "" when nothing: a head that
    reads another's weights, or a parameter (or part) no role read that never moves the output
    (perturbed, then set back; docs/checker.md, "Every parameter accounted for")."""
    said = list(traced.repeats)
    masks = unread(chosen, traced.used, subject.dtype)
    dead: list[str] = []
    if masks:  # else nothing is drawn from ``fresh``
        x = torch.randn(2, subject.T, subject.C, generator=fresh, dtype=torch.float64)
        x = x.to(device=subject.device, dtype=subject.dtype)
        y = subject(x)
    for name, mask in masks.items():
        value = chosen[name]
        finite = value[value.isfinite()]  # (a mask's -inf: s96)
        spread = max(float(finite.abs().max()) if finite.numel() else 0.0, subject.C**-0.5)
        noise = torch.randn(value.shape, generator=fresh, dtype=torch.float64) * spread
        subject.set_parameters({name: torch.where(mask, value + noise, value)})
        try:
            acts = bool(subject.moved(y, subject(x)).any())
        except CAUGHT:  # it changed something, if only the block's mind
            acts = True
        finally:
            subject.set_parameters({name: value})
        part, n = int(mask.sum()), mask.numel()
        dead += [] if acts else [name if part == n else f"{name} ({part} of its {n} values)"]
    if dead:
        said.append(f"{listed(dead, 6)} never {'acts' if len(dead) == 1 else 'act'} on the output")
    return "; ".join(said)


def _compared(
    subject: Service, roles: Mapping[str, str], chosen: Mapping[str, Tensor],
    fresh: torch.Generator, backward: bool, again: bool, dropout: str, notes: list[str],
    progress: Progress, pool: tuple[Deviation, ...],
) -> Compared:  # fmt: skip
    """The comparison with the modern reference or the lessons', a match confirmed (the modern
    one's PASS, read from the block's process's traces, is a claim until then)."""
    modern: Compared | list[str] = []
    if not roles:
        progress.stage("the modern reference comparison")
        modern = subject.modern()  # [] for the lessons' block
    if isinstance(modern, Compared):  # None: a part the references do not model
        notes.extend(modern.notes)
        finding = modern.finding  # (None: no details, no alternatives)
        if finding is None or not finding.passed or finding.label == "FOUND":
            return modern
        progress.stage("confirming the modern comparison on fresh inputs")
        sent = dict(zip(("parts", "tensors"), modern.parts or (), strict=False))
        received = unpack_modern(sent, subject.C, subject.dtype, chosen)
        said = received if isinstance(received, str) else ""
        try:
            if not isinstance(received, str):
                what = "the modern block rebuilt from the parts its process sent"
                why = confirm(subject, received[0].run, (2, subject.T), fresh, backward, what,
                              "modern", True, notes)  # fmt: skip
                if why is not None and _beyond(subject, notes):  # Mistral's, wider than T
                    return Compared(None)
                return Compared(finding, traced=received[1]) if why is None else Compared(why)
        except CAUGHT as e:  # parts whose shapes do not chain: the block's process made them up
            said = f"the parts sent cannot be run as a block ({one_line(e)})"
        if subject.trusted:
            return Compared(finding)
        notes.append(
            "the modern block's comparison, read from the traces the block's process sent, is not "
            f"confirmed outside it ({said}): not verified (check_in_process, for code you trust, "
            "gives its verdict)"
        )
        return Compared(None)
    if dropout:
        notes.append(f"compared with every dropout of the block {dropout}")
    progress.stage("reading the weights from the forward pass")
    meta, tensors = subject.read(roles)
    unpacked = unpack_readings(meta, tensors, subject, chosen, notes)
    if isinstance(unpacked, str):
        notes.append(f"weights not read, black-box results only: {unpacked}")
        notes += [f"{OUT_OF_SCOPE}{'; '.join(modern)}"] * bool(modern)
        if not again:
            progress.stage("suggesting a --map")
        return Compared(None, verify="" if again else subject.suggest())
    readings, read = unpacked
    # roles guessed by shape and order: one mistake at most (more would fit a wrong guess too)
    guessed = meta.get("guessed") is True
    depth = 1 if guessed else MAX_MISTAKES
    progress.stage("the reference comparison")
    try:
        # the traced input, then, where mistakes found on it fail on fresh inputs, one of those:
        # the traced input may not tell them apart (one sequence hides a mask over the batch)
        inputs, under = [readings.x.to(subject.device)], dict[str, str]()
        for x in inputs:
            y = subject(x.to(subject.dtype)).to(torch.float64)
            with torch.no_grad():
                tried, first = explain(readings.readings, x, y, readings.heads, depth, pool), 0
                if tried.match is None and readings.fallback:  # q, k, v in another order, then?
                    swapped = explain(readings.fallback, x, y, readings.heads, depth, pool)
                    if swapped.match is not None:
                        tried, first = swapped, len(readings.readings)
            if len(inputs) > 1 and tried.match is None:
                break  # the traced input's nearest match and its failure stand
            result, match = tried, tried.match
            reading = first + match.reading if match else 0
            parts = [*readings.readings, *readings.fallback][reading]
            found = _finding(result, parts.parallel, depth)
            if match is None:
                break
            progress.stage("confirming the comparison on fresh inputs and conditions")
            steps, full = compose(match.deviations), not match.deviations
            activation = CANDIDATE_ACTIVATIONS[match.activation]
            reference = partial(run_steps, parts, n_head=match.n_head, activation=activation,
                                steps=steps)  # fmt: skip
            off: list[Condition] = []  # the condition it failed in, if one did
            held = confirm(subject, reference, x.shape[:2], fresh, backward, match.describe(),
                           "lessons" if full else "", full and not again, notes, off)  # fmt: skip
            if held is not None:  # a variant with mistakes fails already: its outputs only
                found, match = held, None
                under = _under(subject, readings, off[0], fresh, depth, pool) if off else {}
                if len(inputs) == 1 and not full:
                    shape = (subject.T, subject.T, subject.C)
                    x_fresh = torch.randn(shape, generator=fresh, dtype=torch.float64)
                    inputs.append(x_fresh.to(subject.device))
    except CAUGHT as e:  # a layout the reference cannot run is the checker's limit
        notes.append(readings.describe(0))
        notes.append(f"no comparison with the reference: it failed with {one_line(e)}")
        return Compared(None)
    notes.append(readings.describe(reading))
    if modern and result.match is None:  # a part no reference models: out of scope, not FAIL
        notes.append(f"{OUT_OF_SCOPE}{'; '.join(modern)} (the lessons' block: {found.message})")
        return Compared(None)
    if again and match is None and result.match is not None and _beyond(subject, notes):
        return Compared(None)
    if result.match is None and guessed:  # the roles may be wrong, not the block
        notes.append(
            f"not compared: the roles guessed by shape and order match nothing ({found.message})"
        )
        return Compared(None, verify="" if again else subject.suggest())
    if match is None:
        return Compared(found, details=under)
    details = {d.mistake: d.describe(subject.C, match.n_head) for d in match.deviations}
    heads = dict.fromkeys(("q", "k", "v"), match.n_head)
    traced = None if match.deviations else read[reading].with_heads(heads)
    if traced is not None and not again:  # right on whole sequences: then is its cached step?
        x = readings.x.to(device=subject.device, dtype=subject.dtype)
        cache = judge_cache(*subject.cache(x), x, None)
        notes.append(cache.note)
        if cache.failed:
            return Compared(Finding(COMPARISON, False, cache.failed))
    return Compared(found, [m.mistakes for m in result.alternatives], details, traced)


def _under(
    subject: Service, readings: Any, c: Condition, fresh: torch.Generator, depth: int,
    pool: tuple[Deviation, ...],
) -> dict[str, str]:  # fmt: skip
    """The catalogued mistakes that reproduce the block in the condition it failed in, with the
    weights read (s102: a path unscaled only in train mode, or only for long sequences, was a
    FAIL naming none)."""
    x = c.input(subject.C, fresh)
    try:
        with subject.own_rng():
            y = subject(x.to(subject.device), seeded=False, train=c.train).to(torch.float64).cpu()
        with torch.no_grad():
            tried = explain(readings.readings, x.to(torch.float64), y, readings.heads, depth, pool)
    except CAUGHT:
        return {}
    if (match := tried.match) is None:
        return {}
    at = f" at {c.describe()}, where the block is off (the lessons' block elsewhere)"
    return {d.mistake: d.describe(subject.C, match.n_head) + at for d in match.deviations}


def _large_weights(service: Service, chosen: Mapping[str, Tensor]) -> Finding | None:
    """The finite-outputs probe again with every weight times ``LARGE``: a softmax written without
    subtracting the row maximum overflows only for large scores, which the norm before the
    attention keeps from large inputs (s85 unseen set); trained weights make them."""
    service.set_parameters({n: v * LARGE for n, v in chosen.items()})
    try:
        result = PROBES["finite outputs"](service)
    except CAUGHT:  # (what the block raises there: the probes' own business)
        return None
    finally:
        service.set_parameters(chosen)
    said = f"with every weight times {LARGE:g}: {result.message}"
    return None if result.passed else Finding("finite outputs (large weights)", False, said)


def _beyond(subject: Service, notes: list[str]) -> bool:
    """Whether a match that failed on longer sequences than the traced ones has a part no
    reference models there, noted: a sliding window wider than the traced length (the modern
    block's, at any sizes; the lessons' block's at the other sizes only, where it is as long as
    the file's sequences: else it is right only for short sequences, a FAIL)."""
    if found := subject.scope():
        notes.append(
            f"{OUT_OF_SCOPE}{'; '.join(found)}, seen on sequences longer than the traced ones"
        )
    return bool(found)


def _finding(result: Explanation, parallel: bool, depth: int) -> Finding:
    match, closest = result.match, result.closest
    lessons = "the lessons' block" + " with a parallel residual (GPT-J's)" * parallel
    if match is None:
        msg = f"no variant with up to {depth} catalogued mistakes reproduces the block "
        msg += f"within {TOLERANCE:g} of its output scale"
        if closest:
            msg += f"; the closest is {closest.describe()}, off by {closest.error:.2g}"
        return Finding(COMPARISON, False, msg)
    if match.deviations or result.alternatives:
        others = [m.describe() for m in result.alternatives]
        return matched(lessons, match.error, match.describe(), others)
    return matched(f"{lessons} ({match.activation}, {match.n_head} heads)", match.error)


def _diagnose(found: list[str], implied: Mapping[str, str]) -> list[str]:
    """The mistakes found, plus those the probes prove that no diagnosed mistake explains
    (``Mistake.explains``), in catalogue order."""
    explained = {e for m in [*found, *implied] for e in MISTAKES[m].explains} - set(found)
    return [m for m in MISTAKES if m in found or (m in implied and m not in explained)]
