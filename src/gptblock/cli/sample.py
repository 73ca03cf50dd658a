"""``gptblock sample``: text from a run's best checkpoint, printed as generated (Ctrl-C: 130)."""

from __future__ import annotations

import argparse
import sys

from ..model.generation.sampling import refuse_top_k_when_greedy
from ..sampling import GENERATION_WEIGHTS, generation_weights, stream_text
from .formatting import add_command, add_threads_option
from .options import add_source_options, load_source


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = add_command(
        sub,
        "sample",
        run,
        description="Load the best checkpoint of a `gptblock train` run (or a Hugging Face "
        "GPT-2 directory, or a nanoGPT checkpoint) and continue a prompt.",
    )
    add_source_options(p)
    p.add_argument("--prompt", help="text to continue (default: a newline)")
    p.add_argument("--max-new-tokens", type=int, default=500, help="characters to generate")
    p.add_argument(
        "--temperature",
        type=float,
        default=0.8,
        help="sampling temperature; 0 = greedy (so is one so small it overflows, 1e-45)",
    )
    p.add_argument("--top-k", type=int, help="sample among the k likeliest only (default: all)")
    p.add_argument("--seed", type=int, default=1337, help="same seed, same text")
    p.add_argument(
        "--weights",
        choices=GENERATION_WEIGHTS,
        default="auto",
        help="the weights' form while generating: int8 (a scale per output row) or bfloat16 "
        "copies read faster than float32; auto: int8 for a model of 1M weights or more on a CPU "
        "with bfloat16 in hardware, else float32 (docs/performance.md)",
    )
    add_threads_option(p)


def run(args: argparse.Namespace) -> int:
    refuse_top_k_when_greedy(args.temperature, args.top_k)  # before the run is loaded
    model, tokenizer, _ = load_source(args)
    weights = generation_weights(args.weights, model)
    pieces = stream_text(
        model,
        tokenizer,
        args.prompt,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        seed=args.seed,
        weights=weights,
    )
    try:
        for piece in pieces:
            sys.stdout.write(piece)
            sys.stdout.flush()
    finally:
        print(flush=True)  # end the line, also when Ctrl-C stops the text midway
    return 0
