"""The speedrun's record table: each idea, run three times with different seeds, side by side
with the baseline in one session.

    python benchmarks/speedrun_ladder.py --json benchmarks/results/speedrun-ladder.json

Runs ``benchmarks/speedrun.py`` as a fresh process per run (its wall time includes the
process's start), the rungs interleaved seed by seed so that a change in the machine's load
hits every rung alike. Prints a Markdown table: each rung's three wall times, its start (from
the process's start to the first step: the median over the seeds), whether every run reached
1.88, the final whole-validation losses, and the ratio of the baseline's median time to the
rung's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def sets(*items: str) -> list[str]:
    """``speedrun.py`` arguments that replace preset settings: ``--set NAME=VALUE`` each."""
    return [arg for item in items for arg in ("--set", item)]


MODERN = ("position=rope", "qk_norm=True", "norm=rmsnorm")  # the modern block's three parts

# (label, what changed, speedrun.py arguments); each rung adds one idea to the one above it.
RUNGS = [
    ("baseline", "nanoGPT's README CPU recipe (nanogpt-cpu), to its end", ["--baseline"]),
    (
        "muon",
        "Muon for the matrices + warmup-stable-decay, nanoGPT's model and batch, 600 steps",
        [
            "--preset",
            "nanogpt-cpu",
            "--set",
            "optimizer=muon",
            "--set",
            "schedule=wsd",
            "--set",
            "max_iters=600",
            "--set",
            "lr=3e-3",
            "--set",
            "muon_lr=0.03",
            "--set",
            "min_lr_ratio=0.0",
            "--set",
            "warmup=50",
            "--set",
            "decay_fraction=0.4",
        ],
    ),
    (
        "shape",
        "3 layers, batch 128 of context 32, 150 steps (shakespeare-cpu in float32)",
        ["--set", "dtype=float32"],
    ),
    (
        "bf16",
        "bfloat16 autocast (SDPA's flash kernel, Newton-Schulz in float32)",
        ["--attention", "flash", "--ns-dtype", "float32"],
    ),
    (
        "math-kernel",
        "SDPA's math kernel for T <= 128 in bfloat16",
        ["--attention", "math", "--ns-dtype", "float32"],
    ),
    (
        "ns-bf16",
        "Muon's Newton-Schulz in bfloat16 (SDPA's math kernel still)",
        ["--attention", "math"],
    ),
    (
        "products",
        "attention as explicit products in bfloat16 training: shakespeare-cpu as it ships",
        [],
    ),
    (
        "modern",
        "rotary positions, qk-norm and RMSNorm (the modern block), 110 steps",
        sets(*MODERN, "max_iters=110"),
    ),
    (
        "bigram",
        "+ the bigram embedding (each (previous, current) character pair), 80 steps",
        sets(*MODERN, "bigram=True", "max_iters=80"),
    ),
    (
        "momentum",
        "+ Muon's momentum 0.85, AdamW's peak 8e-3, 65 steps",
        [
            "--preset",
            "shakespeare-cpu-modern",
            *sets("rope_theta=10000.0", "muon_momentum=0.85", "max_iters=65"),
        ],
    ),
    (
        "theta",
        "+ rotary base 100, Muon's momentum 0.8, 63 steps: shakespeare-cpu-modern",
        ["--preset", "shakespeare-cpu-modern"],
    ),
    (
        "float32",
        "shakespeare-cpu-modern in float32 (a CPU without bfloat16; beside the ladder)",
        ["--preset", "shakespeare-cpu-modern", "--set", "dtype=float32"],
    ),
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--rungs", nargs="+", default=[r[0] for r in RUNGS])
    p.add_argument("--json", help="write every run's record here")
    args = p.parse_args()
    rungs = [r for r in RUNGS if r[0] in args.rungs]
    records: dict[str, list[dict]] = {label: [] for label, _, _ in rungs}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for label, _, extra in rungs:
                out = Path(tmp) / f"{label}-{seed}.json"
                cmd = [sys.executable, str(HERE / "speedrun.py"), "--seed", str(seed)]
                subprocess.run(
                    [*cmd, *extra, "--json", str(out)], check=True, capture_output=True, text=True
                )
                rec = json.loads(out.read_text())
                records[label].append(rec)
                print(
                    f"{label} seed {seed}: {rec['wall_seconds']:.1f} s, loss {rec['val_loss']:.4f}",
                    flush=True,
                )
    base = None
    if records.get("baseline"):
        base = statistics.median(r["wall_seconds"] for r in records["baseline"])
    print(
        "\n| rung | what changed | wall s (3 seeds) | start s | losses | all <= 1.88 | x baseline |"
    )
    print("|---|---|---|---|---|---|---|")
    for label, what, _ in rungs:
        rs = records[label]
        times = ", ".join(f"{r['wall_seconds']:.1f}" for r in rs)
        losses = ", ".join(f"{r['val_loss']:.3f}" for r in rs)
        med = statistics.median(r["wall_seconds"] for r in rs)
        # process start to the first step: the median over the seeds (records before it: -)
        starts = [r["start_seconds"] for r in rs if "start_seconds" in r]
        start = f"{statistics.median(starts):.2f}" if starts else "-"
        ratio = f"{base / med:.2f}" if base else "-"
        ok = all(r["reached"] for r in rs)
        print(
            f"| {label} | {what} | {times} | {start} | {losses} | {'yes' if ok else 'no'} "
            f"| {ratio} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1) + "\n")


if __name__ == "__main__":
    main()
