"""gptblock's GPT against Hugging Face's GPT2LMHeadModel on the same weights, in one process.

    python benchmarks/vs_hf.py                          # the 6-layer shape, then GPT-2 small
    python benchmarks/vs_hf.py --shapes 6L --repeats 9 --json results/vs-hf.json

For each shape a randomly initialised ``GPT2LMHeadModel`` (dropout 0) is built and
``gptblock.interop.hf.from_hf`` gives gptblock's GPT with the same weights (their logits agree to 1e-5:
``tests/test_hf.py``). Then, float32 on the CPU, each measurement alternates the two models
call by call (so a change in the machine's load hits both) and reports the median over
``--repeats`` calls after ``--warmup`` untimed ones, with the range of the per-pair ratios:

* forward: eval mode, ``no_grad``, a batch of 8 x 256 tokens;
* cached greedy generation: 128 new tokens after a 16-token prompt, batch 1, each library's
  own KV cache (``GPT.generate(temperature=0)``; ``generate(do_sample=False)``), as tokens/s,
  and whether the two generate the same tokens; once per ``--weights`` form of gptblock's
  (``GPT.generate(weights=...)``: float32, and int8 or bfloat16 copies, made at the untimed
  first call and kept), always against Hugging Face's float32;
* training step: forward with targets, backward, ``torch.optim.AdamW.step`` and
  ``zero_grad``, 8 x 256 tokens, each model with its own AdamW (the same settings); last,
  since it changes the weights.

Shapes: ``6L`` is 6 layers, 6 heads, 384 wide, context 256, vocabulary 65 (the shakespeare
preset's model); ``124M`` is GPT-2 small (12 layers, 12 heads, 768 wide, context 1024,
vocabulary 50257).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from harness import alternate
from transformers import GPT2Config, GPT2LMHeadModel

from gptblock.interop.hf import from_hf

SHAPES = {
    "6L": dict(n_layer=6, n_head=6, n_embd=384, n_positions=256, vocab_size=65),
    "124M": dict(n_layer=12, n_head=12, n_embd=768, n_positions=1024, vocab_size=50257),
}
B, T, PROMPT, NEW = 8, 256, 16, 128


def pair_timings(
    ours: Callable[[], Any], theirs: Callable[[], Any], warmup: int, repeats: int
) -> tuple[list[float], list[float]]:
    """Seconds per call of each, the two called alternately (who goes first alternating)."""
    times = alternate({"ours": ours, "theirs": theirs}, repeats, warmup=warmup)
    return times["ours"], times["theirs"]


def summary(name: str, ours: list[float], theirs: list[float], unit: str = "ms") -> dict:
    ratios = [t / o for o, t in zip(ours, theirs, strict=True)]
    row = {
        "measure": name,
        "gptblock_s": statistics.median(ours),
        "hf_s": statistics.median(theirs),
        "speedup": statistics.median(theirs) / statistics.median(ours),
        "pair_ratio_min": min(ratios),
        "pair_ratio_max": max(ratios),
    }
    scale = 1e3 if unit == "ms" else 1.0
    print(
        f"  {name:<28} gptblock {row['gptblock_s'] * scale:9.1f} {unit}   Hugging Face "
        f"{row['hf_s'] * scale:9.1f} {unit}   {row['speedup']:.2f}x "
        f"(pairs {min(ratios):.2f}-{max(ratios):.2f})"
    )
    return row


def bench(
    shape: str, warmup: int, repeats: int, gen_repeats: int, weights: list[str]
) -> list[dict]:
    torch.manual_seed(0)
    config = GPT2Config(
        **SHAPES[shape], resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        bos_token_id=None, eos_token_id=None,
        # Wider than GPT-2's 0.02, so the random model's logits have no near-ties and greedy
        # decoding is the same in both libraries (timing does not depend on the scale).
        initializer_range=0.2,
    )  # fmt: skip
    hf = GPT2LMHeadModel(config)
    ours = from_hf(hf)
    V = config.vocab_size
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, V, (B, T), generator=g)
    targets = torch.randint(0, V, (B, T), generator=g)
    print(f"{shape}: {sum(p.numel() for p in ours.parameters()) / 1e6:.1f}M parameters")
    rows = []

    hf.eval(), ours.eval()
    with torch.no_grad():
        a, b = pair_timings(lambda: ours(idx), lambda: hf(idx), warmup, repeats)
    rows.append(summary(f"forward {B}x{T}", a, b))

    hf.eval(), ours.eval()
    prompt = idx[:1, :PROMPT]
    mask = torch.ones_like(prompt)

    def gen_hf() -> torch.Tensor:
        return hf.generate(
            prompt, attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=0
        )

    for w in weights:

        def gen_ours(w: str = w) -> torch.Tensor:
            return ours.generate(prompt, NEW, temperature=0, weights=w)

        with torch.no_grad():
            same = torch.equal(gen_ours(), gen_hf())
            a, b = pair_timings(gen_ours, gen_hf, 1, gen_repeats)
        name = f"cached greedy, {NEW} tokens" + ("" if w == "float32" else f", {w}")
        row = summary(name, a, b)
        row |= {"gptblock_tok_s": NEW / row["gptblock_s"], "hf_tok_s": NEW / row["hf_s"]}
        row |= {"same_tokens": same, "weights": w}
        print(
            f"  {'':<28} gptblock {row['gptblock_tok_s']:.0f} tok/s, Hugging Face "
            f"{row['hf_tok_s']:.0f} tok/s; the same tokens: {same}"
        )
        rows.append(row)
    # Last: the steps change both models' weights (each by its own rounding).
    hf.train(), ours.train()
    opt_ours = torch.optim.AdamW(ours.parameters(), lr=1e-4)
    opt_hf = torch.optim.AdamW(hf.parameters(), lr=1e-4)
    # HF shifts its labels inside; gptblock takes the next tokens as targets, as its trainer
    # does: the same number of predictions, the same amount of work.
    labels = torch.cat([idx[:, :1], targets[:, :-1]], dim=1)

    def step_ours() -> None:
        _, loss = ours(idx, targets)
        loss.backward()
        opt_ours.step()
        opt_ours.zero_grad(set_to_none=True)

    def step_hf() -> None:
        hf(idx, labels=labels).loss.backward()
        opt_hf.step()
        opt_hf.zero_grad(set_to_none=True)

    a, b = pair_timings(step_ours, step_hf, warmup, repeats)
    rows.append(summary(f"training step {B}x{T}", a, b))

    return [{"shape": shape, **r} for r in rows]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--shapes", nargs="+", choices=tuple(SHAPES), default=list(SHAPES))
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--gen-repeats", type=int, default=5)
    p.add_argument(
        "--weights",
        nargs="+",
        choices=("float32", "bfloat16", "int8"),
        default=["float32", "int8"],
        help="gptblock's weights for generation, each its own row",
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", help="write every number here")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    import transformers

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{args.threads} threads, float32")  # fmt: skip
    rows = []
    for shape in args.shapes:
        reps = args.repeats if shape == "6L" else max(3, args.repeats // 2)
        warmup = args.warmup if shape == "6L" else 1
        rows += bench(shape, warmup, reps, args.gen_repeats, args.weights)
    if args.json:
        Path(args.json).write_text(json.dumps({**vars(args), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
