"""Issue 19's one forward against the code before it: a training step and cached generation.

    python benchmarks/forward_regression.py                  # 1d70c60 (before) vs this checkout
    python benchmarks/forward_regression.py --repeats 21 --json results/forward-regression.json
    python benchmarks/forward_regression.py --smoke          # tiny sizes: only that it runs

Both versions run in this one process, side by side. The old revision's ``src/gptblock`` is
exported with ``git archive`` and imported as the package ``gptblock_old`` (gptblock's imports
inside the package are relative, so the two copies are independent); the new one is the
``gptblock`` this interpreter imports (the checkout, when installed editable). Each measurement
alternates old and new call by call, after ``--warmup`` untimed calls each, so that a change in
the machine's load hits both alike, and reports each side's median over ``--repeats`` calls and
the median and range of the per-pair ratios old / new (above 1: the new code is faster).

* train step: the default preset's shape (``shakespeare-cpu``: 3 layers, 4 heads, 128 wide,
  context 32, vocabulary 65, batch 128), in its dtype (bfloat16 autocast where the CPU has it,
  else float32) with its optimizer (Muon for the hidden matrices, AdamW the rest, as
  ``configure_optimizer`` builds it): forward with targets, backward, gradient clipping at 1.0,
  ``step``, ``zero_grad``. Each version trains its own copy of the same initial weights.
* generation: the 6-layer, 384-wide GPT (6 heads, context 256, vocabulary 65), float32, batch 1,
  greedy with the KV cache from a one-token prompt, ``--new-tokens`` tokens: tokens/s, and
  whether the two versions generate the same tokens from the same weights.

Run it on a quiet machine: on a shared one the ratios' range says how far to trust the medians.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from harness import alternate, import_old

import gptblock
from gptblock.devices import resolve_dtype

ROOT = Path(__file__).resolve().parents[1]
BEFORE = "1d70c60"  # the commit before issue 19's one forward


def side_by_side(calls: dict[str, Callable[[], Any]], warmup: int, repeats: int) -> dict[str, Any]:
    """Seconds per call of each of ``calls`` (old, new), alternating, and the ratios old / new."""
    times = alternate(calls, repeats, warmup=warmup)  # who goes first alternates
    ratios = sorted(o / n for o, n in zip(times["old"], times["new"], strict=True))
    return {
        "seconds": {name: statistics.median(t) for name, t in times.items()},
        "ratio": {"median": statistics.median(ratios), "min": ratios[0], "max": ratios[-1]},
        "all": times,
    }


def train_step(
    pkg: ModuleType, state: dict[str, torch.Tensor], shape: dict[str, Any]
) -> Callable[[], None]:
    """One training step of ``pkg``'s GPT from ``state``, on fixed random batches."""
    config = importlib.import_module(pkg.__name__ + ".train.config")
    devices = importlib.import_module(pkg.__name__ + ".devices")
    model = pkg.GPT(pkg.GPTConfig(**shape["model"]))
    model.load_state_dict(state)
    model.train()
    cfg = config.TrainConfig(
        block_size=shape["model"]["block_size"], batch_size=shape["batch"], optimizer="muon",
        lr=5e-3, muon_lr=0.04, dtype=shape["dtype"],
    )  # fmt: skip
    optimizer = config.configure_optimizer(model, cfg)
    g = torch.Generator().manual_seed(0)
    B, T, V = shape["batch"], shape["model"]["block_size"], shape["model"]["vocab_size"]
    x, y = torch.randint(0, V, (2, B, T), generator=g)  # (B, T) ids and targets
    device = torch.device("cpu")

    def step() -> None:
        with devices.autocast_context(device, shape["dtype"]):
            _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def generation(
    pkg: ModuleType, state: dict[str, torch.Tensor], shape: dict[str, Any]
) -> tuple[Callable[[], None], Callable[[], torch.Tensor]]:
    """Cached greedy generation of ``pkg``'s GPT from ``state``: the timed call, and one that
    returns the tokens."""
    model = pkg.GPT(pkg.GPTConfig(**shape["model"]))
    model.load_state_dict(state)
    model.eval()
    prompt = torch.zeros(1, 1, dtype=torch.long)

    def tokens() -> torch.Tensor:
        return model.generate(prompt, shape["new_tokens"], temperature=0, use_cache=True)

    def run() -> None:
        tokens()

    return run, tokens


def shapes(smoke: bool, new_tokens: int) -> dict[str, dict[str, Any]]:
    dtype = resolve_dtype("auto", "cpu")
    if smoke:
        tiny = dict(vocab_size=65, block_size=16, n_layer=1, n_head=2, n_embd=32)
        return {
            "train": {"model": tiny, "batch": 4, "dtype": dtype},
            "generate": {"model": tiny, "new_tokens": 8},
        }
    return {
        "train": {
            "model": dict(vocab_size=65, block_size=32, n_layer=3, n_head=4, n_embd=128),
            "batch": 128,
            "dtype": dtype,
        },
        "generate": {
            "model": dict(vocab_size=65, block_size=256, n_layer=6, n_head=6, n_embd=384),
            "new_tokens": min(new_tokens, 256),
        },
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--old", default=BEFORE, help="the revision to compare against")
    p.add_argument("--repeats", type=int, default=15, help="timed calls per version")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls per version first")
    p.add_argument("--new-tokens", type=int, default=128, help="tokens per generation")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, 2 repeats: that it runs")
    p.add_argument("--json", help="write the numbers here")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    repeats, warmup = (2, 1) if args.smoke else (args.repeats, args.warmup)
    with tempfile.TemporaryDirectory() as tmp:
        pkgs = {"old": import_old(args.old, Path(tmp)), "new": gptblock}
        plan = shapes(args.smoke, args.new_tokens)
        record: dict[str, Any] = {
            "old": args.old, "torch": torch.__version__, "threads": torch.get_num_threads(),
            "plan": plan,
        }  # fmt: skip
        print(f"old = {args.old}, new = {ROOT}; torch {torch.__version__}, "
              f"{torch.get_num_threads()} threads, {repeats} repeats")  # fmt: skip

        torch.manual_seed(0)
        init = gptblock.GPT(gptblock.GPTConfig(**plan["train"]["model"])).state_dict()
        steps = {name: train_step(pkg, init, plan["train"]) for name, pkg in pkgs.items()}
        record["train_step"] = side_by_side(steps, warmup, repeats)
        report("train step", record["train_step"], plan["train"])

        torch.manual_seed(0)
        init = gptblock.GPT(gptblock.GPTConfig(**plan["generate"]["model"])).state_dict()
        made = {name: generation(pkg, init, plan["generate"]) for name, pkg in pkgs.items()}
        result = side_by_side({name: m[0] for name, m in made.items()}, warmup, repeats)
        n = plan["generate"]["new_tokens"]
        result["tokens_per_s"] = {name: n / s for name, s in result["seconds"].items()}
        result["same_tokens"] = bool(torch.equal(made["old"][1](), made["new"][1]()))
        record["generation"] = result
        report("generation", result, plan["generate"])
        print(f"{'':>12}  tokens/s: old {result['tokens_per_s']['old']:.1f}, "
              f"new {result['tokens_per_s']['new']:.1f}; same tokens: {result['same_tokens']}")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")


def report(what: str, result: dict[str, Any], shape: dict[str, Any]) -> None:
    s, r = result["seconds"], result["ratio"]
    print(
        f"{what:>12}: old {1e3 * s['old']:8.2f} ms, new {1e3 * s['new']:8.2f} ms; "
        f"old / new {r['median']:.3f} (pairs {r['min']:.3f}-{r['max']:.3f})  {shape}"
    )


if __name__ == "__main__":
    main()
