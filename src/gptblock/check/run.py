"""``check_block``: tell a learner exactly what is wrong with their transformer block.

Two kinds of evidence, combined into one report:

1. Black-box probes (``gptblock.check.probes``) that need nothing but a module mapping
   (B, T, C) to (B, T, C): the shape contract, causality, batch independence, determinism in
   eval mode, the residual stream, finite outputs, gradients.
2. When the block's parts can be given their roles (``gptblock.check.mapping``: by names,
   shapes, registration order and the forward pass), a comparison with the reference, the
   lessons' block computed step by step from those parts (``gptblock.check.steps``): the correct
   block and every combination of up to three catalogued mistakes (``gptblock.check.variants``)
   run in float64 on the probes' input. The smallest set of mistakes that reproduces the
   block's output within ``TOLERANCE`` (relative to the output's largest entry) is the
   diagnosis; equally small sets that also do are its alternatives, and the report is unsure.

A probe failure that proves a mistake on its own (a future leak, batch mixing, dropout in eval,
non-finite outputs, a broken shape, dtype or device) is diagnosed even when the roles cannot be
found, unless a mistake found by the comparison already explains it (a reversed mask also leaks
the future and leaves the last position NaN).

``check_block`` runs the block in this process, or (``isolate=True``, the default for a
``FILE.py:NAME`` target) in a child process (``gptblock.check.isolation``), so that a block that
exits, crashes or hangs cannot take the checker with it.

Shapes: B batch, T time, C channels.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from typing import Protocol

import torch
import torch.nn as nn

from ..blocks.fused import FusedBlock
from ..blocks.mha import TransformerBlock
from ..errors import UserTypeError, UserValueError
from ..lesson import Block as LessonBlock
from .build import build, max_length, width
from .catalogue import MISTAKES
from .isolation import DEFAULT_TIMEOUT, check_isolated
from .modern import ModernOutcome, check_modern
from .parts import perturb_all
from .probes import PROBES, ProbeResult
from .readings import TRACE_T, Readings, read_parts, trace_shapes
from .report import CAUGHT, CheckReport, Finding, one_line
from .search import TOLERANCE, Match, explain
from .subject import Subject, one_thread
from .suggest import suggest_map
from .target import load_target
from .trace import NoDropout

__all__ = ["Progress", "check_block", "check_in_process", "own_blocks"]

PROBE_T = 6  # sequence length (and batch size) of the probes, at most the block's block_size
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


class _Quiet:
    def stage(self, what: str) -> None:
        pass

    def built(self, description: str) -> None:
        pass

    def finding(self, finding: Finding) -> None:
        pass


def own_blocks() -> list[Callable[..., nn.Module]]:
    """gptblock's own block classes, which ``gptblock check`` checks when given no target.

    Example:
        >>> [b.__name__ for b in own_blocks()][:2]
        ['Block', 'TransformerBlock']
    """
    return [LessonBlock, TransformerBlock, FusedBlock]


def check_block(
    target: nn.Module | Callable[..., nn.Module] | str,
    /,
    *,
    roles: Mapping[str, str] | None = None,
    isolate: bool | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    **kwargs: object,
) -> CheckReport:
    """Check a transformer block and diagnose its mistakes.

    Args:
        target: an ``nn.Module`` mapping (B, T, C) to (B, T, C), a class / factory that builds
            one, or the text ``"FILE.py:NAME"`` / ``"package.module:NAME"`` naming one. A factory
            is called with ``kwargs`` plus ``fill_common_arguments``'s defaults, under
            ``torch.manual_seed(0)`` (the caller's RNG state is restored), so a check is
            reproducible.
        roles: parts of the block by role, where the checker cannot tell them itself:
            ``{"q": "attn.wq", "ln1": "norm_a", ...}`` (roles ``ln1 ln2 q k v qkv proj fc1
            fc2``; a name may be a glob such as ``"heads.*.query"``, one module per head, or a
            slice and layout of a parameter such as ``"attn.c_attn.weight[:,0:32]:in_out"``:
            ``gptblock.check.given``).
        isolate: run the block in a child process, so that a block that exits, crashes or
            hangs yields a report instead of taking this process with it. Default: only for a
            text target (an object must be picklable to cross; ``gptblock check`` always
            isolates).
        timeout: with ``isolate``, the seconds the block may take (loading, building and
            checking it); then the child is killed and the report says where it hung.
        **kwargs: constructor arguments; only with a class / factory.

    Returns:
        A ``CheckReport``: ``passed``, ``findings`` (one per check), ``diagnosis`` (ids from
        ``gptblock.check.catalogue.MISTAKES``) and, when the checker is unsure,
        ``alternatives``. The target itself is never changed: every check runs on a float64,
        eval-mode deep copy. While it runs, torch uses one intra-op thread (the probes' tensors
        are tiny); the caller's setting is restored.

    Raises:
        UserValueError: the target cannot be loaded or built, its width C cannot be told, a
            role names no part, or ``timeout`` is not a positive number.
        UserTypeError: ``target`` is neither a module nor callable, or the factory returns a
            non-module, or constructor arguments come with a module instance.

    Example:
        >>> import torch.nn as nn
        >>> from gptblock import lesson
        >>> check_block(lesson.Block, n_embd=16, n_head=2).diagnosis
        []
        >>> class PostNorm(nn.Module):   # the encoder layer's default: norm after the residual
        ...     def __init__(self, d_model, nhead):
        ...         super().__init__()
        ...         self.layer = nn.TransformerEncoderLayer(d_model, nhead, 4 * d_model,
        ...                                                 batch_first=True)
        ...     def forward(self, x):
        ...         mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        ...         return self.layer(x, src_mask=mask, is_causal=True)
        >>> report = check_block(PostNorm, d_model=16, nhead=2)
        >>> report.passed, report.diagnosis
        (False, ['post_norm'])
    """
    given = _checked_roles(roles)
    if not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout <= 0:
        raise UserValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if isolate is None:
        isolate = isinstance(target, str)
    if isolate:
        return check_isolated([target], kwargs=kwargs, roles=given, timeout=timeout)[0]
    if isinstance(target, str):
        target = load_target(target)
    return check_in_process(target, kwargs, given)


def check_in_process(
    target: object,
    kwargs: Mapping[str, object],
    roles: Mapping[str, str],
    progress: Progress | None = None,
) -> CheckReport:
    """``check_block`` in this process, telling ``progress`` each stage and finding."""
    progress = progress or _Quiet()
    progress.stage("building the block")
    module, description = build(target, kwargs)
    progress.built(description)
    with one_thread():
        return _check(module, description, kwargs, roles, progress)


def _checked_roles(roles: object) -> dict[str, str]:
    if roles is None:
        return {}
    if not isinstance(roles, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in roles.items()
    ):
        raise UserTypeError(f"roles must map role names to part names (str to str), got {roles!r}")
    return dict(roles)


def _check(
    module: nn.Module,
    description: str,
    kwargs: Mapping[str, object],
    roles: Mapping[str, str],
    progress: Progress,
) -> CheckReport:
    longest = max_length(module, kwargs, PROBE_T)
    T = min(PROBE_T, longest)
    progress.stage("copying the block and calling it once to tell its width C")
    C = width(module, kwargs, T)
    progress.stage("copying the block and calling it once")
    subject = Subject(module, C, T)
    notes = [subject.note] if subject.note else []
    perturb_all(subject.module, C)  # trained-looking weights, so that every mistake shows

    results: list[ProbeResult] = []
    findings: list[Finding] = []
    for name, probe in PROBES.items():
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

    if results[-1].stop:
        pass
    elif "dropout_in_eval" in implied and not _without_dropout(subject):
        notes.append("no comparison with the reference: the outputs are random in eval mode")
    elif not roles and (modern := _modern(subject, max_length(module, kwargs, TRACE_T))):
        progress.stage("the modern reference comparison")  # gptblock.check.modern
        notes.extend(modern.notes)
        if modern.finding is not None:
            findings.append(modern.finding)
            progress.finding(modern.finding)
            compared, found, others = True, modern.mistakes, modern.alternatives
            details.update(modern.details)
    else:
        if "dropout_in_eval" in implied:
            how = "switched off" if subject.no_dropout else "with its probability set to 0"
            notes.append(f"compared with every dropout of the block {how}")
        progress.stage("reading the weights from the forward pass")
        readings = read_parts(subject, roles, max_length(module, kwargs, TRACE_T), notes)
        if isinstance(readings, str):
            notes.append(f"weights not read, black-box results only: {readings}")
            verify = suggest_map(subject.module, C)
        else:
            progress.stage("the reference comparison")
            try:
                finding, match, ties, reading = _compare(subject, readings)
            except CAUGHT as e:  # a layout the reference cannot run is the checker's limit
                notes.append(readings.describe(0))
                notes.append(f"no comparison with the reference: it failed with {one_line(e)}")
            else:
                notes.append(readings.describe(reading))
                findings.append(finding)
                progress.finding(finding)
                compared = True
                if match is not None:
                    found = match.mistakes
                    others = [m.mistakes for m in ties]
                    details.update(  # the variant's account of a mistake is more specific
                        {d.mistake: d.describe(subject.C, match.n_head) for d in match.deviations}
                    )

    diagnosis = _diagnose(found, implied)
    alternatives = [a for a in (_diagnose(o, implied) for o in others) if a != diagnosis]
    details = {m: details[m] for m in diagnosis if m in details}
    return CheckReport(
        description, findings, diagnosis, details, notes, alternatives, compared, verify
    )


def _modern(subject: Subject, longest: int) -> ModernOutcome | None:
    """The modern comparison on the traced input's shape, or None for the lessons' block."""
    B, T = trace_shapes(longest)[0]
    x = subject.input(B, T, subject.C)
    with NoDropout() if subject.no_dropout else nullcontext():
        return check_modern(subject.module, x)


def _diagnose(found: list[str], implied: list[str]) -> list[str]:
    """The mistakes found by comparison, plus those the probes prove that no diagnosed mistake
    explains, in catalogue order."""
    explained = set().union(*(EXPLAINS.get(m, set()) for m in found + implied)) - set(found)
    return [m for m in MISTAKES if m in found or (m in implied and m not in explained)]


_DROPOUT_NAMES = ("p", "dropout", "dropout_p", "attn_pdrop", "resid_pdrop", "drop", "pdrop",
                  "dropout_rate", "drop_prob", "attn_dropout", "resid_dropout", "dropout_prob")  # fmt: skip


def _without_dropout(subject: Subject) -> bool:
    """Set every dropout probability of the subject's block to 0, else switch every dropout off
    where it runs (``trace.NoDropout``); True if that makes its eval outputs deterministic (the
    rest of its arithmetic can then be compared)."""
    for m in subject.module.modules():
        for name, value in vars(m).items():
            if name in _DROPOUT_NAMES and isinstance(value, float) and 0.0 < value < 1.0:
                setattr(m, name, 0.0)
    x = subject.input(subject.T, subject.T, subject.C)
    for switched_off in (False, True):  # a probability it cannot reach: dropout as identity
        subject.no_dropout = switched_off
        try:
            with subject.own_rng():
                if torch.equal(subject(x, seeded=False), subject(x, seeded=False)):
                    return True
        except CAUGHT:
            pass
    subject.no_dropout = False
    return False


def _run(probe: Callable[[Subject], ProbeResult], subject: Subject) -> ProbeResult:
    """Run one probe; a block that raises fails that probe instead of stopping the check."""
    try:
        return probe(subject)
    except CAUGHT as e:
        return ProbeResult(False, f"the block raised {one_line(e)}")


def _compare(
    subject: Subject, read: Readings
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
