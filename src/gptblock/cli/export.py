"""``gptblock export``: a ``gptblock train`` run as a Hugging Face directory (``save_hf``), which
``gptblock sample --hf DIR`` and transformers' ``from_pretrained`` read back."""

from __future__ import annotations

import argparse

from ..interop.hf import FORMATS, save_hf
from ..interop.hf_files import family_name
from ..loading import load_gpt
from ..runs.checkpoint import BEST, KINDS
from .formatting import add_command


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = add_command(
        sub,
        "export",
        run,
        description="Write the best checkpoint of a `gptblock train` run as a Hugging Face "
        "directory with its tokenizer (character-level or BPE); a run whose options the "
        "format cannot express is refused, naming the option, and nothing is written.",
    )
    p.add_argument("--out", default="out-gptblock", help="the directory `gptblock train` wrote")
    p.add_argument("--hf", metavar="DIR", required=True, help="the new directory to write")
    p.add_argument("--checkpoint", choices=KINDS, default=BEST, help="which checkpoint")
    p.add_argument(
        "--family",
        choices=FORMATS,
        help="the format (default: llama for a Llama block, else gpt2)",
    )


def run(args: argparse.Namespace) -> int:
    model, tokenizer, ckpt = load_gpt(args.out, args.checkpoint)
    directory = save_hf(model, args.hf, tokenizer, family=args.family)
    print(
        f"wrote {directory}: Hugging Face {family_name(directory)}, {tokenizer.kind} tokenizer "
        f"of {tokenizer.vocab_size} tokens, from {ckpt.path} (step {ckpt.meta['step']})"
    )
    return 0
