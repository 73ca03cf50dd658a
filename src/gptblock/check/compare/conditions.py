"""A match confirmed (``confirm``): on fresh inputs, in its input gradient, and held where a
learner runs the block (float32, train mode, T up to block_size, B up to 64) in an
order the block cannot foresee. docs/checker.md, "Where a learner runs it", says why each."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from ..mistakes.report import CAUGHT, COMPARISON, Finding, one_line
from ..mistakes.search import TOLERANCE, distance
from ..serve.subject import Probed

__all__ = ["Condition", "conditions", "confirm", "input_gradient_error"]

Tensor = torch.Tensor
Reference = Callable[[Tensor], Tensor]  # (B, T, C) -> (B, T, C), float64
# The float32 calls' tolerance, of the update's scale: correct blocks stay below ~5e-5; a
# float32-only path is off by percents, ``E[x^2] - E[x]^2`` at a mean of 300 by ~1e-2.
FLOAT32_TOLERANCE = 1e-3
GRADIENT_TOLERANCE = 1e-4  # of the reference's input gradient's scale (float32 blocks ~1e-6)
FLOAT32_GRADIENT_TOLERANCE = 1e-3  # of the reference input gradient's scale, for the same reasons
MAX_T = 256  # longest sequence compared: longer ones only cost time (T^2 scores)
UNKNOWN_T = 16  # the longest when nothing says the block's block_size (the common default)
# Some float32 inputs' mean per position. Not in float64: a block that normalises in float32
# (Llama's RMSNorm) loses the 1/300 of the vector around the mean to rounding (~8e-5 of the update).
MEAN = 300.0


class Condition(NamedTuple):
    """One call: a (B, T) input in ``dtype``, in train mode or eval, with a large mean or not."""

    B: int
    T: int
    dtype: torch.dtype
    train: bool
    mean: bool

    def describe(self) -> str:
        said = f"B = {self.B}, T = {self.T}, {str(self.dtype).removeprefix('torch.')}"
        said += ", train mode" if self.train else ""
        return said + (f", mean {MEAN:g}" if self.mean else "")

    @property
    def tolerance(self) -> float:
        return FLOAT32_TOLERANCE if self.dtype == torch.float32 else TOLERANCE

    def input(self, C: int, fresh: torch.Generator) -> Tensor:
        """A fresh (B, T, C) input of a random scale in [0.5, 2], with a mean of +-MEAN per
        position for ``mean``."""
        scale = 0.5 + 1.5 * float(torch.rand((), generator=fresh, dtype=torch.float64))
        x = torch.randn(self.B, self.T, C, generator=fresh, dtype=torch.float64) * scale
        if self.mean:
            sign = torch.randint(0, 2, (self.B, self.T, 1), generator=fresh, dtype=torch.float64)
            x = x + MEAN * (sign * 2 - 1)
        return x.to(self.dtype)


def conditions(subject: Probed, fresh: torch.Generator) -> list[Condition]:
    """The calls ``confirm`` makes, in a random order drawn from ``fresh``."""
    longest = min(subject.longest or UNKNOWN_T, MAX_T)
    mid, short = longest // 2 + 1, min(longest, 3)
    f64 = torch.float64 if subject.dtype == torch.float64 else torch.float32
    f32 = torch.float32
    table = [  # (B, T, dtype, train, mean): a mean only in float32 (MEAN)
        (1, 1, f64, False, False), (1, longest, f64, False, False), (3, mid, f64, False, False),
        (64, short, f64, False, False), (17, short, f64, False, False), (2, mid, f64, True, False),
        (1, longest, f64, True, False), (2, mid, f32, False, True), (64, short, f32, False, False),
        (1, longest, f32, False, True), (5, mid, f32, True, False), (2, 1, f32, True, True),
    ]  # fmt: skip
    order = torch.randperm(len(table), generator=fresh).tolist()
    return [Condition(*table[i]) for i in order]


def input_gradient_error(
    subject: Probed, reference: Reference, fresh: torch.Generator, dtype: torch.dtype | None = None
) -> float:
    """How far the block's gradient of ``sum(y * w)`` by a fresh (T, T, C) input, for a fresh
    ``w``, is from ``reference``'s (float64), of its scale; ``inf`` when the block gives none."""
    dtype = dtype or subject.dtype
    x = torch.randn(subject.T, subject.T, subject.C, generator=fresh, dtype=torch.float64)
    weights = torch.randn(x.shape, generator=fresh, dtype=torch.float64)
    x, weights = x.to(dtype).to(torch.float64), weights.to(dtype).to(torch.float64)
    x.requires_grad_(True)
    with torch.enable_grad():
        (ours,) = torch.autograd.grad((reference(x) * weights).sum(), [x])
    x, weights = (t.detach().to(device=subject.device, dtype=dtype) for t in (x, weights))
    try:
        got = subject.grads(x, weights, inputs=True).input
    except CAUGHT:  # its backward pass ran for the probe: failing now is not one fixed block's
        got = None
    return float("inf") if got is None else distance(got.to(torch.float64).cpu(), ours)


def _gradient_error(
    subject: Probed, reference: Reference, fresh: torch.Generator, tolerance: float,
    dtype: torch.dtype | None = None,
) -> float:  # fmt: skip
    """``input_gradient_error``, again on a second input where the first is off: a ReLU rounded
    to the other side of its kink passes its unit's whole gradient or none (once in ~300 inputs
    of a 2048-wide MLP in float32); a backward pass that is wrong is wrong on both."""
    error = input_gradient_error(subject, reference, fresh, dtype)
    return error if error <= tolerance else input_gradient_error(subject, reference, fresh, dtype)


def _off(message: str) -> Finding:
    return Finding(COMPARISON, False, message)


def _error(subject: Probed, reference: Reference, c: Condition, x: Tensor) -> float | str:
    """How far the block's update is from the reference's at ``x``, of its scale, or the
    exception it raised (another dtype is the shape probe's: the values are compared here)."""
    try:
        with subject.own_rng():  # a fork, not a seed per call: seeding costs ~10 ms
            theirs = subject(x.to(subject.device), seeded=False, train=c.train)
    except CAUGHT as e:
        return f"raised {one_line(e)}"
    theirs, x64 = theirs.to(torch.float64).cpu(), x.to(torch.float64)
    with torch.no_grad():
        ours = reference(x64)
    return distance(theirs - x64, ours - x64) if theirs.shape == ours.shape else float("inf")


def _random(subject: Probed, x: Tensor, calls: int = 5) -> bool:
    """Whether train-mode calls differ, on ``x``'s sequences (up to T = 32) repeated to 32 or
    more: a random block can repeat a draw, and stochastic depth on one sequence drops alike in
    ~2 calls in 3 (s100)."""
    x = x[:, :32].repeat(-(-32 // x.shape[0]), 1, 1)  # (>= 32, <= 32, C)
    try:
        with subject.own_rng():
            first = subject(x, seeded=False, train=True)
            return any(
                not torch.allclose(first, subject(x, seeded=False, train=True), 0, 0, True)
                for _ in range(calls - 1)
            )  # (equal_nan: a NaN is not a draw)
    except CAUGHT:
        return False


def _size(error: float) -> str:
    if error != error or error == float("inf"):
        return "non-finite or missing values"
    return f"{error:.0%}" if error >= 0.01 else f"{error:.1e} of its scale"


def _at(c: Condition, what: str, n: int) -> Condition:  # ``c`` at another length or batch size
    return c._replace(T=n) if what == "T" else c._replace(B=n)


def _mismatch(
    subject: Probed, reference: Reference, fresh: torch.Generator,
    measured: list[tuple[Condition, float]],
) -> str:  # fmt: skip
    """What sets the conditions the block is off in apart; for a length or a batch size, the
    largest that holds (bisected)."""
    held = [c for c, e in measured if e <= c.tolerance]
    off = [(c, e) for c, e in measured if not e <= c.tolerance]
    worst, error = max(off, key=lambda ce: ce[1] if ce[1] == ce[1] else float("inf"))
    by = f"off by {_size(error)} at {worst.describe()}"
    bad = [c for c, _ in off]
    for attr, on, right, wrong in (
        ("dtype", torch.float32, "float64", "float32"),
        ("dtype", torch.float64, "float32", "float64"),  # a float32 mask in float64 attention
        ("train", True, "eval mode", "train mode with dropout off"),
    ):
        if all(getattr(c, attr) == on for c in bad) and any(getattr(c, attr) != on for c in held):
            return f"equal in {right}, off by {_size(error)} in {wrong} ({worst.describe()})"

    def holds(at: Condition) -> bool:
        e = _error(subject, reference, at, at.input(subject.C, fresh))
        return isinstance(e, float) and e <= at.tolerance

    for what in ("T", "B"):
        fine = int(max((getattr(c, what) for c in held), default=0))
        first = min(bad, key=lambda c: getattr(c, what))
        # where the bad condition itself holds at the good size (s102: a path wrong at B = 1
        # and any T > 1 was "equal for T <= 17", the longest held at other batch sizes)
        if fine and all(getattr(c, what) > fine for c in bad) and holds(_at(first, what, fine)):
            lo, hi = fine, getattr(first, what)
            while hi - lo > 1:  # lo holds, hi does not
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if holds(_at(first, what, mid)) else (lo, mid)
            return f"equal for {what} <= {lo}, {by}"
    return (
        f"equal under the checker's conditions, but {by} (a dozen fresh inputs in a random order)"
    )


def confirm(
    subject: Probed, reference: Reference, first: tuple[int, ...], fresh: torch.Generator,
    backward: bool, what: str, whose: str, learner: bool, notes: list[str],
    off: list[Condition] | None = None,
) -> Finding | None:  # fmt: skip
    """A failed comparison when ``reference`` (``what``, float64) does not reproduce the block on
    fresh inputs or, for ``whose`` block, in its input gradient and, with ``learner``, where a
    learner runs it (the worst condition it is off in added to ``off``); else None. ValueError
    or RuntimeError when ``reference`` cannot run."""
    for shape in ((*first, subject.C), (subject.T, subject.T, subject.C)):
        x = torch.randn(*shape, generator=fresh, dtype=torch.float64)
        with torch.no_grad():
            ours = reference(x)  # (B, T, C); raises where the parts do not chain
        if ours.shape != x.shape:
            raise ValueError(f"the reference maps {shape} to {tuple(ours.shape)}")
        try:
            theirs = subject(x.to(device=subject.device, dtype=subject.dtype))
        except CAUGHT as e:
            return _off(f"the block raised {one_line(e)} on a fresh {shape} input")
        error = distance(theirs.to(torch.float64).cpu(), ours)
        if not error <= TOLERANCE:
            said = f"{what} reproduces the block on the traced input, but not on a fresh {shape} "
            said += f"input (off by {error:.2g} of its scale): its outputs are not those of one "
            said += "fixed block"
            return _off(said)
    if not whose:
        return None  # the block fails already: a mistake
    if backward:  # else its backward pass fails already
        error = _gradient_error(subject, reference, fresh, GRADIENT_TOLERANCE)
        if not error <= GRADIENT_TOLERANCE:
            said = f"the block's outputs are the {whose} block's, but its gradient with respect "
            said += f"to its input is not (off by {error:.2g} of its scale): its backward pass is "
            said += "not its forward pass's"
            return _off(said)
    if not learner:
        return None
    measured: list[tuple[Condition, float]] = []  # (condition, error of the update's scale)
    note = ""
    for c in conditions(subject, fresh):
        x = c.input(subject.C, fresh)
        got = _error(subject, reference, c, x)
        if isinstance(got, str):
            said = f"equal under the checker's conditions, but the block {got} at {c.describe()}"
            return _off(said)
        if not got <= c.tolerance and c.train and _random(subject, x):
            note = ("train mode not compared: the block's train-mode outputs are random even "
                    "with every dropout off")  # fmt: skip
        else:
            measured.append((c, got))
    if not all(e <= c.tolerance for c, e in measured):
        worst = max(measured, key=lambda ce: ce[1] if ce[1] == ce[1] else float("inf"))
        (off if off is not None else []).append(worst[0])
        return _off(_mismatch(subject, reference, fresh, measured))
    if backward and subject.dtype == torch.float64:
        error = _gradient_error(
            subject, reference, fresh, FLOAT32_GRADIENT_TOLERANCE, torch.float32
        )
        if not error <= FLOAT32_GRADIENT_TOLERANCE:
            return _off(
                "the block's outputs are the reference's, but in float32 its gradient with "
                f"respect to its input is not (off by {_size(error)})"
            )
    notes += [note] if note else []
    return None
