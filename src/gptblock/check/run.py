"""``check_block``: tell a learner exactly what is wrong with their transformer block.

Two kinds of evidence, combined into one report:

1. Black-box probes (``gptblock.check.probes``) that need nothing but a module mapping
   (B, T, C) to (B, T, C): the shape contract, causality, batch independence, determinism in
   eval mode, the residual stream, finite outputs, gradients.
2. When the block's parameter names can be read (``gptblock.check.mapping``: the lesson's
   names, ``nn.TransformerEncoderLayer``'s / ``TransformerBlock``'s, nanoGPT / GPT-2's), a
   comparison with the reference, the lessons' block computed step by step
   (``gptblock.check.steps``): the correct block and every combination of up to three
   catalogued mistakes (``gptblock.check.variants``) run with the block's own weights, in
   float64, on the probes' input. The smallest set of mistakes that reproduces the block's
   output within ``TOLERANCE`` (relative to the output's largest entry) is the diagnosis.

A probe failure that proves a mistake on its own (a future leak, batch mixing, dropout in eval,
non-finite outputs, a broken shape) is diagnosed even when the names cannot be mapped, unless a
mistake found by the comparison already explains it (a reversed mask also leaks the future and
leaves the last position NaN).

Shapes: B batch, T time, C channels.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import fields, replace
from typing import Any

import torch
import torch.nn as nn

from ..errors import UserTypeError, UserValueError
from ..fused import FusedBlock
from ..lesson import Block as LessonBlock
from ..mha import TransformerBlock
from .catalogue import MISTAKES
from .mapping import MappedBlock, map_parameters
from .probes import PROBES, ProbeResult, Subject
from .report import CheckReport, Finding, one_line
from .steps import Params
from .variants import TOLERANCE, explain

__all__ = [
    "COMMON_ARGUMENTS",
    "CheckReport",
    "Finding",
    "check_block",
    "fill_common_arguments",
    "own_blocks",
]

COMMON_ARGUMENTS: dict[str, object] = {
    "n_embd": 32,
    "d_model": 32,
    "embed_dim": 32,
    "n_head": 4,
    "n_heads": 4,
    "num_heads": 4,
    "nhead": 4,
    "block_size": 16,
    "dropout": 0.1,
}
"""Small values for the constructor arguments most blocks take. ``dropout`` is non-zero so that
dropout left on in eval mode shows up."""

PROBE_T = 6  # sequence length (and batch size) of the probes, at most the block's block_size
MAX_MISTAKES = 3  # the comparison tries every combination of up to this many mistakes

# A mistake found by the comparison that also causes a probe failure: the failure is not a
# separate mistake. (batch_mixing explains a shape failure that occurs only when B != T.)
EXPLAINS: dict[str, set[str]] = {
    "mask_reversed": {"future_leak", "nonfinite"},
    "softmax_dim": {"future_leak"},
    "batch_mixing": {"shape"},
}


def fill_common_arguments(
    factory: Callable[..., Any], given: Mapping[str, object]
) -> dict[str, object]:
    """``given`` plus a small value for every common argument ``factory`` takes but was not given.

    Args:
        factory: a block class or a function returning a block.
        given: constructor arguments chosen by the caller; they always win.

    Example:
        >>> from gptblock import lesson
        >>> fill_common_arguments(lesson.Block, {"n_head": 2})
        {'n_head': 2, 'n_embd': 32, 'block_size': 16, 'dropout': 0.1}
    """
    try:
        names = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # some builtins have no signature
        return dict(given)
    filled = dict(given)
    for name in names:
        if name in COMMON_ARGUMENTS and name not in filled:
            filled[name] = COMMON_ARGUMENTS[name]
    return filled


def own_blocks() -> list[Callable[..., nn.Module]]:
    """gptblock's own block classes, which ``gptblock check`` checks when given no target.

    Example:
        >>> [b.__name__ for b in own_blocks()][:2]
        ['Block', 'TransformerBlock']
    """
    return [LessonBlock, TransformerBlock, FusedBlock]


def check_block(target: nn.Module | Callable[..., nn.Module], /, **kwargs: object) -> CheckReport:
    """Check a transformer block and diagnose its mistakes.

    Args:
        target: an ``nn.Module`` mapping (B, T, C) to (B, T, C), or a class / factory that builds
            one. A factory is called with ``kwargs`` plus ``fill_common_arguments``'s defaults,
            under ``torch.manual_seed(0)`` (the caller's RNG state is restored), so a check is
            reproducible.
        **kwargs: constructor arguments; only with a class / factory.

    Returns:
        A ``CheckReport``: ``passed``, ``findings`` (one per check) and ``diagnosis`` (ids from
        ``gptblock.check.catalogue.MISTAKES``). The target itself is never changed: every check
        runs on a float64, eval-mode deep copy. While it runs, torch uses one intra-op thread
        (the probes' tensors are tiny); the caller's setting is restored.

    Raises:
        ValueError: the factory fails to build a block, or the block's width C cannot be told.
        TypeError: ``target`` is neither a module nor callable, or the factory returns a
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
    module, description = _build(target, kwargs)
    threads = torch.get_num_threads()
    # The probes' tensors are tiny: extra intra-op threads only add synchronisation, which on a
    # busy 2-core machine made one check 70x slower (2.3 s against 33 ms). Restored below.
    torch.set_num_threads(1)
    try:
        return _check(module, description, kwargs)
    finally:
        torch.set_num_threads(threads)


def _check(module: nn.Module, description: str, kwargs: Mapping[str, object]) -> CheckReport:
    mapped = map_parameters(module)
    C = _width(module, mapped, kwargs)
    T = min(PROBE_T, _max_length(module, kwargs))
    subject = Subject(module, C, T)
    notes = [subject.note] if subject.note else []

    results: list[ProbeResult] = []
    findings: list[Finding] = []
    for name, probe in PROBES.items():
        results.append(_run(probe, subject))
        findings.append(Finding(name, results[-1].passed, results[-1].message))
        if results[-1].stop:
            notes.append("the other checks need the shape contract and were not run")
            break
    implied = [r.implies for r in results if r.implies]  # mistakes the probes prove
    details = {r.implies: r.message for r in results if r.implies}
    found: list[str] = []  # mistakes the reference comparison reproduces

    if not isinstance(mapped, MappedBlock):
        notes.append(
            f"names cannot be mapped to the reference, black-box results only: {mapped.reason}"
        )
    elif results[-1].stop:
        notes.append(mapped.describe())
    elif "dropout_in_eval" in implied:
        notes.append(mapped.describe())
        notes.append("no comparison with the reference: the outputs are random in eval mode")
    else:
        notes.append(mapped.describe())
        try:
            finding, found, what = _compare(subject, mapped)
        except Exception as e:  # a layout the reference cannot run is the checker's limit
            notes.append(f"no comparison with the reference: it failed with {one_line(e)}")
        else:
            findings.append(finding)
            details.update(what)  # the variant's account of a mistake is more specific

    diagnosis = _diagnose(found, implied)
    details = {m: details[m] for m in diagnosis if m in details}
    return CheckReport(description, findings, diagnosis, details, notes)


def _diagnose(found: list[str], implied: list[str]) -> list[str]:
    """The mistakes found by comparison, plus those the probes prove that no diagnosed mistake
    explains, in catalogue order."""
    explained = set().union(*(EXPLAINS.get(m, set()) for m in found + implied)) - set(found)
    return [m for m in MISTAKES if m in found or (m in implied and m not in explained)]


def _run(probe: Callable[[Subject], ProbeResult], subject: Subject) -> ProbeResult:
    """Run one probe; a block that raises fails that probe instead of stopping the check."""
    try:
        return probe(subject)
    except Exception as e:
        return ProbeResult(False, f"the block raised {one_line(e)}")


def _compare(subject: Subject, mapped: MappedBlock) -> tuple[Finding, list[str], dict[str, str]]:
    """Search the variants for the one that reproduces the block; returns the finding, the
    mistakes found and what exactly each one is in this block."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(subject.T, subject.T, subject.C, generator=g, dtype=torch.float64)
    x = x.to(subject.device)  # (B, T, C) with B = T, as the probes use
    y = subject(x.to(subject.dtype)).to(torch.float64)
    params = mapped.params if subject.device.type == "cpu" else _to(mapped, subject.device)
    result = explain(params, x, y, mapped.heads, MAX_MISTAKES)
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
        return Finding(name, False, msg), [], {}
    match = result.match
    within = f"max error {match.error:.1e} of the output scale <= {TOLERANCE:g}"
    if not match.deviations:
        msg = f"computes the lessons' block ({match.activation}, {match.n_head} heads): {within}"
        return Finding(name, True, msg), [], {}
    msg = f"reproduced by the reference with {match.describe()}: {within}"
    if result.alternatives:
        others = "; ".join(m.describe() for m in result.alternatives)
        msg += f" (equally small and also matching: {others})"
    found = list(dict.fromkeys(match.mistakes))
    details = {d.mistake: d.describe(mapped.params.C, match.n_head) for d in match.deviations}
    return Finding(name, False, msg), found, details


def _to(mapped: MappedBlock, device: torch.device) -> Params:
    """The mapped weights on ``device``, where the block's outputs are."""
    values = {f.name: getattr(mapped.params, f.name) for f in fields(mapped.params)}
    moved: dict[str, Any] = {
        k: v.to(device) for k, v in values.items() if isinstance(v, torch.Tensor)
    }
    return replace(mapped.params, **moved)


def _build(target: object, kwargs: dict[str, object]) -> tuple[nn.Module, str]:
    """The module to check and how to name it in the report."""
    if isinstance(target, nn.Module):
        if kwargs:
            raise UserTypeError(
                f"constructor arguments {sorted(kwargs)} given, but the target is already a "
                f"module ({type(target).__name__}); pass its class instead"
            )
        return target, type(target).__name__
    if not callable(target):
        raise UserTypeError(
            f"target must be an nn.Module or a class / factory building one, got {target!r}"
        )
    args = fill_common_arguments(target, kwargs)
    name = getattr(target, "__qualname__", repr(target))
    description = f"{name}({', '.join(f'{k}={v!r}' for k, v in args.items())})"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        try:
            module = target(**args)
        except Exception as e:
            raise UserValueError(f"cannot build {description}: {one_line(e)}") from e
    if not isinstance(module, nn.Module):
        raise UserTypeError(
            f"{description} returned a {type(module).__name__}, expected an nn.Module"
        )
    return module, description


_WIDTH_NAMES = ("n_embd", "d_model", "embed_dim")
_LENGTH_NAMES = ("block_size", "max_len", "context_length", "max_seq_len")


def _width(module: nn.Module, mapped: object, kwargs: Mapping[str, object]) -> int:
    """C: from the mapped weights, a constructor argument, an attribute, or the first norm/linear."""
    if isinstance(mapped, MappedBlock):
        return mapped.params.C
    for source in (kwargs, *(_attributes(m) for m in module.modules())):
        for name in _WIDTH_NAMES:
            value = source.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
                return value
    for m in module.modules():
        if isinstance(m, nn.LayerNorm):
            return int(m.normalized_shape[-1])
        if isinstance(m, nn.Linear):
            return int(m.in_features)
    raise UserValueError(
        f"cannot tell the width C of {type(module).__name__}: no n_embd / d_model / embed_dim "
        "attribute, LayerNorm or Linear layer; give the class an n_embd or d_model argument"
    )


def _max_length(module: nn.Module, kwargs: Mapping[str, object]) -> int:
    """The longest sequence the block accepts, as far as its arguments and buffers tell."""
    for source in (kwargs, *(_attributes(m) for m in module.modules())):
        for name in _LENGTH_NAMES:
            value = source.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
                return value
    for _, buffer in module.named_buffers():
        if buffer.dim() >= 2 and buffer.shape[-1] == buffer.shape[-2] and buffer.shape[-1] >= 1:
            return int(buffer.shape[-1])  # a causal-mask buffer: (..., block_size, block_size)
    return PROBE_T


def _attributes(m: nn.Module) -> dict[str, object]:
    """The module's own attributes, and its ``config``'s, that might name a size."""
    found: dict[str, object] = {}
    config = getattr(m, "config", None)
    for owner in (config, m):
        for name in _WIDTH_NAMES + _LENGTH_NAMES:
            value = getattr(owner, name, None)
            if value is not None:
                found[name] = value
    return found
