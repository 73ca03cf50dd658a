"""Black-box checks: they need nothing but a module that maps (B, T, C) to (B, T, C). Each
returns a ``ProbeResult``, naming the catalogued mistake its failure proves, if any."""

from __future__ import annotations

import re
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from typing import NamedTuple

import torch

from ..mistakes.report import CAUGHT, one_line
from ..serve.subject import Grads, Probed

__all__ = ["MIXED", "PROBES", "RESIDUAL_LIMIT", "ProbeResult", "elsewhere", "listed"]

RESIDUAL_LIMIT = 0.05  # |dy - d| / |d| above which the input is not kept in the residual stream
LARGE = {torch.float64: 1e4, torch.float32: 1e3}  # "large input" scale per dtype


class ProbeResult(NamedTuple):
    """One probe's outcome, the catalogued mistake its failure proves, and whether to stop."""

    passed: bool
    message: str  # what was measured and found
    implies: str | None = None  # a catalogue id, when the failure proves that mistake
    stop: bool = False  # True when later probes cannot run (the shape contract failed)


def _size(scale: float) -> str:
    return f"{scale:.0e}".replace("e+0", "e")  # 1e4, not 1e+04


def listed(names: list[str], limit: int = 4) -> str:
    """The first ``limit`` names, and how many more."""
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _runs(s: Probed, x: torch.Tensor) -> bool:
    try:
        return s(x).shape == x.shape
    except CAUGHT:
        return False


def shape(s: Probed) -> ProbeResult:
    """(T, T, C) and (T + 1, T, C) inputs come back with their own shapes, dtype and device, and
    a (2, T - 1, C) one with its shape (generation calls every length up to block_size)."""
    T, C = s.T, s.C
    for B in (T, T + 1):
        x = s.input(B, T, C)
        try:
            y = s(x)
        except CAUGHT as e:
            if B == T:
                msg = f"calling it on a {(B, T, C)} input raised {one_line(e)}"
                if T < (L := min(s.longest, 256)) and _runs(s, s.input(2, L, C)):
                    msg += f", a (2, {L}, {C}) one runs: it runs only at its longest sequence, "
                    msg += f"T = {L} (a mask or table not cut to T?)"
                return ProbeResult(False, msg, "shape", stop=True)
            msg = f"it works on a {(T, T, C)} input but a {(B, T, C)} input raised {one_line(e)}; "
            msg += "it only works when the batch size equals the sequence length, a sign that "
            msg += "batch and time are mixed up"
            return ProbeResult(False, msg, "shape")
        dtypes = [str(t.dtype).removeprefix("torch.") for t in (x, y)]
        if y.shape != x.shape:
            msg = f"a {tuple(x.shape)} input gave a {tuple(y.shape)} output, expected {tuple(x.shape)}"
            return ProbeResult(False, msg, "shape", stop=True)
        if y.device != x.device:
            msg = f"a {x.device} input gave an output on {y.device}, expected {x.device}"
            return ProbeResult(False, msg, "dtype_device", stop=True)
        if y.dtype != x.dtype:
            msg = f"a {dtypes[0]} input gave a {dtypes[1]} output, expected {dtypes[0]}"
            return ProbeResult(False, msg, "dtype_device")
    if T > 1:
        x = s.input(2, T - 1, C)
        try:
            said = "" if (y := s(x)).shape == x.shape else f"gave a {tuple(y.shape)} output"
        except CAUGHT as e:
            said = f"raised {one_line(e)}"
        if said:
            msg = f"it works at T = {T} but a {tuple(x.shape)} input {said}: it runs only at "
            msg += "some lengths (a mask or table sized for one length, not cut to T?)"
            return ProbeResult(False, msg, "shape", stop=True)
    return ProbeResult(True, " and ".join(f"{(B, T, C)} -> {(B, T, C)}" for B in (T, T + 1)))


def determinism(s: Probed) -> ProbeResult:
    """Two eval-mode calls on the same input agree."""
    x = s.input(s.T, s.T, s.C)
    with s.own_rng():  # one fork for both calls, so that a random block draws differently
        y1, y2 = s(x, seeded=False), s(x, seeded=False)
    moved = s.moved(y1, y2)
    if not moved.any():
        return ProbeResult(True, "two eval-mode calls give equal outputs")
    worst = float((y1 - y2).abs().nan_to_num(0.0).max())
    msg = f"two eval-mode calls on the same input differ ({int(moved.sum())} of {moved.numel()} "
    msg += f"values, by up to {worst:.3g}): something random is still on in eval mode"
    return ProbeResult(False, msg, "dropout_in_eval")


def causality(s: Probed) -> ProbeResult:
    """Perturbing position t moves no output before t."""
    T, C = s.T, s.C
    x = s.input(T, T, C)
    y = s(x)
    if not y.isfinite().any():
        return ProbeResult(False, "not measured: the outputs are not finite for ordinary inputs")
    leaks: list[tuple[int, int]] = []  # (earlier position that moved, later position perturbed)
    past = False  # whether a change moves any later output: a position sees its past
    for t in range(T):
        x2 = x.clone()
        x2[:, t] += s.input(T, C)  # (B, C): a different change in every sequence
        y2 = s(x2)  # (a NaN reaches earlier rows through zero weights, 0 * NaN: not a leak)
        finite = y.isfinite() & y2.isfinite()
        moved = (s.moved(y, y2) & finite).any(dim=2).any(dim=0)  # (T,): positions that moved
        leaks += [(int(p), t) for p in moved[:t].nonzero().flatten()]
        past |= bool(moved[t + 1 :].any())
    if not leaks:
        msg = f"perturbing position t moves no output before t (t = 1..{T - 1}, to {s.tol:g} of the output scale)"
        return ProbeResult(True, msg)
    p, t = min(leaks)
    msg = f"position {p}'s output changes when position {t} changes, so it sees the future "
    msg += f"({len(leaks)} (earlier, later) position pairs leak)"
    if not past:  # the mask the wrong way round: each position sees later ones, never earlier
        return ProbeResult(False, f"{msg}, and no change moves a later output", "mask_reversed")
    return ProbeResult(False, msg, "future_leak")


def batch_independence(s: Probed) -> ProbeResult:
    """Perturbing one sequence of the batch moves no other sequence's output."""
    T, C = s.T, s.C
    x = s.input(T, T, C)
    y = s(x)
    for b in (0, T - 1):
        x2 = x.clone()
        x2[b] += s.input(T, C)
        moved = s.moved(y, s(x2)).flatten(1).any(dim=1)  # (B,): sequences whose output moved
        moved[b] = False
        if moved.any():
            msg = f"changing sequence {b} of the batch changes the output of sequence "
            msg += f"{int(moved.nonzero()[0])}: examples of a batch are mixed"
            return ProbeResult(False, msg, "batch_mixing")
    return ProbeResult(True, "changing one sequence moves no other sequence's output")


def residual(s: Probed) -> ProbeResult:
    """A unit-size change d to an input scaled up by S passes straight through a pre-norm block,
    whose branches see only the normalised input (|dy - d| / |d| ~ |f'| / S); a post-norm block,
    or one that overwrites the stream, shrinks d by ~1/S (the comparison tells those apart)."""
    T, C, S = s.T, s.C, LARGE[s.dtype]
    x, d = s.input(T, T, C, scale=S), s.input(T, T, C)
    y, y2 = s(x), s(x + d)
    ok = torch.isfinite(y).all(dim=-1) & torch.isfinite(y2).all(dim=-1)  # (B, T)
    if not ok.any():
        msg = f"not measured: the outputs are not finite for inputs of size {_size(S)}"
        return ProbeResult(False, msg)
    r = float((y2 - y - d)[ok].norm() / d[ok].norm())
    change = f"a change d to a size-{_size(S)} input"
    if r <= RESIDUAL_LIMIT:
        msg = f"{change} passes through (pre-norm): |dy - d| / |d| = {r:.2g} <= {RESIDUAL_LIMIT}"
        return ProbeResult(True, msg)
    msg = f"{change} does not pass through: |dy - d| / |d| = {r:.2g} > {RESIDUAL_LIMIT}; the "
    msg += "stream is normalised after adding (post_norm), overwritten (no_residual), read by a "
    msg += "branch with no norm before it, or changed itself before the branches add to it"
    return ProbeResult(False, msg)


def finite(s: Probed) -> ProbeResult:
    """Ordinary, large and partly-zero inputs give finite outputs (the last: a norm without eps)."""
    T, C, S = s.T, s.C, LARGE[s.dtype]
    zero = s.input(T, T, C)
    zero[:, 0] = 0.0  # position 0 of every sequence is the zero vector
    cases = {
        "ordinary inputs": s.input(T, T, C),
        f"inputs of size {_size(S)}": s.input(T, T, C, scale=S),
        "an all-zero position": zero,
    }
    bad = []
    for what, x in cases.items():
        y = s(x)
        if n := int((~torch.isfinite(y)).sum()):
            bad.append(f"{what} ({n} of {y.numel()} values)")
    if bad:
        return ProbeResult(False, f"inf/NaN outputs for {', '.join(bad)}", "nonfinite")
    return ProbeResult(True, f"finite for {', '.join(cases)}")


def gradients(s: Probed) -> ProbeResult:
    """A backward pass reaches every parameter, with finite values, in the copy's dtype and in
    float32 (there ``x.float()`` is ``x`` itself, so an in-place change may break only there). A
    second one breaks where a graph is kept in the block: said, not failed, since a KV cache
    written so (Meta's Llama) is right under torch.no_grad, where it is meant to run."""
    x, w = s.input(s.T, s.T, s.C), s.input(s.T, s.T, s.C)
    got, where, kept = s.grads(x, w), "", ""
    if got.kept:  # (``Subject.grads`` made a second call)
        kept = " on a first call; a second call's backward pass runs through the first call's "
        kept += f"graph, kept in {got.kept} (a KV cache written in place: right under "
        kept += "torch.no_grad; to train it, store a detached copy)"
    float32 = not got.failed and got.names and s.dtype != torch.float32
    if float32 and (again := s.grads(x.float(), w.float())).failed:
        got, where = again, " in float32"
    if not got.names:
        return ProbeResult(True, "the block has no trainable parameters")
    if got.failed == "forward":
        msg = f"the forward pass fails{where} with autograd on: an in-place change ({got.message})"
        return ProbeResult(False, msg, "inplace")
    if got.failed:
        msg = f"the backward pass fails{where}: an in-place operation (such as x += ...) changed "
        msg += "a tensor autograd had saved for it"
        return ProbeResult(False, msg, "inplace")
    pairs = list(zip(got.names, got.grads, strict=True))
    unreached = [n for n, g in pairs if g is None]
    nonfinite = [n for n, g in pairs if g is not None and not g.isfinite().all()]
    problems = [f"no gradient reaches {listed(unreached)} (unused in forward?)"] * bool(unreached)
    problems += [f"non-finite gradients in {listed(nonfinite)}"] * bool(nonfinite)
    if problems:  # unreached alone: parameters that never act (``verdict`` names it uncompared)
        return ProbeResult(False, "; ".join(problems), "" if nonfinite else "unused_parameters")
    return ProbeResult(True, f"all {len(pairs)} parameters get finite gradients{kept}")


# The probes by the name their finding gets, in the order they run; ``shape`` first, since the
# others need its contract.
PROBES: dict[str, Callable[[Probed], ProbeResult]] = {
    "shape": shape,
    "eval determinism": determinism,
    "causality": causality,
    "batch independence": batch_independence,
    "residual stream": residual,
    "finite outputs": finite,
    "gradients": gradients,
}


class _Called(Probed):
    """``s`` called as a learner runs it elsewhere: in train mode with every dropout an identity,
    or on a copy in ``dtype`` (its weights and inputs, as after ``model.to(dtype)``)."""

    def __init__(self, s: Probed, train: bool = False, dtype: torch.dtype | None = None) -> None:
        self.s, self.train, self.dtype = s, train, dtype or s.dtype
        self.C, self.T, self.longest, self.device = s.C, s.T, s.longest, s.device
        self.generator = s.generator
        # round-off in ``dtype``: a bfloat16 row's normaliser moves by an ulp (s91), a leak by far more
        self.tol = max(s.tol, 4 * torch.finfo(self.dtype).eps)

    def __call__(
        self, x: torch.Tensor, *, seeded: bool = True, train: bool = False
    ) -> torch.Tensor:
        return self.s(x, seeded=seeded, train=self.train or train)

    def own_rng(self) -> ContextManager[None]:
        return self.s.own_rng()

    def grads(self, x: torch.Tensor, weights: torch.Tensor, *, inputs: bool = False) -> Grads:
        return self.s.grads(x, weights, inputs=inputs)


def elsewhere(
    s: Probed, train: bool = False, dtype: torch.dtype | None = None
) -> dict[str, ProbeResult]:
    """The causality and batch probes failed where ``_Called`` calls the block (a path it takes
    only while training, or in half precision), where two such calls agree (nothing random); in
    ``dtype``, an output of another dtype, or a part of the block computing in one (s97 unseen
    set: ``self.proj(y).float()``, which float64 hides: float64 + float32 is float64)."""
    called = _Called(s, train, dtype)
    kind = str(dtype).removeprefix("torch.")
    try:
        x = called.input(s.T, s.T, s.C)
        y = called(x)
    except CAUGHT as e:  # (a block that cannot run in bfloat16: not probed there)
        if dtype is None or not MIXED.search(str(e)):
            return {}
        said = f"a {kind} input raised {one_line(e)}: a part of it computes in another dtype"
        return {"dtype": ProbeResult(False, said, "dtype_device")}
    if dtype is not None and y.dtype != dtype:
        got = str(y.dtype).removeprefix("torch.")
        said = f"a {kind} input gave a {got} output, expected {kind}"
        return {"dtype": ProbeResult(False, said, "dtype_device")}
    try:
        if called.moved(y, called(x)).any():
            return {}
        found = {name: PROBES[name](called) for name in ("causality", "batch independence")}
    except CAUGHT:
        return {}
    return {name: r for name, r in found.items() if not r.passed}


# what torch says of two dtypes meeting (a float32 stream reaching a bfloat16 norm or matmul)
MIXED = re.compile(r"mixed dtype|expected scalar type|same dtype|dtype.* but (got|found)")
