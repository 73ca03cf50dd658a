"""``gptblock exercises``: the first lesson's three exercises, run, with their numbers."""

from __future__ import annotations

import argparse
import math

from ..blocks.config import check_seed
from ..exercises import run_all
from .formatting import COMMANDS


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "exercises",
        help=COMMANDS["exercises"],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--seed", type=int, default=0, help="seed for every random draw")
    p.set_defaults(run=run)


def _verdict(passed: bool) -> str:
    return "PASS" if passed else "FAIL"


def run(args: argparse.Namespace) -> int:
    ex1, ex2, ex3 = run_all(check_seed(args.seed, "--seed"))  # before any exercise runs

    print("Exercise 1: Var(q.k) = d_k and Var(q.k / sqrt(d_k)) = 1, q and k ~ N(0, I)")
    print(
        f"  {ex1.n_samples} pairs per d_k; pass: within {ex1.band:g} standard errors "
        "(derivation: docs/exercises.md)"
    )
    print("    d_k   Var(q.k)   Var(scaled)   std err        z")
    for r in ex1.rows:
        print(
            f"  {r.d_k:5d} {r.var_raw:10.3f} {r.var_scaled:13.4f} {r.std_error:10.4f}"
            f" {r.z:+8.2f}  {_verdict(r.passed)}"
        )
    print(f"  {_verdict(ex1.passed)}")

    print()
    print("Exercise 2: the NumPy causal head's weights")
    print(f"  {ex2.n_sequences} random sequences, T={ex2.T}, hs={ex2.hs}")
    print(f"  max |row sum - 1|        {ex2.max_row_sum_error:.3e}  (pass: <= 1e-12)")
    print(f"  max weight on the future {ex2.max_future_weight!r}  (pass: exactly 0.0)")
    print(f"  {_verdict(ex2.passed)}")

    print()
    print("Exercise 3: scaling flattens the softmax (entropy in bits)")
    print(
        f"  {ex3.n_draws} draws of a query and {ex3.n_keys} keys, d_k={ex3.d_k}, "
        f"scale={ex3.scale:.4g}; max entropy log2({ex3.n_keys}) = {math.log2(ex3.n_keys):.4f}"
    )
    print(f"  {'':22}{'raw':>8}{'scaled':>9}")
    print(f"  {'mean entropy':22}{ex3.mean_entropy_raw:8.4f}{ex3.mean_entropy_scaled:9.4f}")
    print(
        f"  {'mean largest weight':22}{ex3.mean_max_weight_raw:8.4f}{ex3.mean_max_weight_scaled:9.4f}"
    )
    print(f"  H(scaled) > H(raw) in {ex3.fraction_higher:.1%} of draws (pass: every draw)")
    print(f"  smallest gap H(scaled) - H(raw): {ex3.min_gap:.4f} bits")
    print(f"  {_verdict(ex3.passed)}")

    failed = [i + 1 for i, passed in enumerate((ex1.passed, ex2.passed, ex3.passed)) if not passed]
    print()
    print(f"FAIL: exercise {failed}" if failed else "PASS: all three exercises")
    return 1 if failed else 0
