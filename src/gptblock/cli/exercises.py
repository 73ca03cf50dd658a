"""``gptblock exercises``: the first lesson's three exercises, run, with their numbers; with
``--on FILE.py``, the lessons' exercises on the learner's own classes, each in a child process."""

from __future__ import annotations

import argparse
import ast
import math
from pathlib import Path
from typing import Any

from ..blocks.config import check_seed
from ..errors import UserValueError
from ..exercises import run_all
from .formatting import add_command, check_timeout


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = add_command(sub, "exercises", run, argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--seed", type=int, default=0, help="seed for every random draw")
    p.add_argument(
        "--on",
        metavar="FILE.py",
        help="run the exercises (shapes, the mask, parameters, the worked example) on your own "
        "Head, MultiHeadAttention and Block in FILE.py instead, each in a child process",
    )
    p.add_argument(
        "--timeout", type=float, default=60.0, help="with --on: seconds each class may take"
    )


def _verdict(passed: bool) -> str:
    return "PASS" if passed else "FAIL"


def run(args: argparse.Namespace) -> int:
    seed = check_seed(args.seed, "--seed")  # before any exercise runs
    check_timeout(args.timeout)
    if args.on is not None:
        return _on(args.on, seed, args.timeout)
    ex1, ex2, ex3 = run_all(seed)

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


def _on(file: str, seed: int, timeout: float) -> int:
    from ..check.isolation.check import ask_isolated
    from ..errors import UserFileNotFoundError
    from ..exercises import LEARNER_CLASSES

    path = Path(file)
    if not path.is_file():
        raise UserFileNotFoundError(f"--on: no such file: {file}")
    try:  # which classes it defines, read without running it
        defined = {
            n.name for n in ast.parse(path.read_bytes(), file).body if isinstance(n, ast.ClassDef)
        }
    except (SyntaxError, ValueError) as e:
        raise UserValueError(f"--on: cannot parse {file}: {e}") from None
    kinds = [k for k in LEARNER_CLASSES if k in defined]
    if not kinds:
        raise UserValueError(f"--on: {file} defines none of {', '.join(LEARNER_CLASSES)}")
    print(f"the lessons' exercises on {file}'s {', '.join(kinds)} (in a child process)")
    answers = ask_isolated(
        [f"{file}:{k}" for k in kinds], lambda call, i: _asked(call, kinds[i], seed), timeout
    )
    failed: list[str] = []
    for kind, answer in zip(kinds, answers, strict=True):
        if isinstance(answer, str):
            print(f"{kind}\n  does not hold  {answer}")
            failed.append(kind)
            continue
        built, found = answer
        print(built)
        for h in found:
            print(f"  {'holds' if h.holds else 'does not hold':<14} {h.exercise:<19} {h.said}")
        failed += [f"{kind}: {h.exercise}" for h in found if not h.holds]
    print(f"FAIL: {'; '.join(failed)}" if failed else f"PASS: every exercise holds on {file}")
    return 1 if failed else 0


def _asked(call: Any, kind: str, seed: int) -> tuple[str, list[Any]]:
    import torch

    from ..check.mistakes.report import Raised, text
    from ..exercises import Refused, on_learner

    built, _ = call("build")
    width, _ = call("width")
    C, T = int(width["C"]), int(width["T"])
    copy, _ = call("copy", C=C, T=T, longest=int(width["longest"]))
    dtype = torch.float64 if copy.get("dtype") == "float64" else torch.float32

    def forward(x: Any) -> Any:
        try:
            said, got = call("forward", {"x": torch.from_numpy(x).to(dtype)}, seeded=True)
        except Raised as e:
            raise Refused(str(e)) from None
        if not isinstance(got.get("y"), torch.Tensor):
            raise Refused(f"its output is on {text(said.get('device', '?'), 40)}, not the CPU")
        return got["y"].to(torch.float64).numpy()

    _, values = call("parameters")
    n = sum(v.numel() for v in values.values())
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    return str(built["description"]), on_learner(kind, forward, C, n, T, seed, tol)
