"""``TrainConfig`` and what follows from it alone: the learning-rate schedule and the optimizer."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from ..blocks.config import check_choices, check_positive_int, check_seed, option
from ..devices import AUTOCAST_DTYPES
from ..errors import UserTypeError, UserValueError
from .muon import MuonAdamW

__all__ = ["OPTIMIZERS", "SCHEDULES", "TrainConfig", "configure_optimizer", "lr_at"]

OPTIMIZERS = ("adamw", "muon")
SCHEDULES = ("cosine", "wsd")


MUON = ("optimizer", "muon")  # what Muon's own settings act with
MAX_LR = 10.0  # a peak learning rate above this is a typo, not a schedule


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """How to train: each field's ``help`` (``gptblock train --help``); nanoGPT's defaults.

    Example:
        >>> TrainConfig(max_iters=100, warmup=10).min_lr
        0.0001
        >>> TrainConfig(dtype="float64")
        Traceback (most recent call last):
        ...
        gptblock.errors.UserValueError: dtype must be one of ('float32', 'bfloat16', 'float16'), got 'float64'
    """

    block_size: int = option(64, "context length (T): tokens per training window")
    batch_size: int = option(32, "sequences per step, all processes together")
    max_iters: int = option(1000, "optimizer steps in the whole run")
    lr: float = option(
        1e-3,
        "peak learning rate (AdamW's; the embeddings', norms' and biases' with Muon)",
        # AdamW and Muon move each weight by about lr per step, so a larger one can only
        # diverge; far larger, AdamW's float32 step arithmetic overflows mid-step.
        within=f"(0, {MAX_LR:g}]",
    )
    min_lr_ratio: float = option(0.1, "the schedule ends at lr * this", within="[0, 1]")
    warmup: int = option(100, "steps of linear warmup from ~0 to lr")
    weight_decay: float = option(
        0.1, "AdamW's weight decay, on matrices and embeddings", within="[0, inf)"
    )
    # A moment that never decays (beta 1) is no average.
    beta1: float = option(0.9, "AdamW's first-moment decay", within="[0, 1)")
    beta2: float = option(
        0.99, "AdamW's second-moment decay (0.99 suits small batches)", within="[0, 1)"
    )
    grad_clip: float = option(
        1.0, "clip the global gradient norm to this (0: no clipping)", within="[0, inf)"
    )
    eval_interval: int = option(100, "steps between loss estimates and checkpoints")
    eval_iters: int = option(20, "batches per loss estimate")
    log_interval: int = option(10, "steps between reads of the loss (progress, NaN check)")
    seed: int = option(1337, "seed for weights, batches, dropout")
    device: str = option("cpu", "cpu, cuda, cuda:N, mps, ...")
    dtype: str = option(
        "float32", "autocast dtype: float32 (none), bfloat16 or float16", AUTOCAST_DTYPES
    )
    compile: bool = option(False, "torch.compile the model")
    optimizer: str = option(
        "adamw", "adamw, or muon (Muon for the blocks' matrices, AdamW for the rest)", OPTIMIZERS
    )
    muon_lr: float = option(
        0.02,
        "Muon's peak learning rate, on the same schedule as lr",
        within=f"(0, {MAX_LR:g}]",
        acts_with=MUON,
    )
    muon_momentum: float = option(
        0.95, "Muon's (Nesterov) momentum", within="[0, 1)", acts_with=MUON
    )
    schedule: str = option(
        "cosine", "after the warmup: cosine, or wsd (flat, then a linear decay)", SCHEDULES
    )
    decay_fraction: float = option(
        0.2,
        "wsd: the last fraction of the run that decays",
        within="(0, 1]",
        acts_with=("schedule", "wsd"),
    )

    def __post_init__(self) -> None:
        for name in ("block_size", "batch_size", "max_iters", "eval_interval", "eval_iters"):
            check_positive_int(name, getattr(self, name))
        check_positive_int("log_interval", self.log_interval)
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise UserValueError(f"warmup must be an int >= 0, got {self.warmup!r}")
        check_seed(self.seed)
        if not isinstance(self.device, str) or not self.device:
            raise UserTypeError(
                f"device must be a string such as 'cpu' or 'cuda', got {self.device!r}"
            )
        check_choices(self)  # the words and the numbers' intervals of the fields
        if not isinstance(self.compile, bool):
            raise UserTypeError(f"compile must be a bool, got {self.compile!r}")

    @property
    def min_lr(self) -> float:
        """The learning rate the cosine ends at."""
        return self.lr * self.min_lr_ratio


def lr_at(step: int, cfg: TrainConfig) -> float:
    """The learning rate after ``step`` updates: linear warmup, then a half cosine (nanoGPT's)
    or, with "wsd", flat until the last ``decay_fraction``, then linear, to ``min_lr``.

    Example:
        >>> cfg = TrainConfig(lr=1.0, min_lr_ratio=0.1, warmup=10, max_iters=110)
        >>> [round(lr_at(s, cfg), 3) for s in (0, 9, 10, 60, 110)]
        [0.1, 1.0, 1.0, 0.55, 0.1]
        >>> wsd = TrainConfig(lr=1.0, min_lr_ratio=0.0, warmup=10, max_iters=110,
        ...                   schedule="wsd", decay_fraction=0.5)
        >>> [round(lr_at(s, wsd), 3) for s in (9, 55, 60, 85, 110)]
        [1.0, 1.0, 1.0, 0.5, 0.0]
    """
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    if step >= cfg.max_iters:
        return cfg.min_lr
    if cfg.schedule == "wsd":
        decay_start = cfg.max_iters - cfg.decay_fraction * (cfg.max_iters - cfg.warmup)
        if step < decay_start:
            return cfg.lr
        remaining = (cfg.max_iters - step) / (cfg.max_iters - decay_start)  # 1 -> 0
        return cfg.min_lr + remaining * (cfg.lr - cfg.min_lr)
    progress = (step - cfg.warmup) / max(1, cfg.max_iters - cfg.warmup)  # 0 -> 1
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.lr - cfg.min_lr)


def configure_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """The optimizer ``cfg.optimizer`` names, over ``model``'s parameters in groups.

    AdamW decays only parameters of 2 or more dimensions (decaying a gain shrinks the signal).
    With "muon", Muon takes every 2-D weight but the embeddings and the head (``lm_head`` or
    ``head``); each group's ``lr_scale`` is its peak over ``cfg.lr``.

    Example:
        >>> opt = configure_optimizer(nn.Linear(3, 2), TrainConfig())
        >>> [(len(g["params"]), g["weight_decay"]) for g in opt.param_groups]
        [(1, 0.1), (1, 0.0)]
        >>> m = nn.Sequential(nn.Embedding(5, 4), nn.Linear(4, 4), nn.LayerNorm(4))
        >>> opt = configure_optimizer(m, TrainConfig(optimizer="muon"))
        >>> [(g["algorithm"], len(g["params"]), g["lr_scale"]) for g in opt.param_groups]
        [('muon', 1, 20.0), ('adamw', 1, 1.0), ('adamw', 3, 1.0)]
    """
    hidden: list[tuple[str, nn.Parameter]] = []
    if cfg.optimizer == "muon":
        embeddings = {
            id(m.weight) for m in model.modules() if isinstance(m, (nn.Embedding, nn.EmbeddingBag))
        }
        hidden = [
            (n, p)
            for n, p in model.named_parameters()
            if p.requires_grad
            and p.dim() == 2
            and id(p) not in embeddings
            and n.split(".")[0] not in ("lm_head", "head")
        ]
    taken = {id(p) for _, p in hidden}
    params = [p for p in model.parameters() if p.requires_grad and id(p) not in taken]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups: list[dict[str, Any]] = [
        {"params": decay, "weight_decay": cfg.weight_decay, "lr_scale": 1.0},
        {"params": no_decay, "weight_decay": 0.0, "lr_scale": 1.0},
    ]
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))
    for g in groups:
        g |= {"algorithm": "adamw", "lr": cfg.lr, "betas": (cfg.beta1, cfg.beta2)}
    scale = cfg.muon_lr / cfg.lr
    muon = [
        {
            "params": [p],
            "algorithm": "muon",
            "lr": cfg.muon_lr,
            "lr_scale": scale,
            "momentum": cfg.muon_momentum,
            # q, k and v apart; grouped-query attention's k and v are narrower than q, so its
            # packed projection is orthogonalised whole (a simplification, see issue 20).
            "split": 3 if name.endswith("in_proj_weight") and p.shape[0] == 3 * p.shape[1] else 1,
            # Training in bfloat16 already trusts bfloat16's matmuls: so does the iteration.
            "ns_dtype": "bfloat16" if cfg.dtype == "bfloat16" else "float32",
        }
        for name, p in hidden
    ]
    merged = _merge_muon_groups(muon)
    return MuonAdamW([g for g in [*merged, *groups] if g["params"]])


def _merge_muon_groups(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # One group per split, so the optimizer's groups stay few and its checkpoint layout small.
    by_split: dict[int, dict[str, Any]] = {}
    for g in groups:
        if g["split"] in by_split:
            by_split[g["split"]]["params"].extend(g["params"])
        else:
            by_split[g["split"]] = {**g, "params": list(g["params"])}
    return [by_split[s] for s in sorted(by_split)]
