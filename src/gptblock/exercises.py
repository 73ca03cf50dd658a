"""The first lesson's three exercises, run (NumPy only, deterministic given ``seed``); each
returns its numbers and whether it passed (docs/exercises.md derives the claims and bands).
``on_learner`` runs the lessons' exercises on a learner's own class (``gptblock exercises --on``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from .blocks.config import check_seed
from .errors import UserValueError
from .reference import causal_head, softmax

__all__ = ["LEARNER_CLASSES", "CausalHeadCheck", "EntropyComparison", "Holds", "Refused"]
__all__ += ["ScoreVariance", "VarianceRow", "exercise1", "exercise2", "exercise3", "on_learner"]
__all__ += ["run_all"]


@dataclass(frozen=True)
class VarianceRow:
    """Exercise 1 for one d_k."""

    d_k: int  # dimensions summed over
    var_raw: float  # sample variance of q . k; the claim is d_k
    var_scaled: float  # sample variance of q . k / sqrt(d_k); the claim is 1
    std_error: float  # standard error of var_scaled when the claim holds
    z: float  # (var_scaled - 1) / std_error
    passed: bool  # |z| <= the band


@dataclass(frozen=True)
class ScoreVariance:
    """Exercise 1: the variance of attention scores, unscaled and scaled."""

    n_samples: int  # (q, k) pairs drawn per d_k
    band: float  # a row passes when its variance is within this many standard errors
    rows: tuple[VarianceRow, ...]
    passed: bool


@dataclass(frozen=True)
class CausalHeadCheck:
    """Exercise 2: the structure of the causal head's weights."""

    n_sequences: int  # random (q, k, v) sequences checked
    T: int  # sequence length
    hs: int  # head size
    max_row_sum_error: float  # max |sum of a row - 1|; passes at <= 1e-12
    max_future_weight: float  # largest weight above the diagonal; passes only if exactly 0.0
    passed: bool


@dataclass(frozen=True)
class EntropyComparison:
    """Exercise 3: the entropy of softmax(raw scores) against softmax(scaled scores)."""

    n_draws: int  # random (query, keys) draws
    d_k: int  # dimensions of the query and keys
    n_keys: int  # keys per draw; entropies are at most log2(n_keys) bits
    scale: float  # the scaling under test; the head's is 1 / sqrt(d_k)
    fraction_higher: float  # fraction of draws where H(scaled) > H(raw)
    mean_entropy_raw: float  # bits
    mean_entropy_scaled: float  # bits
    min_gap: float  # smallest H(scaled) - H(raw) over the draws, bits
    mean_max_weight_raw: float  # how close softmax(raw) is to one-hot, on average
    mean_max_weight_scaled: float
    passed: bool  # fraction_higher == 1: a theorem for any scale < 1, see docs/exercises.md


def exercise1(
    seed: int = 0, *, d_ks: tuple[int, ...] = (4, 16, 64, 256), n_samples: int = 10_000,
    band: float = 5.0,
) -> ScoreVariance:  # fmt: skip
    """Monte Carlo for Var(q . k) = d_k and Var(q . k / sqrt(d_k)) = 1.

    A row passes within ``band`` standard errors, exact for Gaussian coordinates (5: a false
    FAIL ~6e-7).

    Example:
        >>> r = exercise1(seed=0, d_ks=(4, 64), n_samples=2000)
        >>> r.passed, [row.d_k for row in r.rows]
        (True, [4, 64])
    """
    if n_samples < 4:
        raise UserValueError(
            f"n_samples must be >= 4 for a sample variance's error, got {n_samples}"
        )
    rng = _rng(seed)
    N = n_samples
    rows = []
    for d in d_ks:
        q = rng.standard_normal((N, d))
        k = rng.standard_normal((N, d))
        raw = np.einsum("nd,nd->n", q, k)  # (N,) dot products, without an (N, d) temporary
        var_raw = float(np.var(raw, ddof=1))
        var_scaled = float(np.var(raw / math.sqrt(d), ddof=1))
        # The standard error of the sample variance of X = q.k / sqrt(d_k): sigma^2 = 1 and
        # mu4 = E[X^4] = 3 + 6/d_k (docs/exercises.md).
        mu4 = 3.0 + 6.0 / d
        std_error = math.sqrt((mu4 - (N - 3) / (N - 1)) / N)
        z = (var_scaled - 1.0) / std_error
        rows.append(VarianceRow(d, var_raw, var_scaled, std_error, z, abs(z) <= band))
    return ScoreVariance(N, band, tuple(rows), all(r.passed for r in rows))


def exercise2(seed: int = 0, *, n_sequences: int = 100, T: int = 8, hs: int = 4) -> CausalHeadCheck:
    """Rows of the causal head's weights sum to 1; weights on future positions are exactly 0.

    Example:
        >>> r = exercise2(seed=0, n_sequences=3, T=5, hs=4)
        >>> r.passed, r.max_future_weight
        (True, 0.0)
    """
    rng = _rng(seed)
    q, k, v = rng.standard_normal((3, n_sequences, T, hs))  # (n, T, hs) each
    _, wei = causal_head(q, k, v)  # (n, T, T)
    row_error = float(np.abs(wei.sum(axis=-1) - 1.0).max())
    future = wei[:, np.triu(np.ones((T, T), dtype=bool), k=1)]  # (n, T(T-1)/2)
    max_future = float(future.max()) if future.size else 0.0
    # Round-off in a sum of T terms in [0, 1] is a few ulps; 1e-12 leaves room and still
    # catches any real normalisation error. Future weights must be exactly 0, not small.
    passed = row_error <= 1e-12 and max_future == 0.0
    return CausalHeadCheck(n_sequences, T, hs, row_error, max_future, passed)


def exercise3(
    seed: int = 0, *, n_draws: int = 1000, d_k: int = 64, n_keys: int = 6,
    scale: float | None = None,
) -> EntropyComparison:  # fmt: skip
    """Softmax of scaled scores is flatter (higher entropy) than softmax of raw scores.

    For any ``0 < scale < 1`` (None: ``1 / sqrt(d_k)``) it is in *every* draw whose scores
    are not all equal, so one exception fails it.

    Example:
        >>> r = exercise3(seed=0, n_draws=50)
        >>> r.passed, r.fraction_higher, r.mean_entropy_scaled > r.mean_entropy_raw
        (True, 1.0, True)
        >>> exercise3(seed=0, n_draws=50, scale=8.0).fraction_higher
        0.0
    """
    rng = _rng(seed)
    s = 1.0 / math.sqrt(d_k) if scale is None else float(scale)
    q = rng.standard_normal((n_draws, d_k))  # (n, d_k)
    keys = rng.standard_normal((n_draws, n_keys, d_k))  # (n, n_keys, d_k)
    raw = np.einsum("nkd,nd->nk", keys, q)  # (n, n_keys, d_k) . (n, d_k) -> (n, n_keys)
    p_raw, p_scaled = softmax(raw), softmax(s * raw)  # (n, n_keys) each
    h_raw, h_scaled = _entropy_bits(p_raw), _entropy_bits(p_scaled)  # (n,) each
    higher = float(np.mean(h_scaled > h_raw))
    return EntropyComparison(
        n_draws=n_draws, d_k=d_k, n_keys=n_keys, scale=s, fraction_higher=higher,
        mean_entropy_raw=float(h_raw.mean()), mean_entropy_scaled=float(h_scaled.mean()),
        min_gap=float((h_scaled - h_raw).min()),
        mean_max_weight_raw=float(p_raw.max(axis=-1).mean()),
        mean_max_weight_scaled=float(p_scaled.max(axis=-1).mean()), passed=higher == 1.0,
    )  # fmt: skip


def run_all(seed: int = 0) -> tuple[ScoreVariance, CausalHeadCheck, EntropyComparison]:
    """All three exercises with their default sizes, each seeded with ``seed``.

    Example:
        >>> [r.passed for r in run_all(seed=0)]
        [True, True, True]
    """
    return exercise1(seed), exercise2(seed), exercise3(seed)


LEARNER_CLASSES = ("Head", "MultiHeadAttention", "Block")
"""The lessons' classes ``on_learner`` knows, by the lessons' names."""


class Refused(Exception):
    """What the learner's code raised in its own process, as it was said there (one line)."""


@dataclass(frozen=True)
class Holds:
    """One exercise on a learner's class: whether it holds, and what was measured or why not."""

    exercise: str
    holds: bool
    said: str


def on_learner(
    kind: str, forward: Callable[[NDArray[np.float64]], NDArray[np.float64]], C: int, n_params: int,
    T: int = 6, seed: int = 0, tol: float = 1e-10,
) -> list[Holds]:  # fmt: skip
    """The lessons' exercises on a learner's ``kind`` (one of ``LEARNER_CLASSES``), given its eval
    ``forward`` of a (B, T, C) input; ``tol`` is "did not move", relative to the output's scale.

    Example:
        >>> import numpy as np
        >>> w = np.random.default_rng(0).standard_normal((8, 8))
        >>> def causal(x):  # a running mean: position t sees positions 0..t
        ...     return np.cumsum(x @ w, axis=1) / np.arange(1, x.shape[1] + 1)[:, None]
        >>> [(h.exercise, h.holds) for h in on_learner("MultiHeadAttention", causal, 8, 64)]
        [('shapes', True), ('the mask', True), ('the worked example', True), ('parameters', False)]
        >>> on_learner("Head", causal, 8, 64)[1].said
        'changing token t moves no output before t (t = 1..5)'
    """
    rng = _rng(seed)
    B = 2
    x = rng.standard_normal((B, T, C))  # (B, T, C)
    want = f"(B, T, {'hs' if kind == 'Head' else 'C'})"
    try:
        y = np.asarray(forward(x), dtype=np.float64)  # (B, T, C), or a head's (B, T, hs)
    except Exception as e:  # the learner's code: whatever it raises is its answer
        y, why = np.zeros(0), f"calling it raised {_said(e)}"
    else:
        fits = y.shape == x.shape or (kind == "Head" and y.ndim == 3 and y.shape[:2] == (B, T))
        why = "" if fits else f"its output is {y.shape}, not {want}"
    shapes = Holds("shapes", not why, why or f"{x.shape} -> {y.shape}")
    if why:
        hs = y.shape[-1] if y.ndim == 3 else 0
        lost = [Holds(n, False, why) for n in ("the mask", "the worked example")]
        return [shapes, *lost, _parameters(kind, C, hs, n_params)]
    leaks, still = _moved(forward, x, y, rng, tol)
    mask = leaks or f"changing token t moves no output before t (t = 1..{T - 1})"
    example = still or f"changing token t moves every output from t on (t = 0..{T - 1})"
    found = [Holds("the mask", not leaks, mask), Holds("the worked example", not still, example)]
    return [shapes, *found, _parameters(kind, C, y.shape[-1], n_params)]


def _moved(
    forward: Callable[[NDArray[np.float64]], NDArray[np.float64]], x: NDArray[np.float64],
    y: NDArray[np.float64], rng: np.random.Generator, tol: float,
) -> tuple[str, str]:  # fmt: skip
    # Token t changed in turn: an output before t that moved, one from t on that did not.
    B, T, C = x.shape
    scale = tol * (1.0 + float(np.nan_to_num(np.abs(y)).max()))
    leaks = still = ""
    for t in range(T):
        x2 = x.copy()
        x2[:, t] += rng.standard_normal((B, C))
        try:
            y2 = np.asarray(forward(x2), dtype=np.float64)
        except Exception as e:  # the learner's code
            return (f"calling it raised {_said(e)}",) * 2
        moved = np.abs(y2 - y).max(axis=(0, 2)) > scale  # (T,): over the batch and channels
        sees = [p for p in range(t) if moved[p]]
        blind = [p for p in range(t, T) if not moved[p]]
        if sees and not leaks:
            leaks = f"changing token {t} moved the output at {sees[0]}: it sees a later token"
        if blind and not still:
            still = f"changing token {t} did not move the output at {blind[0]}: it cannot see it"
    return leaks, still


def _parameters(kind: str, C: int, hs: int, n: int) -> Holds:
    formula, want = {
        "Head": ("3 C hs", 3 * C * hs),
        "MultiHeadAttention": ("4 C^2 + C", 4 * C * C + C),
        "Block": ("12 C^2 + 10 C", 12 * C * C + 10 * C),
    }[kind]
    at = f"C={C}" + (f", hs={hs}" if kind == "Head" else "")
    if kind == "Head" and not hs:
        return Holds("parameters", False, f"{n:,}; the head size hs is unknown: see its shapes")
    if n == want:
        return Holds("parameters", True, f"{n:,} = {formula} at {at}")
    off = f"{abs(n - want):,} {'fewer' if n < want else 'more'}"
    return Holds(
        "parameters", False, f"{n:,}, the lesson's {kind} has {formula} = {want:,} at {at} ({off})"
    )


def _said(e: BaseException) -> str:
    said = str(e) if isinstance(e, Refused) else f"{type(e).__name__}: {e}"
    return " ".join(said.split())[:400]


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(check_seed(seed))  # [0, 2**63 - 1], as torch's seeds


def _entropy_bits(p: NDArray[np.float64]) -> NDArray[np.float64]:
    logp = np.log2(np.where(p > 0, p, 1.0))  # log2(1) = 0 where p = 0, with no warning
    return np.asarray(-(p * logp).sum(axis=-1))
