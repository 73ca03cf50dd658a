"""``gptblock train``: parsing and printing around ``gptblock.train.run.prepare_run``; under
``torchrun`` the same command trains with DDP, only rank 0 writing and printing."""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import typing
from pathlib import Path

import torch

from ..data.text import DEFAULT_CORPUS
from ..runs.checkpoint import BEST, LAST, checkpoint_path
from ..runs.rundir import LOSS_PLOT
from ..sampling import generation_weights
from ..train.presets import DEFAULT_PRESET, PRESETS
from ..train.result import NonFiniteLossError, TrainResult
from ..train.run import GPTRun, prepare_run
from ..train.settings import SETTINGS, RunSettings
from .formatting import add_command, add_threads_option


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = add_command(
        sub,
        "train",
        run,
        description="Train a character-level GPT. With no arguments: the default preset on "
        "Tiny Shakespeare, which ships with gptblock (no download).",
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
    add_setting_options(p)
    p.add_argument("--resume", action="store_true", help="continue the run saved in --out")
    p.add_argument(
        "--allow-other-data",
        action="store_true",
        help="with --resume: continue on a text other than the checkpoint's (by size and "
        "SHA-256), which is otherwise refused",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar (for logs)")
    add_threads_option(p)


def run(args: argparse.Namespace) -> int:
    with prepare_run(
        args.data,
        out_dir=args.out,
        preset=args.preset,
        resume=args.resume,
        allow_other_data=args.allow_other_data,
        progress=not args.no_progress,
        **{name: getattr(args, name) for name in SETTINGS},
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
        # The weights `gptblock sample` chooses by default, so that both print the same text.
        weights = generation_weights("auto", gpt_run.model)
        say(gpt_run.sample(max_new_tokens=400, seed=gpt_run.train_config.seed, weights=weights))
    return 0


def add_setting_options(p: argparse.ArgumentParser) -> None:
    """A flag per ``RunSettings`` field, from its type, help and choices; None (the preset's
    value, which the help lists) by default."""
    types = typing.get_type_hints(RunSettings)
    every = {name: dataclasses.asdict(preset) for name, preset in PRESETS.items()}
    for f in dataclasses.fields(RunSettings):
        values = {preset: settings[f.name] for preset, settings in every.items()}
        if len(set(map(repr, values.values()))) == 1:
            value = next(iter(values.values()))
            shown = "no default" if value is None else f"default: {value}"
        else:
            shown = "preset: " + ", ".join(f"{preset} {v}" for preset, v in values.items())
        flag, kind = "--" + f.name.replace("_", "-"), types[f.name]
        text = f"{f.metadata['help']} ({shown})"
        if kind is bool:
            p.add_argument(flag, action=argparse.BooleanOptionalAction, help=text)
            continue
        if kind in (int | None, float | None):  # an optional number: the number
            kind = typing.get_args(kind)[0]
        p.add_argument(
            flag,
            type=kind,
            choices=f.metadata["choices"] or None,
            metavar="N" if kind is int else "X" if kind is float else None,
            help=text,
        )


def _describe(r: GPTRun, dtype: str) -> str:
    c, t = r.meta.model_config, r.train_config
    n = torch.get_num_threads()
    threads = f", {n} CPU thread{'s' if n != 1 else ''}" if t.device == "cpu" else ""
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
