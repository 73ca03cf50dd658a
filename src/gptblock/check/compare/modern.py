"""A modern block (``roles.modern_read``) compared with the one reference's modern options: the
norms and MLP by form, the merged heads under the smallest set of deviations, the whole block
wired, then its KV cache's step. docs/checker.md, "The modern block". B batch, T time, C channels.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, cast

import torch

from ..mistakes.catalogue import DEVIATIONS, MISTAKES, MODERN, compose
from ..mistakes.report import CAUGHT, COMPARISON, OUT_OF_SCOPE, Finding, text
from ..mistakes.search import TOLERANCE, Match, distance, explain
from ..mistakes.steps import NORM_FORMS, Deviation, Parts, Rope, Steps, affine, run_steps
from ..roles.cores import cores
from ..roles.modern_parts import MODERN_ONLY, mlp_of, norm_of, other_activation
from ..roles.modern_read import ModernRead, Source, Turn, qk_gains, read_modern, ropes
from ..roles.plain import send
from ..roles.provenance import Traced
from ..roles.scope import unmodelled
from ..serve.cache import CACHE_APIS

__all__ = ["CacheProbe", "Compared", "check_modern", "judge_cache", "matched"]

Tensor = torch.Tensor
ROTARY = ("targets", "table")  # the groups that change a rotation: only where there is one
LESSON = tuple(d for d in DEVIATIONS if d.group in ("mask", "scale", "softmax", "split", "merge"))
_PARTS = ("the norm before the attention", "the norm before the MLP", "the MLP", "the attention")


def _error(y: Tensor, y_ref: Tensor) -> float:  # 0 where neither is defined (the norms decided)
    nowhere = not torch.isfinite(y_ref).any() and not torch.isfinite(y).any()
    return 0.0 if nowhere else distance(y, y_ref)


def _attention_of(read: ModernRead) -> tuple[list[Match], str, Parts]:
    """The smallest sets of changes that reproduce the merged heads (else how far), the parts."""
    wq, wk, wv, proj = (affine(*w) for w in (read.q, read.k, read.v, read.proj))
    (D, C), qkv = read.q[0].shape, lambda h: (wq(h), wk(h), wv(h))
    parts = Parts(C, D, qkv, proj, proj, proj, None, None)
    h, ctx = read.rows("q"), read.rows("proj")
    q, k, _ = parts.qkv(h)
    hs = q.shape[-1] // read.n_head
    if read.rotated:  # each head's q and k turned alike at every position cancels in q . k (s93)
        same = explain([parts], h, ctx, (read.n_head,), 0, (), [(None, None)], True, _error)
        if same.match:
            return [same.match], "", parts
    norms = [None, qk_gains(read, q, k)] if read.rotated else [None]
    turns = list(itertools.product(ropes(hs, read.rotated, read.turn), norms))
    pool = [
        c for c in (*MODERN, *LESSON)
        if (k.shape[-1] < q.shape[-1] or c.group != "order") and (read.rotated or c.group not in ROTARY)
    ]  # fmt: skip
    turned = [t for t in turns if t[0] or t[1] is not None or not read.rotated]  # one turns
    found = explain([parts], h, ctx, (read.n_head,), 2, pool, turned, alone=True)
    if found.match:
        return [found.match, *found.alternatives], "", parts
    nearest = explain([parts], h, ctx, (read.n_head,), 0, (), turns, True, _error)
    near = cast(Match, nearest.match or nearest.closest)  # a match: undefined in both, a turn less
    said = [near.rope.describe(hs)] if near.rope else []
    said += ["a qk norm"] if near.qk_norm is not None else []
    what = " with ".join(["the modern attention", *said])
    return [], f"{what}, is off by {near.error:.2g} of its scale > {TOLERANCE:g}", parts


@dataclass(frozen=True)
class Compared:
    """What the comparison with a reference (the modern one or the lessons') concluded."""

    finding: Finding | None  # None: nothing to report (out of scope, or not confirmed)
    alternatives: list[list[str]] = field(default_factory=list)
    details: dict[str, str] = field(default_factory=dict)  # each mistake found: what it does
    traced: Traced | None = None  # a confirmed PASS's weights, traced to the values chosen
    verify: str = ""  # the --map that would read the weights, when they could not be
    notes: list[str] = field(default_factory=list)  # the modern block's: what it was read as
    parts: tuple[dict[str, Any], dict[str, Tensor]] | None = None  # a modern PASS's, plain.send


def matched(block: str, error: float, mistakes: str = "", others: Iterable[str] = ()) -> Finding:
    """The comparison's line: ``block`` reproduced as it is (PASS), or only with ``mistakes``
    (FOUND), and the ``others`` that match as well."""
    within = f"max error {error:.1e} of the output scale <= {TOLERANCE:g}"
    if not mistakes:
        return Finding(COMPARISON, True, f"computes {block}: {within}")
    also = "; ".join(others)
    also = f" (equally small and also matching: {also})" if also else ""
    said = f"matches {block} only with {mistakes}: {within}{also}"
    return Finding(COMPARISON, True, said, "FOUND")


def check_modern(source: Source, x: Tensor) -> Compared | None:
    """``None`` where the lessons' reading takes over (not a modern block, or the checker fails)."""
    try:
        with torch.no_grad():
            y = source.call(x)
        if isinstance(y, Tensor) and not torch.isfinite(y).all():  # a root of a negative mean?
            x = x.abs() + 1.0  # positive inputs leave more of such a block defined
        read = read_modern(trace := source.trace_of(x))
        if read is None and len(cores(trace)) == len(x) > 1:  # a core per sequence: a loop
            read = read_modern(source.trace_of(x[:1]))  # over them, one core at B = 1
        return None if read is None else _compare(source, read, x.dtype)
    except CAUGHT:  # Unread, TraceError among them
        return None


def _compare(source: Source, read: ModernRead, dtype: torch.dtype) -> Compared | None:
    x, y = read.rows("x"), read.rows("y")
    like = x.to(dtype)
    norms = [
        norm_of(f, like, p) for f, p in zip((read.norm1, read.norm2), read.norm_params, strict=True)
    ]
    post = norms[0].form == "none" and len(read.norms) == 2  # no norm before the attention
    if post:  # the norms after the residual: a post-norm block, for the wiring to tell
        norms = [norm_of(f, like) for f in read.norms]
    hs = read.q[0].shape[0] // read.n_head
    grouped = read.k[0].shape[0] < read.q[0].shape[0]
    mlp = mlp_of(read)  # an activation the lessons' reference does not try: SiLU, ReLU^2...
    odd, measured = other_activation(read) if mlp is None else ("", None)  # tanh, ELU...
    mlp = mlp or measured  # no reference's: the block's own, for the rest's mistakes
    # an MLP not identified: the attention compared alone still names its mistakes
    other = mlp is None or mlp.activation in (*MODERN_ONLY, "measured")
    if not (read.rotated or grouped or other or len(read.mlp) == 3 or any(n.form in NORM_FORMS for n in norms)):  # fmt: skip
        return None  # nothing of the modern block (an RMSNorm, right or wrong; a rotation...)
    attn, closest, attention = _attention_of(read)
    a = attn[0] if attn else None
    said = [
        "norms: " + ", ".join(dict.fromkeys(n.describe() for n in norms)),
        a.rope.describe(hs) if a and a.rope else "",
        "qk_norm" if a and a.qk_norm is not None else "",
        _measured(read.turn, hs) if read.rotated and not a else "",
        "q and k turned alike at every position, which cancels in their product"
        if read.rotated and a and not a.rope and a.qk_norm is None else "",
        mlp.describe if mlp else f"an MLP of {len(read.mlp)} matrices (not identified)",
        f"n_kv_head={read.k[0].shape[0] // hs} for {read.n_head} query heads" if grouped else
        f"{read.n_head} heads",
        "parallel residual" if read.parallel else "",
    ]  # fmt: skip
    names = {r: ", ".join(role.params) for r, role in read.roles.items()}
    mlp_names = ", ".join(n for r, n in names.items() if r.startswith("fc"))
    roles = [f"{r}={names[r]}" for r in ("q", "k", "v", "proj")] + [f"mlp={mlp_names}"]
    note = ["modern block: " + ", ".join(p for p in said if p), "roles: " + "; ".join(roles) + (
        " (read from the forward pass, each at its matrix product's output)")]  # fmt: skip
    missing = [n.form == "unknown" for n in norms] + [mlp is None, a is None]
    if mlp is None or a is None or any(missing):
        which = " and ".join(w for w, bad in zip(_PARTS, missing, strict=True) if bad)
        msg = f"{which} of this modern block computes neither the modern block's part nor any "
        msg += "catalogued mistake of it" + ("" if a else f" (the closest, {closest})")
        if a is None or not a.deviations:
            return _unexplained(read, note, msg)
        named = {c.mistake: c.describe(x.shape[-1], read.n_head, hs, a.rope) for c in a.deviations}
        msg += f"; its attention is the modern attention with {' + '.join(named)}"
        return Compared(Finding(COMPARISON, False, msg), [], named, notes=note)
    fc2, ln1, ln2 = affine(*read.mlp[-1]), norms[0].function, norms[1].function
    parts = replace(attention, fc1=mlp.hidden, fc2=fc2, ln1=ln1, ln2=ln2, parallel=read.parallel)
    steps = compose(a.deviations)

    def run(positions: Tensor | None = None, steps: Steps = steps) -> Tensor:
        return run_steps(parts, x, read.n_head, None, steps, a.rope, a.qk_norm, positions)

    with torch.no_grad():
        wiring: Deviation | None = None
        error = _error(y, run())
        for d in DEVIATIONS:  # a lessons' wiring mistake (a parallel block's too)?
            if error > TOLERANCE and d.group == "wiring" and (d.mistake == "post_norm") == post:
                off = _error(y, run(None, d.apply(steps)))
                wiring, error = (d, off) if off < error else (wiring, error)
    if error > TOLERANCE:
        return _unexplained(read, note, (
            "the modern block with the weights read from this one does not reproduce it "
            f"(max error {error:.1e} of its output scale > {TOLERANCE:g})"))  # fmt: skip
    details: dict[str, str] = {}
    for which, n in zip(("before the attention", "before the MLP"), norms, strict=True):
        key = next((m.id for m in MISTAKES.values() if n.form in m.forms), None)
        if key is not None:
            form = f"computes {NORM_FORMS[n.form]} instead of {NORM_FORMS['rms']}"
            details.setdefault(key, f"the RMSNorm {which} {form}")
    if norms[0].params and norms[0].params == norms[1].params and not read.parallel:
        shared = ", ".join(norms[0].params)
        details["shared_norm"] = f"the MLP branch reuses the attention branch's norm ({shared})"
    details |= mlp.mistakes
    if wiring is not None:
        details[wiring.mistake] = wiring.label
    outside = list(details)  # the mistakes outside the attention, common to every alternative
    for c in a.deviations:
        details.setdefault(c.mistake, c.describe(x.shape[-1], read.n_head, hs, a.rope))
    others = [outside + sorted({c.mistake for c in m.deviations}) for m in attn[1:]]
    if odd and not details:  # the rest of the block compared with its own activation
        return Compared(None, notes=[*note, f"{OUT_OF_SCOPE}{odd}"])
    if odd:  # its mistakes: found whatever the activation
        note.append(f"{odd}: the rest of the block compared with the block's own, as traced")
    if not details:  # right on whole sequences: then is its cached step?
        with torch.no_grad():
            cache = judge_cache(*source.cache(x), x, run if a.rope else None)
        note.append(cache.note)
        if cache.offset:
            details["rope_cache_offset"] = cache.offset
        elif cache.failed:
            return Compared(Finding(COMPARISON, False, cache.failed), notes=note)
    if not details:  # no mistake (every change is one, in details): its parts, to confirm it
        sent = send(read, norms, mlp, a.rope, a.qk_norm, post)
        return Compared(matched("the modern block", error), notes=note, parts=sent)
    found = matched("the modern block", error, " + ".join(details), map(" + ".join, others))
    return Compared(found, others, details, notes=note)


def _unexplained(read: ModernRead, note: list[str], failed: str) -> Compared:
    """Out of scope (UNVERIFIED) where a part is one no reference models, else FAIL."""
    parts = unmodelled(read)
    if not parts:
        return Compared(Finding(COMPARISON, False, failed), notes=note)
    return Compared(None, notes=[*note, f"{OUT_OF_SCOPE}{'; '.join(parts)}"])


@dataclass(frozen=True)
class CacheProbe:
    note: str
    offset: str = ""
    failed: str = ""  # a cached step that differs, its cache read (the prefix changes it)


def judge_cache(
    said: dict[str, Any],
    tensors: dict[str, Tensor],
    x: Tensor,
    shifted: Callable[[Tensor], Tensor] | None,
) -> CacheProbe:
    """``serve.cache.drive_cache``'s answer on ``x`` (plain data, checked here): the cached step
    against the whole sequence's last position, else ``shifted`` (tokens rotated at positions
    (T,)), else the step without the prefix (a block keeping no cache)."""
    api = said.get("api")
    if api is None:
        return CacheProbe(f"cache: not probed: no cache API recognised ({', '.join(CACHE_APIS)})")
    if api not in CACHE_APIS:
        return CacheProbe("cache: not probed: an answer about no cache API the checker knows")
    if "raised" in said:
        return CacheProbe(f"cache: not probed: driving {api} raised {text(said['raised'], 300)}")
    T = x.shape[1]
    given = text(said.get("with", ""), 200)
    how = {"start_pos": f"start_pos={T - 1}", "input_pos": f"input_pos=[{T - 1}]"}.get(
        api, f"{api} from the prefix's call"
    ) + f", {given}" * bool(given)
    step_at = f"cache ({api}): one step at position {T - 1} ({how}) after the prefix"
    whole, step = tensors.get("whole"), tensors.get("step")
    if not (
        isinstance(whole, Tensor) and isinstance(step, Tensor)
        and whole.shape == step.shape == (x.shape[0], 1, x.shape[2])
    ):  # fmt: skip
        return CacheProbe(f"cache: not probed: driving {api} gave no (B, 1, C) outputs")
    whole, step = whole.to(x.device), step.to(x.device)
    far = _error(step, whole)
    if far <= TOLERANCE:
        return CacheProbe(f"{step_at} equals the whole sequence's last position")
    at = torch.cat((torch.arange(T - 1), torch.zeros(1, dtype=torch.long)))  # the step at 0
    if shifted is not None and _error(step, shifted(at.to(x.device))[:, -1:]) <= TOLERANCE:
        label = (
            f"a cached decoding step at position {T - 1} ({how}) is rotated as position 0: "
            "its q and k are turned by the angles of the first position, not by those of "
            "its offset in the sequence (whole sequences, at positions 0 ... T-1, are right)"
        )
        return CacheProbe(f"{step_at} is rotated as position 0", label)
    differs = (
        f"{step_at} differs from the whole sequence's last position (by {far:.2g} of its scale)"
    )
    alone = tensors.get("alone")
    if not isinstance(alone, Tensor) or alone.shape != step.shape:
        return CacheProbe(f"{differs} in a way not identified (not counted in the verdict)")
    if _error(step, alone.to(x.device)) <= TOLERANCE:  # (gpt-fast's input_pos without its cache)
        return CacheProbe(f"{differs}, as without the prefix: no cache kept (not counted)")
    failed = f"equal on whole sequences, but one cached step at position {T - 1} ({how}) after "
    failed += f"the prefix is off by {far:.2g} of its scale: generating with its cache computes "
    return CacheProbe(differs, failed=failed + "another block (the step reads the prefix's cache)")


def _measured(turn: Turn | None, hs: int) -> str:
    if turn is None or not turn.fits or turn.pairing not in ("halves", "adjacent"):
        return "something between the projections and the scores (not identified)"
    rope = Rope(turn.theta, turn.dim, turn.pairing, turn.pairing, 1.0).describe(hs)
    return f"{rope.replace('rope (', 'rope as measured (', 1)}, the attention not identified"
