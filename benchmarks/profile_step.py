"""Where a training step's time goes, at a preset's shape: matmuls, attention, elementwise work,
the optimizer, the data and Python.

    python benchmarks/profile_step.py                     # the default preset (shakespeare-cpu)
    python benchmarks/profile_step.py --preset tiny --steps 30
    python benchmarks/profile_step.py --set position=rope --set qk_norm=True --set norm=rmsnorm
    python benchmarks/profile_step.py --threads 1 --versus position=rope qk_norm=True norm=rmsnorm
    python benchmarks/profile_step.py --threads 1 --old fa70a5a --set position=rope \
        --set qk_norm=True --set norm=rmsnorm        # the same step, that commit's code beside this

``--set NAME=VALUE`` replaces one of the preset's settings (any ``gptblock train`` setting);
``--versus NAME=VALUE ...`` times the step as ``--set`` gives it (A) against it with these
settings too (B), and ``--old REV`` the step of git revision REV's code (A, imported as
``gptblock_old``, as ``forward_regression.py`` does) against this checkout's (B), both from the
same initial weights, alternating 10 steps each per round in this one process: the median ms per
step, CPU time (``time.process_time``, which another process on the machine inflates far less
than wall time) and wall time, and the per-round ratios A / B with their range.

Builds the preset's GPT and ``Trainer`` on Tiny Shakespeare, runs ``--warmup`` steps, then
profiles ``--steps`` steps with ``torch.profiler`` (CPU activities). Each step is split into
phases by ``Trainer.step`` itself: "data" (drawing the batch), "forward", "backward", "optimizer"
(clipping, the update, zeroing the gradients) and "read" (the loss read on the host every
``log_interval`` steps). Within the phases, the operators' self time is classed by name:

* matmul: ``aten::mm``, ``addmm``, ``bmm``, ``linear``/``matmul`` bodies (the GEMMs)
* attention: the scaled-dot-product-attention kernels (flash attention on CPU)
* elementwise and the rest of PyTorch: every other operator (LayerNorm, GELU, adds, copies,
  softmax of the loss, the optimizer's arithmetic, ...)

"python" is what is left of the wall time once every operator's self time is taken off: the
interpreter, the module calls, the trainer's bookkeeping. Prints one table (ms per step and
share of the step) and, with ``--json``, writes it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from harness import alternate, build_trainer, import_old, parse_settings
from torch.profiler import ProfilerActivity, profile, record_function

from gptblock import Trainer

PHASES = ("data", "forward", "backward", "optimizer", "read")
MATMUL = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_mkl_linear")
ATTENTION = ("scaled_dot_product", "flash_attention", "_efficient_attention")


def kind(name: str) -> str:
    if name.startswith(MATMUL):
        return "matmul"
    if any(a in name for a in ATTENTION):
        return "attention"
    return "elementwise and other ops"


def profiled_step(t: Trainer) -> None:
    """One step as ``t``'s loop takes it (``Trainer.step`` marks its phases under a profiler;
    an ``--old`` revision from before it was public, its private ``_train_step``), the losses
    read every ``log_interval`` steps as the loop reads them."""
    if callable(getattr(t, "step", None)):
        t.step()
        done = t.iter_num
    else:
        t._train_step()  # type: ignore[attr-defined]
        done = t.step
    if done % t.config.log_interval == 0:
        with record_function("read"):
            t.read_losses()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--preset", default="shakespeare-cpu")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", help="write the table here")
    p.add_argument("--dtype", help="instead of the preset's (float32, bfloat16, auto)")
    p.add_argument(
        "--set", action="append", default=[], metavar="NAME=VALUE", help="a preset setting"
    )
    p.add_argument(
        "--versus",
        nargs="+",
        metavar="NAME=VALUE",
        help="time the step without (A) and with (B) these settings, alternating",
    )
    p.add_argument("--old", metavar="REV", help="time REV's code (A) against this checkout's (B)")
    p.add_argument("--rounds", type=int, default=8, help="rounds of --versus / --old")
    p.add_argument(
        "--compare",
        action="store_true",
        help="time the step before this issue's fixes (float32, flash attention, Newton-Schulz\n"
        "in float32) and after (the preset as it ships), alternating in this process",
    )
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.compare:
        compare(args)
        return
    overrides = parse_settings(args.set)
    if args.versus or args.old:
        a_b(args, overrides)
        return
    t = build_trainer(args.preset, overrides, args.dtype)
    for _ in range(args.warmup):
        profiled_step(t)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for _ in range(args.steps):
            profiled_step(t)
        wall = (time.perf_counter() - start) * 1e3 / args.steps  # ms per step
    events = prof.key_averages()
    phase_ms = {ph: 0.0 for ph in PHASES}
    kinds: dict[str, float] = {}
    for e in events:
        if e.key in PHASES:
            phase_ms[e.key] = e.cpu_time_total / 1e3 / args.steps
        elif not e.key.startswith("ProfilerStep"):
            k = kind(e.key)
            kinds[k] = kinds.get(k, 0.0) + e.self_cpu_time_total / 1e3 / args.steps
    kinds["python and module overhead"] = max(0.0, wall - sum(kinds.values()))
    rows = [("wall time per step", wall)]
    rows += [(f"phase: {ph}", phase_ms[ph]) for ph in PHASES]
    rows += [(f"work: {k}", v) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])]
    print(
        f"preset {args.preset} {' '.join(args.set)} ({t.config.dtype}), {args.threads} threads, "
        f"{args.steps} profiled steps"
    )
    for name, ms in rows:
        print(f"  {name:<36} {ms:8.2f} ms  {100 * ms / wall:5.1f}%")
    if args.json:
        Path(args.json).write_text(json.dumps({**vars(args), "rows": rows}, indent=1) + "\n")


def compare(args: argparse.Namespace) -> None:
    """Median ms per step of the two variants, timed round-robin, 10 steps a round."""
    import statistics

    from gptblock.blocks import attention

    before = build_trainer(args.preset, dtype="float32")
    after = build_trainer(args.preset)
    for _ in range(args.warmup):
        profiled_step(before)
        profiled_step(after)

    def ten_steps(t: Trainer) -> Callable[[], None]:
        def run() -> None:
            for _ in range(10):
                profiled_step(t)

        return run

    rounds = max(3, args.steps // 10)
    seconds = alternate({"before": ten_steps(before), "after": ten_steps(after)}, rounds)
    times = {name: [s * 100 for s in v] for name, v in seconds.items()}  # ms per step
    assert attention.PRODUCTS_MAX_T > 0
    for name, ts in times.items():
        t = before if name == "before" else after
        print(
            f"{name:>6} ({t.config.dtype}): {statistics.median(ts):6.1f} ms per step "
            f"(rounds {min(ts):.1f}-{max(ts):.1f})"
        )
    ratios = [b / a for b, a in zip(times["before"], times["after"], strict=True)]
    print(
        f"before / after: {statistics.median(ratios):.2f} (rounds {min(ratios):.2f}-{max(ratios):.2f})"
    )


def a_b(args: argparse.Namespace, overrides: dict[str, Any]) -> None:
    """``--versus`` / ``--old``: A and B alternating, 10 steps each a round, who goes first
    alternating by round; ms per step in CPU time and wall time, and the ratios A / B."""
    if args.old:
        tmp = tempfile.mkdtemp(prefix="profile-step-")
        old = import_old(args.old, Path(tmp))
        a = build_trainer(args.preset, overrides, args.dtype, pkg=old)
        b = build_trainer(args.preset, overrides, args.dtype)
        names = (f"A: {args.old}'s code", "B: this checkout's")
    else:
        a = build_trainer(args.preset, overrides, args.dtype)
        b = build_trainer(
            args.preset, overrides | parse_settings(args.versus, "--versus"), args.dtype
        )
        names = ("A: " + (" ".join(args.set) or args.preset), "B: + " + " ".join(args.versus))
    steps: dict[str, Callable[[], None]] = {
        "A": lambda: profiled_step(a),
        "B": lambda: profiled_step(b),
    }
    for _ in range(args.warmup):
        for step in steps.values():
            step()
    cpu: dict[str, list[float]] = {"A": [], "B": []}
    wall: dict[str, list[float]] = {"A": [], "B": []}
    for r in range(args.rounds):
        for name in ("A", "B") if r % 2 == 0 else ("B", "A"):
            c0, w0 = time.process_time(), time.perf_counter()
            for _ in range(10):
                steps[name]()
            cpu[name].append((time.process_time() - c0) * 100)  # ms per step
            wall[name].append((time.perf_counter() - w0) * 100)
    print(f"preset {args.preset} ({b.config.dtype}), {args.threads} threads, {args.rounds} rounds")
    for label, name in zip(names, ("A", "B"), strict=True):
        print(
            f"  {label}: {statistics.median(cpu[name]):6.1f} ms CPU per step "
            f"({statistics.median(wall[name]):6.1f} ms wall)"
        )
    for what, ts in (("CPU", cpu), ("wall", wall)):
        ratios = sorted(x / y for x, y in zip(ts["A"], ts["B"], strict=True))
        print(
            f"  A / B ({what}): {statistics.median(ratios):.3f} "
            f"(rounds {ratios[0]:.3f}-{ratios[-1]:.3f})"
        )


if __name__ == "__main__":
    main()
