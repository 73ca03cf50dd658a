"""Where a training step's time goes, at a preset's shape: matmuls, attention, elementwise work,
the optimizer, the data and Python.

    python benchmarks/profile_step.py                     # the default preset (shakespeare-cpu)
    python benchmarks/profile_step.py --preset tiny --steps 30

Builds the preset's GPT and ``Trainer`` on Tiny Shakespeare, runs ``--warmup`` steps, then
profiles ``--steps`` steps with ``torch.profiler`` (CPU activities). Each step is split into
phases with ``record_function``: "data" (drawing the batch), "forward", "backward", "optimizer"
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
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from gptblock import GPT, CharTokenizer, Trainer
from gptblock.data.batches import split_tokens
from gptblock.data.text import shakespeare
from gptblock.devices import resolve_dtype
from gptblock.train.presets import preset_settings

PHASES = ("data", "forward", "backward", "optimizer", "read")
MATMUL = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_mkl_linear")
ATTENTION = ("scaled_dot_product", "flash_attention", "_efficient_attention")


def kind(name: str) -> str:
    if name.startswith(MATMUL):
        return "matmul"
    if any(a in name for a in ATTENTION):
        return "attention"
    return "elementwise and other ops"


def build(preset: str, threads: int, dtype: str | None = None) -> Trainer:
    torch.set_num_threads(threads)
    s = preset_settings(preset, {"dtype": dtype})
    text = shakespeare()
    tok = CharTokenizer.from_text(text)
    splits = split_tokens(tok.encode(text), s.block_size)
    torch.manual_seed(0)
    model = GPT(s.model_config(tok.vocab_size))
    train = s.train_config(
        max_iters=10**6, eval_interval=10**6, device="cpu", dtype=resolve_dtype(s.dtype, "cpu")
    )
    return Trainer(model, splits, train, progress=False)


def profiled_step(t: Trainer) -> None:
    """``Trainer._train_step`` with its phases marked (the same calls, in the same order)."""
    cfg = t.config
    for group in t.optimizer.param_groups:
        group["lr"] = cfg.lr * group.get("lr_scale", 1.0)
    with record_function("data"):
        x, y = t._batch(t.data.train, t.generator)
    with record_function("forward"), t.autocast:
        _, loss = t.net(x, y)
    t._unread.append(loss.detach())
    with record_function("backward"):
        t.scaler.scale(loss).backward()
    with record_function("optimizer"):
        if cfg.grad_clip > 0:
            t.scaler.unscale_(t.optimizer)
            torch.nn.utils.clip_grad_norm_(t.model.parameters(), cfg.grad_clip)
        t.scaler.step(t.optimizer)
        t.scaler.update()
        t.optimizer.zero_grad(set_to_none=True)
    t.step += 1
    if t.step % cfg.log_interval == 0:
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
        "--compare",
        action="store_true",
        help="time the step before this issue's fixes (float32, flash attention, Newton-Schulz\n"
        "in float32) and after (the preset as it ships), alternating in this process",
    )
    args = p.parse_args()
    if args.compare:
        compare(args)
        return
    t = build(args.preset, args.threads, args.dtype)
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
        f"preset {args.preset} ({t.config.dtype}), {args.threads} threads, "
        f"{args.steps} profiled steps"
    )
    for name, ms in rows:
        print(f"  {name:<36} {ms:8.2f} ms  {100 * ms / wall:5.1f}%")
    if args.json:
        Path(args.json).write_text(json.dumps({**vars(args), "rows": rows}, indent=1) + "\n")


def compare(args: argparse.Namespace) -> None:
    """Median ms per step of the two variants, timed round-robin, 10 steps a round."""
    import statistics

    from gptblock.blocks import fused

    before = build(args.preset, args.threads, "float32")
    after = build(args.preset, args.threads)
    times: dict[str, list[float]] = {"before": [], "after": []}
    for _ in range(args.warmup):
        profiled_step(before)
        profiled_step(after)
    for _ in range(max(3, args.steps // 10)):
        for name, t in (("before", before), ("after", after)):
            start = time.perf_counter()
            for _ in range(10):
                profiled_step(t)
            times[name].append((time.perf_counter() - start) * 100)  # ms per step
    assert fused.MATH_KERNEL_MAX_T > 0
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


if __name__ == "__main__":
    main()
