"""``gptblock train``: train a tiny GPT on a text (by default Tiny Shakespeare, built in).

Argument parsing and printing only; the run is ``gptblock.train.run.prepare_run``, which a user can
call the same way from Python. Under ``torchrun --nproc_per_node=N -m gptblock train ...`` the
same command trains with DistributedDataParallel; only rank 0 writes files and prints.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

from ..data.text import DEFAULT_CORPUS
from ..devices import AUTOCAST_DTYPES
from ..runs.checkpoint import BEST, LAST, checkpoint_path
from ..runs.rundir import LOSS_PLOT
from ..train.config import OPTIMIZERS, SCHEDULES
from ..train.loop import NonFiniteLossError, TrainResult
from ..train.run import DEFAULT_PRESET, PRESETS, GPTRun, prepare_run, preset_settings
from .formatting import HelpFormatter, add_threads_option

# (setting, type, help) for every setting a preset gives; each flag defaults to the preset's.
PRESET_OPTIONS = [
    ("n_layer", int, "number of blocks"),
    ("n_head", int, "attention heads per block"),
    ("n_embd", int, "width of the residual stream (C)"),
    ("block_size", int, "context length (T)"),
    ("dropout", float, "dropout probability"),
    ("batch_size", int, "sequences per step, all processes together"),
    ("max_iters", int, "optimizer steps"),
    ("lr", float, "peak learning rate (AdamW's; the embeddings', norms' and biases' with Muon)"),
    ("min_lr_ratio", float, "the schedule ends at lr * this"),
    ("warmup", int, "linear warmup steps"),
    ("schedule", str, "after the warmup: cosine, or wsd (flat, then a linear decay)"),
    ("decay_fraction", float, "wsd: the last fraction of the run that decays"),
    ("optimizer", str, "adamw, or muon (Muon for the blocks' matrices, AdamW for the rest)"),
    ("muon_lr", float, "Muon's peak learning rate"),
    ("weight_decay", float, "AdamW's weight decay, on matrices and embeddings"),
    ("beta2", float, "AdamW's second-moment decay"),
    ("eval_interval", int, "steps between loss estimates and checkpoints"),
    ("eval_iters", int, "batches per loss estimate"),
    ("dtype", str, "float32, an autocast dtype, or auto: bfloat16 where the device has it"),
]
CHOICES = {"schedule": SCHEDULES, "optimizer": OPTIMIZERS, "dtype": ("auto", *AUTOCAST_DTYPES)}


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "train",
        help="train a tiny GPT on a text (default: Tiny Shakespeare, built in), then sample",
        description="Train a character-level GPT. With no arguments: the default preset on "
        "Tiny Shakespeare, which ships with gptblock (no download).",
        formatter_class=HelpFormatter,
    )
    p.add_argument(
        "--data",
        metavar="NAME|FILE",
        default=DEFAULT_CORPUS,
        help="a built-in corpus (shakespeare: Tiny Shakespeare; pydoc: Python's help pages) "
        "or the path of a UTF-8 text file",
    )
    p.add_argument("--out", default="out-gptblock", help="directory for checkpoints and loss.png")
    p.add_argument(
        "--preset", choices=tuple(PRESETS), default=DEFAULT_PRESET, help="model and run size"
    )
    every = {preset: preset_settings(preset) for preset in PRESETS}
    for name, kind, text in PRESET_OPTIONS:
        shown = ", ".join(f"{preset} {values[name]}" for preset, values in every.items())
        p.add_argument(
            "--" + name.replace("_", "-"),
            type=kind,
            choices=CHOICES.get(name),
            metavar="N" if kind is int else "X" if kind is float else None,
            help=f"{text} (preset: {shown})",
        )
    p.add_argument(
        "--tokenizer",
        choices=("char", "bpe"),
        default="char",
        help="char: a token per character; bpe: byte-level BPE learnt from the training part "
        "of the text (never the validation part), --vocab-size tokens",
    )
    p.add_argument("--vocab-size", type=int, metavar="N", help="BPE's vocabulary (>= 256)")
    p.add_argument("--seed", type=int, default=1337, help="seed for weights, batches, dropout")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N, mps, or auto")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--resume", action="store_true", help="continue the run saved in --out")
    p.add_argument(
        "--allow-other-data",
        action="store_true",
        help="with --resume: continue on a text other than the checkpoint's (by size and "
        "SHA-256), which is otherwise refused",
    )
    p.add_argument(
        "--no-progress", action="store_true", help="no progress bar (for logs and scripts)"
    )
    add_threads_option(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    overrides = {name: getattr(args, name) for name, _, _ in PRESET_OPTIONS}
    with prepare_run(
        args.data,
        out_dir=args.out,
        preset=args.preset,
        resume=args.resume,
        allow_other_data=args.allow_other_data,
        seed=args.seed,
        device=args.device,
        compile=args.compile,
        progress=not args.no_progress,
        tokenizer=args.tokenizer,
        vocab_size=args.vocab_size,
        **overrides,
    ) as gpt_run:
        say = print if gpt_run.dist.is_main else _quiet
        say(_describe(gpt_run, gpt_run.train_config.dtype), flush=True)
        try:
            result = gpt_run.fit()
        except NonFiniteLossError as e:
            say(f"gptblock train: error: {e}", file=sys.stderr)
            return 1  # the run failed
        if result.interrupted:
            say(
                f"gptblock train: interrupted at step {result.step}; saved {result.checkpoint}. "
                f"Continue with the same command and --resume.",
                file=sys.stderr,
            )
            return 130  # stopped by Ctrl-C, as a shell reports SIGINT
        say(_summary(gpt_run, result, args.out), flush=True)
        say(gpt_run.sample(max_new_tokens=400, seed=args.seed))
    return 0


def _describe(r: GPTRun, dtype: str) -> str:
    c, t = r.meta.model_config, r.train_config
    threads = f", {torch.get_num_threads()} CPU threads" if t.device == "cpu" else ""
    return (
        f"{'resuming' if r.resume else 'training'} a GPT of "
        f"{r.model.num_params() / 1e6:.2f}M parameters (n_layer={c.n_layer}, n_head={c.n_head}, "
        f"n_embd={c.n_embd}, block_size={c.block_size}, dropout={c.dropout})\n"
        f"data: {r.corpus.source}: {r.corpus.characters:,} characters, "
        f"{_vocabulary(r)}; "
        f"{len(r.splits.train):,} train / {len(r.splits.val):,} validation tokens\n"
        f"run: {t.max_iters} steps of {t.batch_size} x {t.block_size} tokens on "
        f"{r.dist.world_size} x {t.device} ({dtype}{threads}); checkpoints in "
        f"{r.trainer.out_dir}/"
    )


def _vocabulary(r: GPTRun) -> str:
    if r.tokenizer.kind == "char":
        return f"{r.tokenizer.vocab_size} distinct"
    return f"byte-level BPE of {r.tokenizer.vocab_size} tokens, learnt from the training part"


def _summary(r: GPTRun, result: TrainResult, out: str) -> str:
    loss = result.val_loss or 0.0
    per_char = r.per_character(loss)
    return (
        f"step {result.step}: validation loss {loss:.4f} per token over the whole "
        f"validation split ({len(r.splits.val) - 1:,} tokens, {r.val_characters:,} characters): "
        f"{per_char:.4f} nats = {per_char / math.log(2):.4f} bits per character; best estimate "
        f"{result.best_val_loss:.4f}\n"
        f"saved {checkpoint_path(out, LAST)}, {checkpoint_path(out, BEST)} and "
        f"{Path(out) / LOSS_PLOT}\n"
        f"--- sample (gptblock sample --out {out} for more) ---"
    )


def _quiet(*args: object, **kwargs: object) -> None:
    pass
