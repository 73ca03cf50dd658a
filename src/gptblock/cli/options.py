"""Where ``sample`` and ``inspect`` read a model from: ``--out`` (a run, the default), ``--hf``
or ``--nanogpt``, through ``gptblock.loading.load``, onto ``--device``."""

from __future__ import annotations

import argparse

from ..data.batches import Tokenizer
from ..errors import UserValueError
from ..loading import Source, load
from ..model.gpt import GPT

__all__ = ["add_source_options", "load_source"]


def add_source_options(p: argparse.ArgumentParser) -> None:
    """``--out`` / ``--hf`` / ``--nanogpt`` (at most one given) and ``--device``."""
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--out", default="out-gptblock", help="the directory `gptblock train --out` wrote"
    )
    group.add_argument(
        "--hf",
        metavar="DIR",
        help="instead of --out: a Hugging Face GPT-2, Llama, Mistral or Qwen2 directory "
        "(save_pretrained's, with its tokenizer), read offline",
    )
    group.add_argument(
        "--nanogpt",
        metavar="CKPT",
        help="instead of --out: a nanoGPT ckpt.pt (or its out_dir) with the meta.pkl of its "
        "character vocabulary beside it; nothing in either file is run",
    )
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N, mps, or auto")


def load_source(args: argparse.Namespace) -> tuple[GPT, Tokenizer, Source]:
    """The model, tokenizer and source the options name; a tokenizer is required."""
    other = args.hf is not None or args.nanogpt is not None
    model, tokenizer, source = load(
        None if other else args.out, hf=args.hf, nanogpt=args.nanogpt, device=args.device
    )
    if tokenizer is None:
        raise UserValueError(
            f"{source.path}: no meta.pkl beside it, so its vocabulary is unknown (gptblock reads "
            f"nanoGPT's character vocabularies; a GPT-2 BPE run is read by --hf)"
        )
    return model, tokenizer, source
