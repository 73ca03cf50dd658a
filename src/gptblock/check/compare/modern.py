"""``gptblock check`` on a modern block: compared with the modern reference, not the lessons'.

A block whose forward pass shows RMSNorm, rotary positions, grouped key/value heads or a gated
MLP (``roles.modern_read``) is compared part by part, then whole, with the modern block computed
by ``mistakes.steps`` from the weights read out of it: each norm's form
(``modern_parts.norm_of``), the MLP's (``mlp_of``), the attention's merged heads with the
smallest set of catalogued mistakes (``variants.MODERN`` and the lessons' attention's) under
the unknowns a correct block may choose (``ropes``), the whole block wired pre-norm, in
parallel or as a wiring mistake; a block right on whole sequences has its KV cache's step
compared (``judge_cache``: ``rope_cache_offset``). docs/checker.md, "The modern block", says
what each step accepts and why.

Shapes: B batch, T time, C channels, D attention width, nh heads, hs head size.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import torch

from ..mistakes.catalogue import MISTAKES
from ..mistakes.report import CAUGHT, Finding, text
from ..mistakes.search import TOLERANCE, distance, smallest
from ..mistakes.steps import (
    CORRECT,
    NORM_FORMS,
    Parts,
    Rope,
    Steps,
    Wiring,
    attention,
    parallel,
    run_steps,
)
from ..mistakes.variants import DEVIATIONS, MODERN, Deviation, compose, variants
from ..roles.dataflow import Unread
from ..roles.modern_parts import MlpRead, NormRead, close, lin, mlp_of, norm_of
from ..roles.modern_read import ModernRead, Source, qk_gains, read_modern
from ..roles.modern_rotary import ropes
from ..roles.modern_scope import measured, unmodelled
from ..roles.plain import send
from ..roles.trace import TraceError
from ..serve.loop import CACHE_APIS

__all__ = [
    "CacheProbe", "ModernOutcome", "check_modern", "compare_modern",
    "judge_cache",
]  # fmt: skip

Tensor = torch.Tensor


ROTARY = ("targets", "table")  # the groups that change a rotation: only where there is one
_SHARED_GROUPS = ("mask", "scale", "softmax", "split", "merge")
LESSON = tuple(d for d in DEVIATIONS if d.group in _SHARED_GROUPS)
"""The lessons' attention mistakes, which a modern block can make too."""


def _error(y: Tensor, y_ref: Tensor) -> float:
    """``search.distance``, and 0 where neither is defined anywhere (a root of a negative mean
    everywhere: the norm's own test decided)."""
    nowhere = not torch.isfinite(y_ref).any() and not torch.isfinite(y).any()
    return 0.0 if nowhere else distance(y, y_ref)


def _changes(max_size: int, grouped: bool, rotated: bool) -> Iterator[tuple[Deviation, ...]]:
    """Every set of at most ``max_size`` deviations, one per group, smallest first (the key/value
    order only with grouped heads, the rotary ones only with a rotation)."""
    pool = [
        c for c in (*MODERN, *LESSON)
        if (grouped or c.group != "order") and (rotated or c.group not in ROTARY)
    ]  # fmt: skip
    return variants(max_size, pool)


@dataclass(frozen=True)
class AttnMatch:
    changes: tuple[Deviation, ...]
    rope: Rope | None  # the rotary embedding the block means (the unknowns)
    steps: Steps
    qk_norm: tuple[Tensor, Tensor] | None = None


def _attention_of(read: ModernRead, max_size: int = 2) -> tuple[list[AttnMatch], str]:
    """The smallest sets of changes under which the modern attention reproduces the merged
    heads the block computed (the first of each distinct set of mistakes); and, for a failed
    comparison's message, the modern attention nearest them under the unknowns a correct block
    may choose, and how far it is."""
    q, k, v = (lin(read.h1, w) for w in (read.q, read.k, read.v))
    hs = q.shape[-1] // read.n_head
    grouped = k.shape[-1] < q.shape[-1]
    norms = [None, qk_gains(read, q, k)] if read.rotated else [None]
    nearest = [(float("inf"), "the modern attention")]

    def attempt(changes: tuple[Deviation, ...]) -> AttnMatch | None:
        steps = compose(changes)
        for rope, qk in itertools.product(ropes(hs, read.rotated, read.turn), norms):
            if rope is None and any(c.group in ROTARY for c in changes):
                continue
            try:
                ctx = attention(q, k, v, read.n_head, rope, steps, qk, C=read.x.shape[-1])
            except CAUGHT:
                continue
            if not changes:
                what = " with ".join(
                    ["the modern attention", *([rope.describe(hs)] if rope else []),
                     *(["a qk norm"] if qk is not None else [])]
                )  # fmt: skip
                nearest[0] = min(nearest[0], (_error(read.ctx, ctx), what))
            if (rope, qk) == (None, None) and read.rotated:
                continue
            if close(read.ctx, ctx, TOLERANCE, undefined=True):
                return AttnMatch(changes, rope, steps, qk)
        return None

    found = smallest(_changes(max_size, grouped, read.rotated), attempt)
    off = nearest[0]
    return found, f"{off[1]}, is off by {off[0]:.2g} of its scale > {TOLERANCE:g}"


@dataclass(frozen=True)
class ModernOutcome:
    """What the modern comparison found, for the report."""

    notes: list[str]  # what the block was recognised as, and where its weights were read
    finding: Finding | None  # the reference comparison; None when the weights were not read
    mistakes: list[str]
    details: dict[str, str]
    alternatives: list[list[str]]
    parts: tuple[dict[str, Any], dict[str, Tensor]] | None = None  # a PASS's, plain.send


def _norm_mistakes(norms: list[NormRead], parallel: bool) -> dict[str, str]:
    out: dict[str, str] = {}
    for which, n in zip(("before the attention", "before the MLP"), norms, strict=True):
        key = next((m.id for m in MISTAKES.values() if n.form in m.forms), None)
        if key is not None:
            out.setdefault(
                key,
                f"the RMSNorm {which} computes {NORM_FORMS[n.form]} instead of {NORM_FORMS['rms']}",
            )
    if norms[0].params and norms[0].params == norms[1].params and not parallel:
        out["shared_norm"] = (
            f"the MLP branch reuses the attention branch's norm ({', '.join(norms[0].params)})"
        )
    return out


def _pairing_label(rope: Rope) -> str:
    conv = {
        "halves": "halves (i, i + r/2), as Hugging Face's Llama (rotate_half)",
        "adjacent": "adjacent pairs (2i, 2i + 1), as RoFormer and Meta's Llama (complex numbers)",
    }
    table = {"halves": "cat((freqs, freqs))", "adjacent": "repeat_interleave(freqs, 2)"}
    other = "adjacent" if rope.pairing == "halves" else "halves"
    return (
        f"the rotation pairs channels in {conv[rope.pairing]}, but the cos/sin table is laid out "
        f"for {conv[other]} ({table[other]} instead of {table[rope.pairing]}): each pair is "
        "turned by two different angles"
    )


def compare_modern(source: Source, x: Tensor) -> ModernOutcome | None:
    """Read and compare a modern block traced on ``x`` (B, T, C); ``None`` when it is the lessons'
    block."""
    try:
        read = read_modern(source.trace_of(x))
    except (Unread, TraceError):
        return None  # not read as a modern block: the lessons' reading says why
    if read is None:
        return None
    like = read.x.to(x.dtype)
    norms = [
        norm_of(read.norm1, like, read.norm_params[0]),
        norm_of(read.norm2, like, read.norm_params[1]),
    ]
    post = norms[0].form == "none" and len(read.norms) == 2  # no norm before the attention
    if post:  # the norms after the residual: a post-norm block, for the wiring to tell
        norms = [norm_of(f, like) for f in read.norms]
    grouped = read.k[0].shape[0] < read.q[0].shape[0]
    if not (read.rotated or grouped or len(read.mlp) == 3 or any(n.form in NORM_FORMS for n in norms)):  # fmt: skip
        return None  # nothing of the modern block (an RMSNorm, right or wrong; a rotation...)
    mlp = mlp_of(read)
    attn, closest = _attention_of(read)
    hs = read.q[0].shape[0] // read.n_head
    rope = attn[0].rope if attn else None
    said = [
        "norms: " + ", ".join(dict.fromkeys(n.describe() for n in norms)),
        rope.describe(hs) if rope else "",
        "qk_norm" if attn and attn[0].qk_norm is not None else "",
        measured(read.turn, hs) if read.rotated and not attn else "",
        mlp.describe if mlp else f"an MLP of {len(read.mlp)} matrices (not identified)",
        f"n_kv_head={read.k[0].shape[0] // hs} for {read.n_head} query heads" if grouped else
        f"{read.n_head} heads",
        "parallel residual" if read.parallel else "",
    ]  # fmt: skip
    roles = [f"{r}={n}" for r, n in read.names.items()] + [f"mlp={', '.join(read.mlp_names)}"]
    note = ["modern block: " + ", ".join(p for p in said if p), "roles: " + "; ".join(roles) + (
        " (read from the forward pass, each at its matrix product's output)")]  # fmt: skip
    name = "reference comparison"
    missing = [
        what for what, bad in (
            ("the norm before the attention", norms[0].form == "unknown"),
            ("the norm before the MLP", norms[1].form == "unknown"),
            ("the MLP", mlp is None),
            ("the attention", not attn),
        ) if bad
    ]  # fmt: skip
    if missing or mlp is None:
        msg = (
            f"{' and '.join(missing)} of this modern block computes neither the modern block's "
            "part nor any catalogued mistake of it"
        )
        if not attn:
            msg += f" (the closest, {closest})"
        return _unexplained(read, note, Finding(name, False, msg))
    parts = _parts(read, norms, mlp)
    wiring, error = _wiring(read, parts, attn[0], post)
    if error > TOLERANCE:
        msg = (
            "the modern block with the weights read from this one does not reproduce it "
            f"(max error {error:.1e} of its output scale > {TOLERANCE:g})"
        )
        return _unexplained(read, note, Finding(name, False, msg))
    details = _norm_mistakes(norms, read.parallel)
    details.update(mlp.mistakes)
    if wiring is not None:
        details[wiring.mistake] = wiring.label
    outside = list(details)  # the mistakes outside the attention, common to every alternative
    for c in attn[0].changes:
        label = (
            _pairing_label(rope) if c.mistake == "rope_pairing" and rope
            else c.describe(read.x.shape[-1], read.n_head, hs)
        )  # fmt: skip
        details.setdefault(c.mistake, label)
    within = f"max error {error:.1e} of the output scale <= {TOLERANCE:g}"
    others = [outside + sorted({c.mistake for c in m.changes}) for m in attn[1:]]
    if not details:  # right on whole sequences: then is its cached step?
        with torch.no_grad():
            xs = read.x.to(read.y.dtype)
            shifted = partial(_run, read, parts, attn[0]) if attn[0].rope else None
            cache = judge_cache(*source.cache(xs), xs, _error, TOLERANCE, shifted)
        note.append(cache.note)
        if cache.offset:
            details["rope_cache_offset"] = cache.offset
    if not details:
        found = Finding(name, True, f"computes the modern block: {within}")
        a = attn[0]  # no change: every change is a mistake, in details
        sent = None if a.changes else send(read, norms, mlp, a.rope, a.qk_norm, post)
        return ModernOutcome(note, found, [], {}, [], sent)
    msg = f"matches the modern block only with {' + '.join(details)}: {within}"
    if others:
        msg += f" (equally small and also matching: {'; '.join(' + '.join(o) for o in others)})"
    return ModernOutcome(note, Finding(name, True, msg, "FOUND"), list(details), details, others)


def _unexplained(read: ModernRead, note: list[str], failed: Finding) -> ModernOutcome:
    """A block no variant and no catalogued mistake reproduces: out of scope (no finding:
    ``UNVERIFIED``) where it computes a part the references do not model (``modern_scope``),
    else the failed comparison."""
    parts = unmodelled(read)
    if not parts:
        return ModernOutcome(note, failed, [], {}, [])
    said = f"not compared, as the references do not model it: {'; '.join(parts)}"
    return ModernOutcome([*note, said], None, [], {}, [])


def _wiring(read: ModernRead, parts: Parts, a: AttnMatch, post: bool) -> tuple[Deviation | None, float]:  # fmt: skip
    """The modern block with the parts as read, wired pre-norm (or in parallel, GPT-J), else
    with one of the lessons' wiring mistakes: the mistake (None for none) and the error."""
    with torch.no_grad():
        best: tuple[Deviation | None, float] = (None, _error(read.y, _run(read, parts, a)))
        for d in () if read.parallel else DEVIATIONS:
            if best[1] <= TOLERANCE:
                break
            if d.group == "wiring" and (d.mistake == "post_norm") == post:
                wiring = d.apply(CORRECT).wiring
                error = _error(read.y, _run(read, parts, a, None, wiring))
                best = (d, error) if error < best[1] else best
        return best


def _parts(read: ModernRead, norms: list[NormRead], mlp: MlpRead) -> Parts:
    """The modern block's sub-layers as read, as the lessons' ``Parts`` (``fc1``: the MLP's
    hidden function)."""

    def qkv(h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return lin(h, read.q), lin(h, read.k), lin(h, read.v)

    proj, down = partial(lin, w=read.proj), partial(lin, w=read.mlp[-1])
    C, D = read.x.shape[-1], read.q[0].shape[0]
    return Parts(C, D, qkv, proj, mlp.hidden, down, norms[0].function, norms[1].function)


def _run(
    read: ModernRead,
    parts: Parts,
    a: AttnMatch,
    positions: Tensor | None = None,
    wiring: Wiring | None = None,
) -> Tensor:
    """The modern block on the traced input, its attention as matched, its tokens rotated at
    ``positions`` (by default 0 ... T-1), wired by ``wiring`` (by default pre-norm, or in
    parallel: GPT-J / PaLM)."""
    wiring = wiring or (parallel if read.parallel else CORRECT.wiring)
    steps = replace(a.steps, wiring=wiring)
    return run_steps(parts, read.x, read.n_head, None, steps, a.rope, a.qk_norm, positions)


@dataclass(frozen=True)
class CacheProbe:
    """What ``judge_cache`` found: a note for the report, and the label of
    ``rope_cache_offset`` when the cached step is rotated as position 0 (else ``""``)."""

    note: str
    offset: str = ""


def judge_cache(
    said: dict[str, Any],
    tensors: dict[str, Tensor],
    x: Tensor,
    error: Callable[[Tensor, Tensor], float],
    tolerance: float,
    shifted: Callable[[Tensor], Tensor] | None,
) -> CacheProbe:
    """What ``loop.drive_cache`` answered on ``x`` (where the block runs: plain data, checked
    here), compared: the cached step with the whole sequence's last position (``error`` at most
    ``tolerance``), else with the rebuilt block's with its tokens rotated at the given positions
    (T,) (``shifted``; None when nothing is rotated)."""
    api = said.get("api")
    if api is None:
        return CacheProbe("cache: not probed: no cache API recognised (" + ", ".join(CACHE_APIS) + ")")  # fmt: skip
    if api not in CACHE_APIS:
        return CacheProbe("cache: not probed: an answer about no cache API the checker knows")
    T = x.shape[1]
    how = {"start_pos": f"start_pos={T - 1}", "input_pos": f"input_pos=[{T - 1}]"}.get(
        api, f"{api} from the prefix's call"
    )
    said_ = f"cache ({api}): one step at position {T - 1} ({how}) after the prefix"
    if "raised" in said:
        return CacheProbe(f"cache: not probed: driving {api} raised {text(said['raised'], 300)}")
    whole, step = tensors.get("whole"), tensors.get("step")
    if not (
        isinstance(whole, Tensor) and isinstance(step, Tensor)
        and whole.shape == step.shape == (x.shape[0], 1, x.shape[2])
    ):  # fmt: skip
        return CacheProbe(f"cache: not probed: driving {api} gave no (B, 1, C) outputs")
    whole, step = whole.to(x.device), step.to(x.device)
    far = error(step, whole)
    if far <= tolerance:
        return CacheProbe(f"{said_} equals the whole sequence's last position")
    at = torch.cat((torch.arange(T - 1), torch.zeros(1, dtype=torch.long)))  # the step at 0
    if shifted is not None and error(step, shifted(at.to(x.device))[:, -1:]) <= tolerance:
        label = (
            f"a cached decoding step at position {T - 1} ({how}) is rotated as position 0: "
            "its q and k are turned by the angles of the first position, not by those of "
            "its offset in the sequence (whole sequences, at positions 0 ... T-1, are right)"
        )
        return CacheProbe(f"{said_} is rotated as position 0", label)
    return CacheProbe(
        f"{said_} differs from the whole sequence's last position (by {far:.2g} of its scale) "
        "in a way not identified (not counted in the verdict)"
    )


def check_modern(source: Source, x: Tensor) -> ModernOutcome | None:
    """``compare_modern``; ``None`` also when the checker's own code fails on the block, so that
    the lessons' reading (and its report of what it cannot read) takes over."""
    try:
        with torch.no_grad():
            y = source.call(x)
        if isinstance(y, Tensor) and not torch.isfinite(y).all():  # a root of a negative mean?
            x = x.abs() + 1.0  # positive inputs leave more of such a block defined
        return compare_modern(source, x)
    except CAUGHT:
        return None
