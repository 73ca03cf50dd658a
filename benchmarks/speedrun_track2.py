"""Track 2's table: the best whole-validation loss in the time nanoGPT's CPU recipe takes.

    python benchmarks/speedrun_track2.py --json benchmarks/results/speedrun-track2.json

Runs ``benchmarks/speedrun.py --baseline`` (nanoGPT's README CPU recipe, to its end) for each
seed, takes the median of their wall times as the budget, then runs the track-2 preset with
``--budget`` that many seconds for each seed, each followed by one more baseline run (seeds
after the first ones) so that a machine whose speed drifted during the session shows in the
table: the budget is only fair if the baselines after it took as long as the ones before. Each
run is a fresh process (its wall time includes the process's start). Prints a Markdown table:
each row's wall times, steps and whole-validation losses over the seeds, and whether every loss
is at most ``--goal``.
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


def speedrun(args: list[str], out: Path) -> dict:
    """One ``speedrun.py`` process; its record."""
    cmd = [sys.executable, str(HERE / "speedrun.py"), *args, "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{done.stderr}")
    return json.loads(out.read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--preset", default="shakespeare-cpu-long", help="track 2's preset")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="speedrun.py's --set, for track 2's runs")  # fmt: skip
    p.add_argument("--budget", type=float, help="instead of the baselines' median (no baselines)")
    p.add_argument("--no-recheck", action="store_true", help="no baseline after each run")
    p.add_argument("--goal", type=float, default=1.55, help="the loss every seed must reach")
    p.add_argument("--json", help="write every run's record here")
    args = p.parse_args()
    extra = [a for item in args.set for a in ("--set", item)]
    rows: dict[str, list[dict]] = {"baseline": [], "track 2": [], "baseline, after": []}
    with tempfile.TemporaryDirectory() as tmp:

        def run(label: str, seed: int, more: list[str]) -> None:
            rec = speedrun(["--seed", str(seed), *more], Path(tmp) / f"{label}-{seed}.json")
            rows[label].append(rec)
            print(
                f"{label} seed {seed}: {rec['wall_seconds']:.1f} s, {rec['steps']} steps, "
                f"loss {rec['val_loss']:.4f}",
                flush=True,
            )

        budget = args.budget
        if budget is None:
            for seed in args.seeds:
                run("baseline", seed, ["--baseline"])
            budget = statistics.median(r["wall_seconds"] for r in rows["baseline"])
            print(f"budget: {budget:.1f} s (the baselines' median)", flush=True)
        for i, seed in enumerate(args.seeds):
            run("track 2", seed, ["--preset", args.preset, "--budget", f"{budget:.2f}", *extra])
            if args.budget is None and not args.no_recheck:
                run("baseline, after", max(args.seeds) + 1 + i, ["--baseline"])
    print(f"\nbudget {budget:.1f} s; track 2: {args.preset} {' '.join(args.set)}".rstrip())
    print(f"\n| run | wall s (seeds) | steps | whole-val loss | all <= {args.goal} |")
    print("|---|---|---|---|---|")
    for label, rs in rows.items():
        if not rs:
            continue
        times = ", ".join(f"{r['wall_seconds']:.1f}" for r in rs)
        steps = ", ".join(str(r["steps"]) for r in rs)
        losses = ", ".join(f"{r['val_loss']:.3f}" for r in rs)
        ok = "yes" if all(r["val_loss"] <= args.goal for r in rs) else "no"
        print(f"| {label} | {times} | {steps} | {losses} | {ok} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"budget_seconds": budget, **rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
