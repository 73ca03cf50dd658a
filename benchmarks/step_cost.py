"""What an option costs per training step: CPU time per step, the options alternating in ONE process.

    python benchmarks/step_cost.py --threads 1                      # the shakespeare-cpu preset
    python benchmarks/step_cost.py --threads 1 --set position=rope --set qk_norm=True \\
        --set norm=rmsnorm --variant bigram=True --variant smear=True --rounds 7

Builds the preset's run once per variant (the base ``--set`` settings, then each ``--variant``
on top of them; "off" is the base itself), and then times ``--steps`` training steps of each in
turn, round after round, the order rotating each round, so that a change in the machine's load
hits every variant alike. The time is ``time.process_time()``: CPU time, which other work on a
shared machine inflates far less than wall time (it does a little: caches and memory bandwidth
are shared), so a ratio measured under load is provisional. Prints each variant's median ms
per step with its range, and its median ratio to "off" over the rounds with the range.
Nothing is written.
"""

from __future__ import annotations

import argparse
import ast
import statistics
import time
from typing import Any

import torch

from gptblock.devices import set_threads
from gptblock.train.run import prepare_run


def settings_of(pairs: list[str]) -> dict[str, Any]:
    """``["n=v", ...]`` as settings, each value read as a Python literal where it is one."""
    out: dict[str, Any] = {}
    for pair in pairs:
        name, _, value = pair.partition("=")
        try:
            out[name] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[name] = value
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--preset", default="shakespeare-cpu")
    p.add_argument("--set", action="append", default=[], help="a base setting, name=value")
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        help="settings on top of the base, comma-separated (default: bigram, smear, both)",
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=10, help="timed steps per variant and round")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per variant first")
    args = p.parse_args()
    set_threads(args.threads)
    base = settings_of(args.set) | {"device": "cpu", "eval_interval": 10**6, "eval_iters": 1}
    variants = args.variant or ["bigram=True", "smear=True", "bigram=True,smear=True"]
    runs = {"off": base} | {v: base | settings_of(v.split(",")) for v in variants}
    trainers = {}
    for name, settings in runs.items():
        run = prepare_run(out_dir=None, preset=args.preset, progress=False, **settings)
        run.model.train()
        for _ in range(args.warmup):
            run.trainer._train_step()
        trainers[name] = run.trainer
    names = list(trainers)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            trainer = trainers[name]
            start = time.process_time()
            for _ in range(args.steps):
                trainer._train_step()
            times[name].append(1e3 * (time.process_time() - start) / args.steps)
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.rounds} rounds of {args.steps} steps, base {args.set}")  # fmt: skip
    for name in names:
        t = times[name]
        ratios = [a / b for a, b in zip(t, times["off"], strict=True)]
        print(
            f"{name:28s} {statistics.median(t):7.1f} ms/step ({min(t):.1f}-{max(t):.1f})  "
            f"x{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}) of off"
        )


if __name__ == "__main__":
    main()
