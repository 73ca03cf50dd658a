"""Generation's weights side by side: float32, bfloat16 and int8, their speed and their loss.

    python benchmarks/generation_precision.py             # trains the default run first (~1 min)
    python benchmarks/generation_precision.py --out out-gptblock \\
        --json benchmarks/results/generation-precision.json \\
        --figure benchmarks/generation-precision.png

Two measurements, in one process, on the CPU:

* **token rate**: cached greedy generation at batch 1, 128 new tokens after a 16-token prompt
  (``GPT.generate(temperature=0, weights=...)``), of the 6-layer, 384-wide GPT (the
  ``shakespeare`` preset's shape, vocabulary 65, random weights) and of the checkpoint's model.
  The forms alternate call by call, so a change in the machine's load hits all three; each
  row is the median over ``--repeats`` calls after one untimed call, with the range of the
  per-round ratios to float32. A reduced copy is made at the untimed call and kept on the model
  (``gptblock.model.generation.decode``); the time to make it is reported on its own.
* **validation loss**: the checkpoint's model over the whole validation split (the last 10% of
  its corpus, non-overlapping windows of its context, every token scored once), computed as
  generation computes it with each form (``gptblock.train.evaluate.generation_loss``), and its
  change from float32. ``gptblock sample --weights auto`` picks int8 on a CPU with bfloat16 in
  hardware when int8 is the fastest here and changes this loss by less than 0.01.

Without ``--out``, the default run (``gptblock train``, the ``shakespeare-cpu`` preset) is
trained into a temporary directory first; ``--train-args`` passes other options to it (e.g.
``--train-args="--preset shakespeare --max-iters 600"`` for the 6-layer model itself).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import torch
from harness import alternate

import gptblock
from gptblock import GPT, GPTConfig
from gptblock.data.batches import split_tokens
from gptblock.data.text import load_corpus
from gptblock.devices import native_bfloat16
from gptblock.model.generation.decode import forget_reduced_weights
from gptblock.model.generation.weights import WEIGHTS
from gptblock.train.evaluate import generation_loss

PROMPT, NEW = 16, 128


def token_rates(model: GPT, repeats: int) -> dict[str, dict[str, float]]:
    """Tokens per second of each form, alternating call by call."""
    prompt = torch.randint(0, model.config.vocab_size, (1, PROMPT), generator=torch.Generator())
    made = {}
    for w in WEIGHTS:  # untimed: the reduced copies are made here, and timed on their own
        forget_reduced_weights(model)
        start = time.perf_counter()
        model.generate(prompt[:, :1], 1, temperature=0, weights=w)
        made[w] = time.perf_counter() - start
        model.generate(prompt, NEW, temperature=0, weights=w)
    calls = {w: partial(model.generate, prompt, NEW, temperature=0, weights=w) for w in WEIGHTS}
    seconds = alternate(calls, repeats)  # the order rotating each round
    rows = {}
    for w in WEIGHTS:
        ratios = [f / s for f, s in zip(seconds["float32"], seconds[w], strict=True)]
        med = statistics.median(seconds[w])
        rows[w] = {
            "seconds": med,
            "tokens_per_s": NEW / med,
            "x_float32": statistics.median(seconds["float32"]) / med,
            "round_ratio_min": min(ratios),
            "round_ratio_max": max(ratios),
            "first_call_s": made[w],
        }
    return rows


def print_rates(name: str, rows: dict[str, dict[str, float]]) -> None:
    print(f"{name}: cached greedy, batch 1, {NEW} tokens after {PROMPT}")
    for w, r in rows.items():
        print(
            f"  {w:<9} {r['tokens_per_s']:8.0f} tok/s  {1e3 * r['seconds'] / NEW:6.3f} ms/token  "
            f"{r['x_float32']:.2f}x float32 (rounds {r['round_ratio_min']:.2f}-"
            f"{r['round_ratio_max']:.2f}); first call {1e3 * r['first_call_s']:.0f} ms"
        )


def checkpoint(args: argparse.Namespace, tmp: str) -> Path:
    if args.out:
        return Path(args.out)
    out = Path(tmp) / "run"
    cmd = [sys.executable, "-m", "gptblock", "train", "--out", str(out), *args.train_args.split()]
    print("training:", " ".join(cmd[1:]), flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"training failed:\n{done.stderr[-2000:]}")
    return out


def losses(model: GPT, tokenizer: object, data: str) -> dict[str, dict[str, float]]:
    """The whole-validation loss with each form, and its change from float32's."""
    text, _ = load_corpus(data)
    T = model.config.block_size
    val = split_tokens(tokenizer.encode_tensor(text), T).val  # type: ignore[attr-defined]
    cpu = torch.device("cpu")
    out = {}
    for w in WEIGHTS:
        start = time.perf_counter()
        loss = generation_loss(model, val, weights=w, block_size=T, batch_size=32, device=cpu)
        out[w] = {"val_loss": loss, "seconds": time.perf_counter() - start}
    for w in WEIGHTS:
        out[w]["change"] = out[w]["val_loss"] - out["float32"]["val_loss"]
        print(f"  {w:<9} whole-validation loss {out[w]['val_loss']:.5f} ({out[w]['change']:+.5f})")
    return out


def figure(record: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    x = range(len(WEIGHTS))
    for i, (name, rows) in enumerate(record["rates"].items()):
        rates = [rows[w]["tokens_per_s"] for w in WEIGHTS]
        where = [j + 0.4 * i - 0.2 for j in x]
        left.bar(where, rates, width=0.4, label=name)
        for at, rate in zip(where, rates, strict=True):
            left.annotate(f"{rate:.0f}", (at, rate), ha="center", va="bottom", fontsize=8)
    left.set_xticks(list(x), WEIGHTS)
    left.set_ylabel("tokens / s (batch 1, cached greedy)")
    left.set_title("generation speed")
    left.legend(fontsize=8)
    changes = [record["losses"][w]["change"] for w in WEIGHTS]
    right.bar(list(x), changes, color="tab:gray")
    for i, change in enumerate(changes):  # the bars of small changes are too short to read
        right.annotate(f"{change:+.5f}", (i, max(change, 0.0)), ha="center", va="bottom")
    right.axhline(0.01, color="tab:red", linestyle="--", linewidth=1, label="0.01")
    right.set_xticks(list(x), WEIGHTS)
    right.set_ylabel("whole-validation loss - float32's")
    right.set_title(f"loss change ({record['checkpoint_model']})")
    right.legend(fontsize=8)
    fig.suptitle(f"{record['machine']}, {record['threads']} threads, torch {record['torch']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", help="a `gptblock train` run directory (default: train one)")
    p.add_argument("--data", default="shakespeare", help="the run's corpus (a name or a file)")
    p.add_argument("--train-args", default="", help="options for `gptblock train` without --out")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", help="write every number here")
    p.add_argument("--figure", help="draw the figure here (PNG)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cpu_name = platform.processor() or platform.machine()
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        cpu_name = next(line.split(":", 1)[1].strip() for line in lines if "model name" in line)
    except (OSError, StopIteration):
        pass
    print(f"torch {torch.__version__}, {args.threads} threads, {cpu_name}, "
          f"bfloat16 in hardware: {native_bfloat16('cpu')}")  # fmt: skip
    six = GPT(GPTConfig(vocab_size=65, block_size=256, n_layer=6, n_head=6, n_embd=384)).eval()
    rates = {"6 x 384": token_rates(six, args.repeats)}
    print_rates("6 layers x 384 (random weights)", rates["6 x 384"])
    with tempfile.TemporaryDirectory() as tmp:
        run = checkpoint(args, tmp)
        model, tokenizer, _ = gptblock.load(run)
        model.eval()
        c = model.config
        shape = f"{c.n_layer} x {c.n_embd}, checkpoint"
        rates[shape] = token_rates(model, args.repeats)
        print_rates(f"{run}: {c.n_layer} layers x {c.n_embd}", rates[shape])
        print(f"{run}: whole-validation loss as generation computes it")
        loss_rows = losses(model, tokenizer, args.data)
    record = {
        "rates": rates,
        "losses": loss_rows,
        "checkpoint": str(run) if args.out else f"gptblock train {args.train_args}".strip(),
        "checkpoint_model": shape,
        "threads": args.threads,
        "machine": cpu_name,
        "native_bfloat16": native_bfloat16("cpu"),
        "torch": torch.__version__,
        "gptblock": gptblock.__version__,
        "command": " ".join(sys.argv),
    }
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    if args.figure:
        figure(record, args.figure)


if __name__ == "__main__":
    main()
