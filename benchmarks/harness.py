"""What the benchmark scripts share: ``NAME=VALUE`` settings, a trainer built from a preset, an
old revision of gptblock imported beside this one, and timers that alternate what they compare.

The scripts import it as their sibling (``python benchmarks/SCRIPT.py`` puts benchmarks/ first on
``sys.path``). Alternating in one process, the order rotating each round, lets a change in the
machine's load hit every variant alike; the ratios of one round hold better than the times.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from gptblock import GPT, CharTokenizer, Trainer
from gptblock.data.batches import split_tokens
from gptblock.data.text import shakespeare
from gptblock.devices import resolve_dtype
from gptblock.errors import UserValueError
from gptblock.train.presets import preset_settings

ROOT = Path(__file__).resolve().parents[1]


def parse_settings(items: list[str], flag: str = "--set") -> dict[str, Any]:
    """``NAME=VALUE`` items (of ``flag``) as settings: Python literals (True, 1e-3, 4), else the
    word itself.

    Example:
        >>> parse_settings(["n_layer=4", "norm=rmsnorm", "qk_norm=True"])
        {'n_layer': 4, 'norm': 'rmsnorm', 'qk_norm': True}
    """
    out: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.isidentifier():
            raise UserValueError(f"{flag} expects NAME=VALUE (e.g. norm=rmsnorm), got {item!r}")
        try:
            out[name] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[name] = value  # a word: rope, rmsnorm, bfloat16
        if out[name] is None:  # the settings read None as "not given": it would be dropped
            raise UserValueError(
                f"{flag} {item}: None means 'keep the preset's value' here; leave it out, or "
                f"give a value"
            )
    return out


def export_src(rev: str, into: Path) -> Path:
    """The ``src`` directory of git revision ``rev``, written under ``into``."""
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "src"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "src"


def import_old(rev: str, into: Path) -> ModuleType:
    """``rev``'s gptblock package, imported as ``gptblock_old`` beside this one (its imports
    are relative, so the copy imports itself)."""
    (export_src(rev, into) / "gptblock").rename(into / "gptblock_old")
    sys.path.insert(0, str(into))
    return importlib.import_module("gptblock_old")


def build_trainer(
    preset: str,
    overrides: dict[str, Any] | None = None,
    dtype: str | None = None,
    pkg: ModuleType | None = None,
) -> Trainer:
    """The preset's GPT (seed 0) and its trainer on Tiny Shakespeare, with ``overrides`` over
    the preset's settings, on the CPU, never evaluating (``pkg``: another copy of gptblock)."""
    s = preset_settings(preset, {"dtype": dtype, **(overrides or {})})
    text = shakespeare()
    tok = CharTokenizer.from_text(text)
    split = split_tokens
    if pkg is not None:  # the old copy's trainer checks its data's class
        split = importlib.import_module(pkg.__name__ + ".data.batches").split_tokens
    splits = split(tok.encode(text), s.block_size)
    torch.manual_seed(0)
    config = s.model_config(tok.vocab_size)
    train = s.train_config(
        max_iters=10**6, eval_interval=10**6, device="cpu", dtype=resolve_dtype(s.dtype, "cpu")
    )
    if pkg is None:
        return Trainer(GPT(config), splits, train, progress=False)
    # The same settings, as the old copy's own config classes.
    old_train = importlib.import_module(pkg.__name__ + ".train.config").TrainConfig(**vars(train))
    model = pkg.GPT(pkg.GPTConfig(**vars(config)))
    return pkg.Trainer(model, splits, old_train, progress=False)  # type: ignore[no-any-return]


def alternate(
    calls: dict[str, Callable[[], object]],
    rounds: int,
    clock: Callable[[], float] = time.perf_counter,
    warmup: int = 0,
) -> dict[str, list[float]]:
    """Seconds of ``clock`` each of ``calls`` took, one call each per round, the order rotating
    each round (round r starts with the r-th), after ``warmup`` untimed calls of each.

    Example:
        >>> times = alternate({"a": lambda: None, "b": lambda: None}, rounds=3)
        >>> [len(t) for t in times.values()]
        [3, 3]
    """
    for _ in range(warmup):
        for call in calls.values():
            call()
    names = list(calls)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = clock()
            calls[name]()
            times[name].append(clock() - start)
    return times
