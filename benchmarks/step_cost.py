"""What a training step of each candidate costs: CPU time per step, the candidates alternating in
ONE process.

    python benchmarks/step_cost.py --threads 1            # off, bigram, smear, both (input side)
    python benchmarks/step_cost.py --threads 1 --set position=rope --set qk_norm=True \\
        --set norm=rmsnorm off softcap:logit_softcap=15.0 --rounds 7
    python benchmarks/step_cost.py --threads 1 default "long:n_layer=4,block_size=64" --validation

Each candidate is ``LABEL`` (the base as it is) or ``LABEL:NAME=VALUE,...`` (settings put over
the base: ``--preset``'s settings with the ``--set`` ones). Each is built in this process
(``harness.build_trainer``: seed 0, Tiny Shakespeare) and then ``--steps`` training steps of
each are timed in turn, round after round, the order rotating each round, so that a change in
the machine's load hits every candidate alike. The time is ``time.process_time()``: CPU time,
which other work on a shared machine inflates far less than wall time (it does a little: caches
and memory bandwidth are shared), so a ratio measured under load is provisional. Prints each
candidate's median ms per step with its range, its median ratio to the first candidate over the
rounds with the range, and the share of the CPUs other processes kept busy meanwhile
(``gptblock.bench.measure.others_busy``); ``--validation``: also the CPU time of one
whole-validation check (float32, as the speedrun scores it), which a time budget must leave
room for. Nothing is written.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from harness import alternate, build_trainer, parse_settings

from gptblock.bench.measure import cpu_ticks, others_busy
from gptblock.devices import set_threads
from gptblock.train.evaluate import validation_loss
from gptblock.train.loop import Trainer

INPUT_SIDE = ["off", "bigram:bigram=True", "smear:smear=True", "both:bigram=True,smear=True"]


def steps(trainer: Trainer, n: int) -> None:
    """``n`` training steps, the losses read at the end, as the loop does."""
    for _ in range(n):
        trainer.step()
    trainer.read_losses()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "candidates", nargs="*", help=f"LABEL or LABEL:NAME=VALUE,... (default: {INPUT_SIDE})"
    )
    p.add_argument("--preset", default="shakespeare-cpu")
    p.add_argument("--set", action="append", default=[], help="a base setting, NAME=VALUE")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=10, help="timed steps per candidate and round")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per candidate first")
    p.add_argument("--validation", action="store_true", help="time a whole-validation check too")
    args = p.parse_args()
    set_threads(args.threads)
    base = parse_settings(args.set)
    trainers = {}
    for candidate in args.candidates or INPUT_SIDE:
        label, _, rest = candidate.partition(":")
        trainers[label] = build_trainer(
            args.preset, base | parse_settings(rest.split(",") if rest else [], label)
        )
        trainers[label].model.train()
        steps(trainers[label], args.warmup)  # allocations, the first calls of each kernel
    calls = {label: (lambda t=t: steps(t, args.steps)) for label, t in trainers.items()}
    ticks = cpu_ticks()
    seconds = alternate(calls, args.rounds, time.process_time)
    ms = {label: [1e3 * s / args.steps for s in v] for label, v in seconds.items()}
    first, busy = next(iter(ms)), others_busy(ticks)
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.rounds} rounds of {args.steps} steps, CPU time, base {args.set}")  # fmt: skip
    if busy is not None:  # how disturbed the measurement was: other processes' share of the CPUs
        print(f"other processes kept {100 * busy:.0f}% of the CPUs busy meanwhile")
    for label, t in ms.items():
        ratios = [a / b for a, b in zip(t, ms[first], strict=True)]
        line = (
            f"{label:28s} {statistics.median(t):7.1f} ms/step ({min(t):.1f}-{max(t):.1f})  "
            f"x{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}) of {first}"
        )
        if args.validation:
            trainer = trainers[label]
            start = time.process_time()
            validation_loss(trainer.model, trainer.data.val, block_size=trainer.config.block_size,
                            batch_size=64, device=trainer.device)  # fmt: skip
            line += f"  whole-val check {time.process_time() - start:.2f} CPU s"
        print(line, flush=True)


if __name__ == "__main__":
    main()
