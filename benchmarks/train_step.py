"""The training step's time at the tiny preset's shape, for two revisions of gptblock side by side.

    python benchmarks/train_step.py                       # df77eb4 (before issue 10) vs the tree
    python benchmarks/train_step.py --revs df77eb4 HEAD --rounds 7 --steps 200

Each revision's ``src/`` is exported with ``git archive`` (the working tree is used for
``WORKTREE``) and timed in a fresh process per round, the revisions alternating round by round
so that a change in the machine's load hits both alike. A process builds the tiny preset's GPT
(4 layers, 4 heads, 128 wide, context 64, batch 16) on the default corpus, lets ``Trainer.fit``
run ``--warmup`` steps untimed, then times ``--steps`` steps from an ``on_step_end`` callback
(no evaluation in between: ``eval_interval`` is past the end). Prints each revision's median
ms per step over the rounds with the range, and the ratio of the medians of paired rounds.

Why two processes rather than one: the two revisions are two versions of one package, which
cannot be imported side by side. The rounds alternate instead, with the same threads and shape.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import ROOT, export_src

CHILD = r"""
import json, sys, time
import torch
torch.set_num_threads(int(sys.argv[3]))
from gptblock import GPT, GPTConfig, CharTokenizer, Trainer
try:
    from gptblock.train.config import TrainConfig
except ImportError:  # before issue 10
    from gptblock.recipe import TrainConfig
from gptblock.data.batches import split_tokens
from gptblock.data.text import default_corpus

warmup, steps = int(sys.argv[1]), int(sys.argv[2])
text = default_corpus()
tok = CharTokenizer.from_text(text)
splits = split_tokens(tok.encode(text), 64)
torch.manual_seed(1337)
model = GPT(GPTConfig(tok.vocab_size, block_size=64, n_layer=4, n_head=4, n_embd=128))
total = warmup + steps
cfg = TrainConfig(block_size=64, batch_size=16, lr=2e-3, max_iters=total, warmup=100,
                  eval_interval=10 * total, eval_iters=1)
stamps = [0.0]  # stamps[k]: when step k ended (the step counter's name differs by revision)
trainer = Trainer(model, splits, cfg, progress=False)
trainer.add_callback("on_step_end", lambda t: stamps.append(time.perf_counter()))
trainer.fit()
print(json.dumps({"ms_per_step": 1e3 * (stamps[total] - stamps[warmup]) / steps}))
"""


def export(rev: str, into: Path) -> Path:
    """The ``src`` directory of ``rev`` (``WORKTREE``: this checkout's, as it is)."""
    return ROOT / "src" if rev == "WORKTREE" else export_src(rev, into)


def time_once(src: Path, warmup: int, steps: int, threads: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(warmup), str(steps), str(threads)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return float(json.loads(out.strip().splitlines()[-1])["ms_per_step"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--revs", nargs=2, default=["df77eb4", "WORKTREE"], help="before, after")
    p.add_argument("--rounds", type=int, default=5, help="processes per revision")
    p.add_argument("--warmup", type=int, default=20, help="untimed steps first")
    p.add_argument("--steps", type=int, default=150, help="timed steps per process")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--json", help="write the numbers here")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        srcs = [export(rev, Path(tmp) / f"rev{i}") for i, rev in enumerate(args.revs)]
        times: list[list[float]] = [[], []]
        for r in range(args.rounds):
            order = (0, 1) if r % 2 == 0 else (1, 0)  # alternate which goes first
            for i in order:
                times[i].append(time_once(srcs[i], args.warmup, args.steps, args.threads))
            print(f"round {r + 1}: " + "  ".join(f"{t[-1]:.2f}" for t in times), flush=True)
    ratios = [a / b for a, b in zip(times[0], times[1], strict=True)]
    for rev, t in zip(args.revs, times, strict=True):
        print(f"{rev:>10}: {statistics.median(t):6.2f} ms/step (rounds {min(t):.2f}-{max(t):.2f})")
    print(
        f"before / after: {statistics.median(ratios):.3f} "
        f"(paired rounds {min(ratios):.3f}-{max(ratios):.3f})"
    )
    if args.json:
        record = {"revs": args.revs, "ms_per_step": times, "ratios": ratios, **vars(args)}
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
