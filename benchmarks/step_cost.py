"""What an option costs per training step: variants of a preset timed alternately in one process.

    python benchmarks/step_cost.py --threads 1 \\
        --base position=rope qk_norm=True norm=rmsnorm \\
        --variant logit_softcap=15.0 --variant batch_size=96

Builds the preset's ``Trainer`` once per variant (the base's settings, then each ``--variant``'s
``NAME=VALUE`` put over them; the first is the base alone), then times ``--steps`` training
steps of each in turn, round after round (``--rounds``), with ``time.process_time()`` (CPU time,
which other processes on the machine inflate far less than wall time) and ``perf_counter``.
Prints each variant's median ms per step and its ratio to the base, the median and the range
over the rounds. A ratio from a busy machine is provisional; run it on a quiet one to decide.
"""

from __future__ import annotations

import argparse
import ast
import statistics
import time

import torch

from gptblock import GPT, CharTokenizer, Trainer
from gptblock.data.batches import split_tokens
from gptblock.data.text import shakespeare
from gptblock.devices import resolve_dtype
from gptblock.train.presets import preset_settings


def parse(items: list[str]) -> dict[str, object]:
    """``["a=1", "b=rope"]`` -> ``{"a": 1, "b": "rope"}`` (Python literals, else strings)."""
    out: dict[str, object] = {}
    for item in items:
        name, _, value = item.partition("=")
        try:
            out[name] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[name] = value
    return out


def build(preset: str, overrides: dict[str, object]) -> Trainer:
    s = preset_settings(preset, overrides)
    text = shakespeare()
    tok = CharTokenizer.from_text(text)
    splits = split_tokens(tok.encode(text), s.block_size)
    torch.manual_seed(0)
    model = GPT(s.model_config(tok.vocab_size))
    train = s.train_config(
        max_iters=10**6, eval_interval=10**6, device="cpu", dtype=resolve_dtype(s.dtype, "cpu")
    )
    return Trainer(model, splits, train, progress=False)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--preset", default="shakespeare-cpu")
    p.add_argument("--base", nargs="*", default=[], metavar="NAME=VALUE")
    p.add_argument("--variant", action="append", nargs="+", default=[], metavar="NAME=VALUE")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=10, help="steps per variant per round")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--warmup", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    base = parse(args.base)
    names = ["base", *(" ".join(v) for v in args.variant)]
    trainers = [build(args.preset, base)]
    trainers += [build(args.preset, base | parse(v)) for v in args.variant]
    for t in trainers:
        for _ in range(args.warmup):
            t._train_step()
    cpu: list[list[float]] = [[] for _ in trainers]
    wall: list[list[float]] = [[] for _ in trainers]
    for _ in range(args.rounds):
        for i, t in enumerate(trainers):
            c, w = time.process_time(), time.perf_counter()
            for _ in range(args.steps):
                t._train_step()
            t.read_losses()  # the pending losses: a step's work is done when they are read
            cpu[i].append((time.process_time() - c) * 1e3 / args.steps)
            wall[i].append((time.perf_counter() - w) * 1e3 / args.steps)
    print(f"{args.preset}, base {args.base}, {args.threads} thread(s), {args.rounds} rounds of {args.steps} steps")  # fmt: skip
    for i, name in enumerate(names):
        ratios = [a / b for a, b in zip(cpu[i], cpu[0], strict=True)]
        print(
            f"  {name:<40} cpu {statistics.median(cpu[i]):6.1f} ms/step "
            f"(wall {statistics.median(wall[i]):6.1f}); x base {statistics.median(ratios):.3f} "
            f"(rounds {min(ratios):.3f}-{max(ratios):.3f})"
        )


if __name__ == "__main__":
    main()
