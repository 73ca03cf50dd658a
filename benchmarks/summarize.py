"""Summarise several ``gptblock bench --json`` runs: FusedBlock's ratios, run to run.

One run's medians move by several percent on a shared machine; the README quotes the spread over
runs, computed by this script:

    for k in 1 2 3 4 5; do gptblock bench --json benchmarks/results/cpu-run$k.json; done
    python benchmarks/summarize.py benchmarks/results/cpu-run*.json
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    """min-max (median)."""
    lo, mid, hi = min(values), statistics.median(values), max(values)
    return f"{fmt.format(lo)}-{fmt.format(hi)} ({fmt.format(mid)})"


def main(paths: list[str]) -> None:
    runs = [json.loads(Path(p).read_text()) for p in paths]
    others = [r["environment"].get("others_cpu_share") or 0.0 for r in runs]
    peaks = [r["peak"]["flops_per_s"] / 1e9 for r in runs]
    print(f"{len(runs)} runs; matmul peak {spread(peaks, '{:.0f}')} GFLOP/s; ", end="")
    print(f"other processes' CPU share {spread([100 * o for o in others], '{:.1f}')}%")
    print("FusedBlock, min-max (median) over runs:")
    print(
        f"{'T':>5} {'B':>3} {'mode':<9}  {'x encoder layer':<20} {'x lesson':<20} % peak (ceiling)"
    )
    first = runs[0]["measurements"]
    shapes = dict.fromkeys((m["seq_len"], m["batch"], m["mode"]) for m in first)
    for T, B, mode in shapes:

        def ms(run: dict, form: str, T: int = T, mode: str = mode) -> dict:
            return next(
                m
                for m in run["measurements"]
                if (m["form"], m["seq_len"], m["mode"]) == (form, T, mode)
            )

        enc = [ms(r, "encoder_layer")["ms"] / ms(r, "fused")["ms"] for r in runs]
        les = [ms(r, "lesson")["ms"] / ms(r, "fused")["ms"] for r in runs]
        pct = [ms(r, "fused")["pct_of_peak"] for r in runs]
        ceiling = [ms(r, "matmuls")["pct_of_peak"] for r in runs]
        print(
            f"{T:>5} {B:>3} {mode:<9}  {spread(enc):<20} {spread(les):<20} "
            f"{spread(pct, '{:.0f}'):<14} ({spread(ceiling, '{:.0f}')})"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
