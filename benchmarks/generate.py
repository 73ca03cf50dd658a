"""Generation speed: the KV cache against recomputing the whole context every step.

    python benchmarks/generate.py                      # 6 layers, 6 heads, 384 wide, block 256
    python benchmarks/generate.py --device cuda --dtype bfloat16

Both paths generate the same tokens (greedy, from a one-token prompt); the uncached one is what
nanoGPT's ``generate`` does: run the model on the whole (cropped) context for every new token.
Each repeat times one cached and one uncached generation back to back. Prints, for each path,
the median total time over the repeats, tokens/s and the time of single steps at several
positions (median over the repeats, each the mean of the 5 steps around that position); then
the speed-up, as the median and the range of the repeats' own ratios (a shared machine's load
changes between repeats, and a ratio taken within one repeat is hit by it least).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from gptblock import GPT, GPTConfig

POSITIONS = (16, 64, 128, 255)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_steps(model: GPT, prompt: torch.Tensor, n: int, use_cache: bool) -> list[float]:
    """Seconds per generation step; step i processes the token at position i (1-token prompt)."""
    times = []
    steps = model.stream(prompt, n, temperature=0, use_cache=use_cache)
    t0 = time.perf_counter()
    for _ in steps:
        sync(prompt.device)
        t1 = time.perf_counter()
        times.append(t1 - t0)
        t0 = t1
    return times


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--n-layer", type=int, default=6)
    p.add_argument("--n-head", type=int, default=6)
    p.add_argument("--n-embd", type=int, default=384)
    p.add_argument("--block-size", type=int, default=256)
    p.add_argument("--vocab-size", type=int, default=65)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--json", help="write the numbers to this file")
    args = p.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: skipped")
        return
    torch.manual_seed(0)
    cfg = GPTConfig(args.vocab_size, args.block_size, args.n_layer, args.n_head, args.n_embd)
    model = GPT(cfg).to(device=device, dtype=getattr(torch, args.dtype)).eval()
    prompt = torch.zeros(1, 1, dtype=torch.long, device=device)
    n = min(args.new_tokens, args.block_size)
    time_steps(model, prompt, 8, True)  # warm-up
    time_steps(model, prompt, 8, False)
    runs: dict[str, list[list[float]]] = {"cached": [], "uncached": []}
    for _ in range(args.repeats):
        for name in runs:
            runs[name].append(time_steps(model, prompt, n, name == "cached"))
    same = torch.equal(
        model.generate(prompt, n, temperature=0, use_cache=True),
        model.generate(prompt, n, temperature=0, use_cache=False),
    )
    result: dict[str, object] = {
        "config": vars(args),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "same_tokens": same,
    }
    print(
        f"GPT {args.n_layer} layers, {args.n_head} heads, {args.n_embd} wide, block {args.block_size}, "
        f"{args.dtype} on {device}, {torch.get_num_threads()} threads; {n} new tokens, {args.repeats} repeats"
    )
    for name, rs in runs.items():
        total = statistics.median(sum(r) for r in rs)
        per_pos = {
            pos: statistics.median(statistics.fmean(r[max(0, pos - 2) : pos + 3]) for r in rs) * 1e3
            for pos in POSITIONS
            if pos < n
        }
        result[name] = {"seconds": total, "tokens_per_s": n / total, "ms_per_token_at": per_pos}
        at = "  ".join(f"pos {k}: {v:6.2f} ms" for k, v in per_pos.items())
        print(f"{name:>9}: {total:7.3f} s  {n / total:8.1f} tok/s   {at}")
    ratios = sorted(sum(u) / sum(c) for c, u in zip(runs["cached"], runs["uncached"], strict=True))
    result["speedup"] = {"median": statistics.median(ratios), "min": ratios[0], "max": ratios[-1]}
    print(
        f"speed-up of the cache: {statistics.median(ratios):.1f}x "
        f"(repeats: {ratios[0]:.1f}x to {ratios[-1]:.1f}x); same tokens both ways: {same}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
