"""The CPU speedrun: Tiny Shakespeare to a whole-validation loss of 1.88, as fast as possible.

    python benchmarks/speedrun.py                      # the shakespeare-cpu preset, seed 1337
    python benchmarks/speedrun.py --seed 2 --json run.json
    python benchmarks/speedrun.py --baseline           # nanoGPT's README CPU recipe, to its end
    python benchmarks/speedrun.py --preset shakespeare-cpu-long --budget 60   # track 2

The speedrun trains gptblock's GPT with a preset (default ``shakespeare-cpu``) and stops as soon
as the loss on the WHOLE validation split (the last 10% of the text; mean per-character
cross-entropy over non-overlapping windows of the model's context, every character scored once:
``gptblock.train.evaluate.validation_loss``, in float32 whatever the training dtype) is <=
``--target``. That loss is computed at the steps ``--check-at`` names and at the last step
(where the warmup-stable-decay schedule has decayed); each check is timed with everything else. No validation data
trains the model or decides when to stop other than those checks. (The trainer's own estimates,
a batch at the start and at the end, only print.)

``--baseline`` runs the ``nanogpt-cpu`` preset, nanoGPT's README recipe (4 layers, 4 heads, 128
wide, context 64, batch 12, 2000 iterations, dropout 0, AdamW lr 1e-3, betas (0.9, 0.99), weight
decay 0.1, 100 warmup steps, cosine to 1e-4, an estimate of 20 batches every 250 steps), to its
end, and reports its wall time and final whole-validation loss.

``--budget SECONDS`` is track 2: train until the budget, counted from the process's start, and
report the whole-validation loss reached then (no target: the loss is the result). The number of
steps is decided by the clock (``speedrun_budget.BudgetPlan``): after a few steps the final
check's cost is estimated (a sixteenth of the validation windows, timed), and from then on
``max_iters`` is re-planned after every step as the steps that still fit before the budget less
that check, so the warmup-stable-decay schedule ends its decay at the last step even when the
machine's speed drifts.

The wall time runs from the process's start (read from /proc, so the interpreter's and torch's
start-up count) to the check that reaches the target (or, for the baseline, to the end). Its
start, from the process's start to the first step, is reported too (``start_seconds``), in parts:
the interpreter and the imports, reading and encoding the corpus and building the model and
optimizer, and the trainer's estimate at step 0 (one batch of each split). Nothing
is written but the ``--json`` record: no checkpoints. Prints one line per check and a summary.
"""

from __future__ import annotations

import time

START = time.time()  # a fallback for the process's start; /proc's is used where it exists

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
from harness import parse_settings  # noqa: E402  (benchmarks/)
from speedrun_budget import budget_callback, check_budget  # noqa: E402  (benchmarks/)

from gptblock import __version__  # noqa: E402
from gptblock.blocks import attention  # noqa: E402
from gptblock.blocks.config import check_positive_int, check_seed  # noqa: E402
from gptblock.devices import set_threads  # noqa: E402
from gptblock.errors import UserError, UserValueError  # noqa: E402
from gptblock.files import atomic_write_json, check_destination  # noqa: E402
from gptblock.train.evaluate import validation_loss  # noqa: E402
from gptblock.train.presets import preset_settings  # noqa: E402
from gptblock.train.run import prepare_run  # noqa: E402

IMPORTED = time.time()  # the interpreter and every import done


def process_start() -> float:
    """When this process started, in ``time.time()`` seconds (Linux /proc; else at import)."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # starttime: clock ticks after boot
        btime = next(
            int(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return START


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--baseline", action="store_true", help="nanoGPT's CPU recipe, to its end")
    p.add_argument("--preset", help="default: shakespeare-cpu (nanogpt-cpu with --baseline)")
    p.add_argument("--data", default="shakespeare", help="a built-in corpus or a text file")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--target", type=float, default=1.88, help="whole-validation loss to reach")
    p.add_argument("--check-at", type=int, nargs="*", default=[], help="extra check steps")
    p.add_argument(
        "--budget",
        type=float,
        metavar="SECONDS",
        help="track 2: train until this many seconds after the process's start, the\n"
        "schedule's decay ending there, and report the whole-validation loss",
    )
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override a preset setting (a Python literal), e.g. --set max_iters=140; every\n"
        "gptblock train setting, the modern block's included: --set norm=rmsnorm\n"
        "--set position=rope --set rope_pairing=adjacent --set rope_theta=500.0\n"
        "--set mlp=swiglu --set d_ff=384 --set n_kv_head=2 --set qk_norm=True\n"
        "--set parallel_residual=True --set bias=False --set tie_embeddings=False\n"
        "--set activation=relu2 --set zero_init_proj=True --set logit_softcap=15.0\n"
        "--set muon_momentum=0.9",
    )
    p.add_argument(
        "--attention",
        choices=("auto", "flash", "math"),
        default="auto",
        help="the route of attention in bfloat16 training at T <= 256: auto, the explicit\n"
        "products (attention.product_attention); flash, SDPA's own choice\n"
        "(attention.PRODUCTS_MAX_T = 0); math, SDPA's math kernel (the first ladder's)",
    )
    p.add_argument(
        "--ns-dtype",
        choices=("auto", "float32"),
        default="auto",
        help="float32: Muon's Newton-Schulz in float32 whatever the training dtype",
    )
    p.add_argument("--json", help="write the record here")
    args = p.parse_args()
    started = process_start()
    try:
        speedrun(args, started)
    except UserError as e:  # a bad argument: one line, as gptblock's own commands print it
        print(f"{Path(sys.argv[0]).name}: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def speedrun(args: argparse.Namespace, started: float) -> None:
    """Run what ``args`` asks; every argument is checked before the run, --json's place too,
    so a run of minutes never ends unable to write its record."""
    if args.json:
        check_destination(args.json)
    check_seed(args.seed, "--seed")
    if not math.isfinite(args.target) or args.target <= 0:
        raise UserValueError(f"--target must be a positive, finite loss, got {args.target}")
    for step in args.check_at:
        check_positive_int("--check-at", step)
    if args.budget is not None:
        check_budget(args, started)
    set_threads(args.threads)
    track2 = "shakespeare-cpu-long" if args.budget is not None else "shakespeare-cpu"
    if args.preset is None:  # not given: an empty --preset '' is a name, refused as one
        args.preset = "nanogpt-cpu" if args.baseline else track2
    preset = args.preset
    overrides = parse_settings(args.set)
    check_owned(args, overrides)
    settings = preset_settings(preset, overrides)
    if args.attention == "flash":
        attention.PRODUCTS_MAX_T = 0
    elif args.attention == "math":
        attention.product_attention = math_kernel
    if args.budget is not None:
        # The clock decides the steps (BudgetPlan): until it has, the run is "endless".
        overrides |= {"max_iters": ENDLESS, "eval_interval": ENDLESS, "eval_iters": 1}
    elif not args.baseline:
        # The trainer's estimates only print here: one batch, at the start and at the end.
        overrides |= {"eval_interval": settings.max_iters, "eval_iters": 1}
    # A CPU record: the CPU unless --set device=... says otherwise (prepare_run's default is auto).
    overrides = {"device": "cpu", "seed": args.seed} | overrides
    run = prepare_run(args.data, out_dir=None, preset=preset, progress=False, **overrides)
    prepared = time.time()  # the corpus read and encoded, the model and optimizer built
    if args.ns_dtype == "float32":
        for group in run.trainer.optimizer.param_groups:
            if "ns_dtype" in group:
                group["ns_dtype"] = "float32"
    T, val = run.train_config.block_size, run.splits.val
    checks: list[dict[str, float]] = []
    reached: dict[str, float] | None = None

    def check(step: int) -> float:
        loss = validation_loss(
            run.model, val, block_size=T, batch_size=64, device=run.trainer.device
        )
        checks.append({"step": step, "val_loss": loss, "seconds": time.time() - started})
        print(f"step {step}: whole-validation loss {loss:.4f} at {checks[-1]['seconds']:.1f} s")
        return loss

    last_step = run.train_config.max_iters
    due = {*args.check_at, last_step}
    plan: dict[str, object] = {}

    def on_step(trainer: object) -> None:
        nonlocal reached
        step = run.trainer.iter_num
        if step in due and check(step) <= args.target:
            reached = checks[-1]
            run.trainer.request_stop()  # the trainer's own closing score is not timed

    if args.budget is not None:
        on_step = budget_callback(run, args.budget, started, check, plan)

    start: dict[str, float] = {}

    def on_eval(trainer: object) -> None:
        # The trainer's estimate at step 0 (one batch of each split) ends: the first step
        # starts now. What came before is the start's cost.
        if run.trainer.iter_num == 0 and not start:
            now = time.time()
            start["start_seconds"] = now - started
            start["imports_seconds"] = IMPORTED - started
            start["prepare_seconds"] = prepared - IMPORTED
            start["step0_estimate_seconds"] = now - prepared

    run.trainer.add_callback("on_step_end", on_step)
    run.trainer.add_callback("on_eval_end", on_eval)
    run.fit()
    if not checks:  # stopped (a signal, Ctrl-C) before its first whole-validation check
        name = Path(sys.argv[0]).name
        print(
            f"{name}: stopped at step {run.trainer.iter_num}, before any check: no result",
            file=sys.stderr,
        )
        raise SystemExit(1)
    last = reached or checks[-1]
    tokens = last["step"] * run.train_config.batch_size * T
    if args.budget is not None:
        settings = preset_settings(preset, overrides | {"max_iters": last["step"]})
        report_budget(args, settings, run, last, tokens, start | plan)
        return
    kind = "baseline" if args.baseline else "speedrun"
    ok = reached is not None
    print(
        f"{kind} ({preset}, seed {args.seed}): {'reached' if ok else 'did NOT reach'} "
        f"{args.target} -- whole-validation loss {last['val_loss']:.4f} at step {last['step']}, "
        f"{tokens:,} tokens, {last['seconds']:.1f} s from process start"
    )
    if start:  # the trainer's step-0 estimate ran (a fresh run always has one)
        print(
            f"start (process start to the first step): {start['start_seconds']:.2f} s -- "
            f"interpreter and imports {start['imports_seconds']:.2f}, corpus, model and "
            f"optimizer {start['prepare_seconds']:.2f}, the step-0 estimate "
            f"{start['step0_estimate_seconds']:.2f}"
        )
    if args.json:
        record = {
            "kind": kind,
            "preset": preset,
            "settings": {
                **dataclasses.asdict(preset_settings(preset, overrides)),
                "device": run.train_config.device,
                "dtype": run.train_config.dtype,
            },
            "attention": args.attention,
            "ns_dtype": args.ns_dtype,
            "seed": args.seed,
            "target": args.target,
            "reached": ok,
            "wall_seconds": last["seconds"],
            **start,
            "steps": last["step"],
            "tokens": tokens,
            "val_loss": last["val_loss"],
            "checks": checks,
            "threads": args.threads,
            "gptblock": __version__,
            "torch": torch.__version__,
            "machine": platform.processor() or platform.machine(),
        }
        atomic_write_json(args.json, record)
    if not ok and not args.baseline:
        raise SystemExit(1)  # the speedrun failed: a script or CI can tell


def check_owned(args: argparse.Namespace, overrides: dict[str, Any]) -> None:
    """Refuse a ``--set`` of a setting this script decides itself, which would be ignored or
    reported as something else: the seed is ``--seed``'s; with ``--budget`` the clock plans
    ``max_iters`` and the trainer's estimates, without it (but for ``--baseline``) the
    whole-validation checks replace the trainer's estimates."""
    owned = {"seed": "--seed"}
    if args.budget is not None:
        owned |= dict.fromkeys(("max_iters", "eval_interval", "eval_iters"), "--budget")
    elif not args.baseline:
        owned |= dict.fromkeys(("eval_interval", "eval_iters"), "the speedrun's checks")
    for name, by in owned.items():
        if name in overrides:
            raise UserValueError(
                f"--set {name}={overrides[name]!r} cannot act: {by} decides {name} here"
            )


def math_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: float) -> torch.Tensor:
    """Causal attention by SDPA's math kernel: ``--attention math``."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, dropout_p=p, is_causal=True
        )


ENDLESS = 10**7  # max_iters until the clock has planned the steps (never reached)


def report_budget(
    args: argparse.Namespace,
    settings: Any,
    run: Any,
    last: dict[str, float],
    tokens: int,
    measured: dict[str, Any],
) -> None:
    """Print track 2's result and write its record."""
    over = last["seconds"] - args.budget
    print(
        f"track 2 ({args.preset}, seed {args.seed}): whole-validation loss {last['val_loss']:.4f} "
        f"after {last['step']} steps, {tokens:,} tokens; {last['seconds']:.1f} s from process "
        f"start, budget {args.budget:.1f} s ({over:+.1f} s)"
    )
    if args.json:
        record = {
            "kind": "track2",
            "preset": args.preset,
            "settings": {
                **dataclasses.asdict(settings),
                "device": run.train_config.device,
                "dtype": run.train_config.dtype,
            },
            "seed": args.seed,
            "budget_seconds": args.budget,
            "wall_seconds": last["seconds"],
            **measured,
            "steps": last["step"],
            "tokens": tokens,
            "val_loss": last["val_loss"],
            "threads": args.threads,
            "gptblock": __version__,
            "torch": torch.__version__,
            "machine": platform.processor() or platform.machine(),
        }
        atomic_write_json(args.json, record)


if __name__ == "__main__":
    main()
