"""The presets of a GPT run, by name: each a ``RunSettings`` that any given setting replaces."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import UserValueError
from .settings import RunSettings

__all__ = ["DEFAULT_PRESET", "PRESETS", "preset_settings"]

# The default: benchmarks/speedrun.py's winner (see benchmarks/LOG.md). Muon, a large batch of
# short windows and a warmup-stable-decay schedule reach nanoGPT's CPU loss in a fraction of
# nanoGPT-cpu's time. The other CPU presets are it with what they change.
_CPU = RunSettings(
    n_layer=3,
    n_head=4,
    n_embd=128,
    block_size=32,
    dropout=0.0,
    batch_size=128,
    max_iters=150,
    lr=5e-3,
    min_lr_ratio=0.0,
    warmup=10,
    schedule="wsd",
    decay_fraction=0.5,
    optimizer="muon",
    muon_lr=0.04,
    dtype="auto",  # bfloat16 where the CPU has it: 2x faster steps, the same loss
    eval_interval=50,
    eval_iters=10,
)

_NANOGPT_CPU = RunSettings(
    n_layer=4, n_head=4, n_embd=128, block_size=64, dropout=0.0, batch_size=12, max_iters=2000,
    lr=1e-3, min_lr_ratio=0.1, warmup=100, eval_interval=250, eval_iters=20,
)  # fmt: skip

PRESETS: dict[str, RunSettings] = {
    "shakespeare-cpu": _CPU,
    # Track 1's record (benchmarks/LOG.md, "The record"): the modern block's rotary positions,
    # qk-norm and RMSNorm, the bigram embedding, and Muon's momentum and AdamW's peak retuned
    # for a run this short. Each step costs more than shakespeare-cpu's, but it needs far
    # fewer. Not a Hugging Face format (the bigram table).
    "shakespeare-cpu-modern": _CPU.replace(
        {
            "norm": "rmsnorm",
            "position": "rope",
            "rope_theta": 100.0,  # a context of 32 wants faster angles: 1.857 against 1.862
            "qk_norm": True,
            "bigram": True,
            "max_iters": 63,  # seeds 1-6 at or below 1.88 (60 steps: seeds 4 and 6 are not)
            "lr": 8e-3,
            "muon_momentum": 0.8,  # with rope_theta 100: 1.849-1.855 at 65 steps (0.85: 1.852-1.862)
            "eval_interval": 63,
        }
    ),
    # Track 2 of the speedrun (benchmarks/LOG.md): the lowest whole-validation loss in the
    # time nanoGPT-cpu takes (about 60 s on two cores). speedrun.py --budget plans the steps by
    # the clock; max_iters is about what fits in 50 s of a quiet 2-core machine.
    "shakespeare-cpu-long": _CPU.replace(
        {
            "block_size": 64,  # longer windows: every scored character has more context
            "batch_size": 64,  # the same 4096 tokens a step as shakespeare-cpu
            "max_iters": 890,
            "lr": 3e-3,  # lower peaks than shakespeare-cpu's 150 steps want (1.554 against 1.561)
            "muon_lr": 0.025,
            "muon_momentum": 0.85,  # 1.542 against 0.95's 1.554 at 890 steps (seed 1)
            "eval_interval": 250,
        }
    ),
    # nanoGPT's README CPU recipe ("gets us a loss of only 1.88"): speedrun.py's baseline.
    "nanogpt-cpu": _NANOGPT_CPU,
    # The main job of gptblock 0.1 (on Python's help pages: 72 s, validation loss 1.36).
    "tiny": _NANOGPT_CPU.replace({"batch_size": 16, "lr": 2e-3, "max_iters": 1500}),
    # nanoGPT's shakespeare_char: a GPU job (about 10M parameters).
    "shakespeare": _NANOGPT_CPU.replace(
        {
            "n_layer": 6,
            "n_head": 6,
            "n_embd": 384,
            "block_size": 256,
            "dropout": 0.2,
            "batch_size": 64,
            "max_iters": 5000,
            "eval_iters": 200,
        }
    ),
}
DEFAULT_PRESET = "shakespeare-cpu"


def preset_settings(preset: str, overrides: Mapping[str, Any] | None = None) -> RunSettings:
    """The settings of ``preset``, with every override that is not None put over them.

    Example:
        >>> preset_settings("tiny", {"n_layer": 2, "lr": None}).n_layer
        2
        >>> preset_settings("tiny").optimizer, preset_settings("shakespeare-cpu").optimizer
        ('adamw', 'muon')
        >>> preset_settings("huge")
        Traceback (most recent call last):
        ...
        gptblock.errors.UserValueError: preset must be one of ('shakespeare-cpu', 'shakespeare-cpu-modern', 'shakespeare-cpu-long', 'nanogpt-cpu', 'tiny', 'shakespeare'), got 'huge'
    """
    if preset not in PRESETS:
        raise UserValueError(f"preset must be one of {tuple(PRESETS)}, got {preset!r}")
    return PRESETS[preset].replace(overrides or {})
