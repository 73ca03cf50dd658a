"""``gptblock example``: the second lesson's worked example, run and checked."""

from __future__ import annotations

import argparse

from ..example import worked_example
from .formatting import add_command


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = add_command(sub, "example", run, argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--seed", type=int, default=0, help="seed for the weights and the input")


def run(args: argparse.Namespace) -> int:
    r = worked_example(args.seed)
    B, T, C = r.shape
    print(
        f"TransformerBlock(d_model={C}, n_heads={r.n_heads}): input {r.shape} -> output {r.shape}"
    )
    print("change token t; which output positions move? (max |change| per position, float64)")
    print("  t | " + " ".join(f"pos {p:<6}" for p in range(T)))
    for t, row in enumerate(r.moved):
        print(f"  {t} | " + " ".join(f"{d:<10.2e}" for d in row))
    print(
        "PASS: positions before t never change" if r.passed else "FAIL: a position saw the future"
    )
    return 0 if r.passed else 1
