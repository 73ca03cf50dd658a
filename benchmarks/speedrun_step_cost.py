"""What a training step of each speedrun candidate costs, alternating in one process (track 2).

    python benchmarks/speedrun_step_cost.py --threads 1 \\
        default "long:n_layer=4,block_size=64,batch_size=64,position=rope,qk_norm=True"

Each candidate is ``LABEL`` (the preset as it is) or ``LABEL:NAME=VALUE,...`` (settings put
over ``--preset``'s, Python literals or words). All are built in this process and stepped in
turn, ``--steps`` steps a round for ``--rounds`` rounds, each round timed with
``time.process_time()`` (CPU time, which other processes on the machine inflate far less than
wall time; at ``--threads 1`` it is the work itself). Prints each candidate's median ms per
step, its ratio to the first candidate (median and range of the per-round ratios), and the CPU
time of one whole-validation check (float32, as the speedrun scores it), which a time budget
must leave room for. Numbers from a busy machine are provisional: the ratios hold better than
the times.
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
from gptblock.train.evaluate import validation_loss
from gptblock.train.presets import preset_settings


def parse(candidate: str) -> tuple[str, dict[str, object]]:
    """``"long:n_layer=4,qk_norm=True"`` -> ``("long", {"n_layer": 4, "qk_norm": True})``."""
    label, _, rest = candidate.partition(":")
    overrides: dict[str, object] = {}
    for item in filter(None, rest.split(",")):
        name, _, value = item.partition("=")
        try:
            overrides[name] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            overrides[name] = value  # a word: rope, rmsnorm, bfloat16
    return label, overrides


def build(preset: str, overrides: dict[str, object], text: str) -> Trainer:
    s = preset_settings(preset, overrides)
    tok = CharTokenizer.from_text(text)
    splits = split_tokens(tok.encode(text), s.block_size)
    torch.manual_seed(0)
    model = GPT(s.model_config(tok.vocab_size))
    train = s.train_config(
        max_iters=10**6, eval_interval=10**6, device="cpu", dtype=resolve_dtype(s.dtype, "cpu")
    )
    return Trainer(model, splits, train, progress=False)


def steps(t: Trainer, n: int) -> float:
    """CPU seconds of ``n`` training steps (the losses read at the end, as the loop does)."""
    start = time.process_time()
    for _ in range(n):
        t._train_step()
    t.read_losses()
    return time.process_time() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("candidates", nargs="+", help="LABEL or LABEL:NAME=VALUE,...")
    p.add_argument("--preset", default="shakespeare-cpu")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=10, help="steps per round")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    text = shakespeare()
    runs = [(label, build(args.preset, o, text)) for label, o in map(parse, args.candidates)]
    for _, t in runs:  # warm: allocations, the first calls of each kernel
        steps(t, 5)
    ms: dict[str, list[float]] = {label: [] for label, _ in runs}
    for _ in range(args.rounds):
        for label, t in runs:
            ms[label].append(steps(t, args.steps) * 1e3 / args.steps)
    first = runs[0][0]
    print(f"{args.threads} thread(s), {args.rounds} rounds of {args.steps} steps, CPU time")
    print("| candidate | ms per step | x first (rounds) | whole-val check, CPU s |")
    print("|---|---|---|---|")
    for label, t in runs:
        ratios = [a / b for a, b in zip(ms[label], ms[first], strict=True)]
        start = time.process_time()
        validation_loss(t.model, t.data.val, block_size=t.config.block_size, batch_size=64,
                        device=t.device)  # fmt: skip
        check = time.process_time() - start
        print(
            f"| {label} | {statistics.median(ms[label]):.1f} | {statistics.median(ratios):.2f} "
            f"({min(ratios):.2f}-{max(ratios):.2f}) | {check:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
