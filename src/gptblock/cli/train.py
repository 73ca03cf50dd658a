"""``gptblock train``: train a tiny GPT on a text (by default, Python's own help pages).

Argument parsing and printing only; the work is ``gptblock.data``, ``GPT`` and
``gptblock.train.Trainer``, which a user can call the same way from Python. Under
``torchrun --nproc_per_node=N -m gptblock train ...`` the same command trains with
DistributedDataParallel; only rank 0 writes files and prints.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

import torch

from ..checkpoint import checkpoint_path
from ..config import GPTConfig
from ..data import CharTokenizer, default_corpus, read_text, split_tokens
from ..distributed import finish_distributed, init_distributed
from ..gpt import GPT
from ..recipe import DTYPES, TrainConfig, resolve_device
from ..train import NonFiniteLossError, Trainer
from .sample import HelpFormatter, sample_text

# Each preset sets every option below that defaults to None; explicit flags override it.
PRESETS: dict[str, dict[str, Any]] = {
    # 72 s on a quiet 2-core CPU (validation loss 1.36); its samples are English-like words.
    "tiny": dict(
        n_layer=4,
        n_head=4,
        n_embd=128,
        block_size=64,
        dropout=0.0,
        batch_size=16,
        lr=2e-3,
        max_iters=1500,
        warmup=100,
        eval_interval=250,
        eval_iters=20,
    ),
    # nanoGPT's shakespeare_char: a GPU job (about 10M parameters).
    "shakespeare": dict(
        n_layer=6,
        n_head=6,
        n_embd=384,
        block_size=256,
        dropout=0.2,
        batch_size=64,
        lr=1e-3,
        max_iters=5000,
        warmup=100,
        eval_interval=250,
        eval_iters=200,
    ),
}

# (flag, type, help) for the options a preset sets.
PRESET_OPTIONS = [
    ("n_layer", int, "number of blocks"),
    ("n_head", int, "attention heads per block"),
    ("n_embd", int, "width of the residual stream (C)"),
    ("block_size", int, "context length (T)"),
    ("dropout", float, "dropout probability"),
    ("batch_size", int, "sequences per step, all processes together"),
    ("lr", float, "peak learning rate (AdamW)"),
    ("max_iters", int, "optimizer steps"),
    ("warmup", int, "linear warmup steps before the cosine decay"),
    ("eval_interval", int, "steps between loss estimates and checkpoints"),
    ("eval_iters", int, "batches per loss estimate"),
]
MODEL_FIELDS = ("n_layer", "n_head", "n_embd", "block_size", "dropout")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "train",
        help="train a tiny GPT on a text file (default: Python's help pages), then sample",
        description="Train a character-level GPT. With no arguments: the tiny preset on "
        "Python's own help pages (pydoc_data), about three minutes on a 2-core CPU.",
        formatter_class=HelpFormatter,
    )
    p.add_argument(
        "--data",
        metavar="FILE",
        help="a UTF-8 text file (default: Python's pydoc_data help topics, no download)",
    )
    p.add_argument("--out", default="out-gptblock", help="directory for checkpoints and loss.png")
    p.add_argument("--preset", choices=tuple(PRESETS), default="tiny", help="model and run size")
    for name, kind, text in PRESET_OPTIONS:
        shown = ", ".join(f"{preset} {values[name]}" for preset, values in PRESETS.items())
        p.add_argument(
            "--" + name.replace("_", "-"),
            type=kind,
            metavar="N" if kind is int else "X",
            help=f"{text} (preset: {shown})",
        )
    p.add_argument("--seed", type=int, default=1337, help="seed for weights, batches, dropout")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N, mps, or auto")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="float32", help="autocast dtype")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--resume", action="store_true", help="continue the run saved in --out")
    p.add_argument(
        "--no-progress", action="store_true", help="no progress bar (for logs and scripts)"
    )
    p.set_defaults(run=run)


def resolve(args: argparse.Namespace) -> dict[str, Any]:
    """The preset's values with every explicitly given flag put over them."""
    settings = dict(PRESETS[args.preset])
    for name, _, _ in PRESET_OPTIONS:
        if getattr(args, name) is not None:
            settings[name] = getattr(args, name)
    return settings


def run(args: argparse.Namespace) -> int:
    s = resolve(args)
    out = Path(args.out)
    # Checked before any process joins the group, so no rank can see rank 0's first save.
    if not args.resume and checkpoint_path(out, "last").exists():
        # Never overwrite a run by accident.
        raise FileExistsError(
            f"{out} already holds a training run; pass --resume to continue it, or choose "
            f"another --out (or delete {out})"
        )
    text = read_text(args.data) if args.data else default_corpus()
    source = args.data or "pydoc_data.topics (Python's help pages)"
    tokenizer = CharTokenizer.from_text(text)
    splits = split_tokens(tokenizer.encode(text), s["block_size"])
    model_config = GPTConfig(tokenizer.vocab_size, **{k: s[k] for k in MODEL_FIELDS})
    train_config = TrainConfig(
        **{k: v for k, v in s.items() if k not in MODEL_FIELDS or k == "block_size"},
        seed=args.seed,
        device=resolve_device(args.device),
        dtype=args.dtype,
        compile=args.compile,
    )
    dist, device = init_distributed(train_config.device)
    try:
        train_config = dataclasses.replace(train_config, device=device)
        torch.manual_seed(args.seed)
        model = GPT(model_config)
        meta = {
            "model_config": dataclasses.asdict(model_config),
            "vocab": tokenizer.to_json(),
            "data": {"source": source, "characters": len(text)},
        }
        trainer = Trainer(
            model, splits, train_config, out_dir=out, meta=meta, progress=not args.no_progress
        )
        say = print if dist.is_main else _quiet
        c = model_config
        say(
            f"{'resuming' if args.resume else 'training'} a GPT of "
            f"{model.num_params() / 1e6:.2f}M parameters (n_layer={c.n_layer}, n_head={c.n_head}, "
            f"n_embd={c.n_embd}, block_size={c.block_size}, dropout={c.dropout})\n"
            f"data: {source}: {len(text):,} characters, {tokenizer.vocab_size} distinct; "
            f"{len(splits.train):,} train / {len(splits.val):,} validation tokens\n"
            f"run: {train_config.max_iters} steps of {train_config.batch_size} x "
            f"{train_config.block_size} tokens on {dist.world_size} x {device} ({args.dtype}); "
            f"checkpoints in {out}/",
            flush=True,
        )
        try:
            result = trainer.fit(resume=args.resume)
        except NonFiniteLossError as e:
            result = None
            say(f"gptblock train: error: {e}", file=sys.stderr)
        if result is not None and result.interrupted:
            say(
                f"gptblock train: interrupted at step {result.step}; saved {result.checkpoint}. "
                f"Continue with the same command and --resume.",
                file=sys.stderr,
            )
        elif result is not None:
            say(
                f"step {result.step}: validation loss {result.val_loss:.4f} over the whole "
                f"validation split ({len(splits.val) - 1:,} tokens); best estimate "
                f"{result.best_val_loss:.4f}\n"
                f"saved {out / 'last.json'}, {out / 'best.json'} and {out / 'loss.png'}\n"
                f"--- sample (gptblock sample --out {out} for more) ---",
                flush=True,
            )
            if dist.is_main:
                say(sample_text(model, tokenizer, max_new_tokens=400, seed=args.seed))
    except BaseException:
        finish_distributed(wait=False)
        raise
    finish_distributed()
    # 1: the run failed (a non-finite loss); 130: stopped by Ctrl-C, as a shell reports SIGINT.
    return 1 if result is None else 130 if result.interrupted else 0


def _quiet(*args: object, **kwargs: object) -> None:
    pass
