"""``TrainConfig`` and what follows from it alone: the learning-rate schedule and AdamW's groups.

Pure functions of the configuration, apart from the loop in ``train.py``, so each can be
checked on its own (the schedule against its formula, the optimizer's groups against the
parameters' shapes). Where to run (device, dtype, autocast) is ``gptblock.devices``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from .config import check_positive_int, check_seed
from .devices import AUTOCAST_DTYPES
from .errors import UserTypeError, UserValueError

__all__ = ["TrainConfig", "configure_optimizer", "lr_at"]


@dataclass(frozen=True)
class TrainConfig:
    """How to train: batches, optimizer, schedule, evaluation and where to run.

    Defaults follow nanoGPT's ``shakespeare_char`` where it has one.

    Example:
        >>> TrainConfig(max_iters=100, warmup=10).min_lr
        0.0001
        >>> TrainConfig(dtype="float64")
        Traceback (most recent call last):
        ...
        gptblock.errors.UserValueError: dtype must be one of ('float32', 'bfloat16', 'float16'), got 'float64'
    """

    block_size: int = 64  # T: tokens per training window
    batch_size: int = 32  # windows per step, all processes together
    max_iters: int = 1000  # optimizer steps in the whole run
    lr: float = 1e-3  # peak learning rate, reached at the end of the warmup
    min_lr_ratio: float = 0.1  # the cosine decays to lr * min_lr_ratio at max_iters
    warmup: int = 100  # steps of linear warmup from ~0 to lr
    weight_decay: float = 0.1  # AdamW decay, on matrices only (see configure_optimizer)
    beta1: float = 0.9  # AdamW's first-moment decay
    beta2: float = 0.99  # AdamW's second-moment decay; 0.99 suits small batches (nanoGPT)
    grad_clip: float = 1.0  # clip the global gradient norm to this; 0 disables
    eval_interval: int = 100  # estimate the losses and save a checkpoint every this many steps
    eval_iters: int = 20  # batches per loss estimate
    log_interval: int = 10  # steps between reads of the loss on the host (progress, NaN check)
    seed: int = 1337  # seeds the batches, the dropout and the evaluation batches
    device: str = "cpu"  # "cpu", "cuda", "cuda:1", "mps", ...
    dtype: str = "float32"  # autocast dtype: "float32" (none), "bfloat16" or "float16"
    compile: bool = False  # torch.compile the model for the training steps

    def __post_init__(self) -> None:
        for name in (
            "block_size",
            "batch_size",
            "max_iters",
            "eval_interval",
            "eval_iters",
            "log_interval",
        ):
            check_positive_int(name, getattr(self, name))
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise UserValueError(f"warmup must be an int >= 0, got {self.warmup!r}")
        check_seed(self.seed)
        for name in ("lr", "weight_decay", "grad_clip", "min_lr_ratio", "beta1", "beta2"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise UserTypeError(f"{name} must be a float, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise UserValueError(f"{name} must be a finite float >= 0, got {value}")
        if not self.lr > 0:
            raise UserValueError(f"lr must be > 0, got {self.lr}")
        if not self.min_lr_ratio <= 1:  # the cosine decays from lr, never up
            raise UserValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        for name in ("beta1", "beta2"):  # a moment that never decays is no average (AdamW)
            if not getattr(self, name) < 1:
                raise UserValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.dtype not in AUTOCAST_DTYPES:
            raise UserValueError(f"dtype must be one of {AUTOCAST_DTYPES}, got {self.dtype!r}")
        if not isinstance(self.device, str) or not self.device:
            raise UserTypeError(
                f"device must be a string such as 'cpu' or 'cuda', got {self.device!r}"
            )
        if not isinstance(self.compile, bool):
            raise UserTypeError(f"compile must be a bool, got {self.compile!r}")

    @property
    def min_lr(self) -> float:
        """The learning rate the cosine ends at."""
        return self.lr * self.min_lr_ratio


def lr_at(step: int, cfg: TrainConfig) -> float:
    """The learning rate for the update that follows ``step`` completed updates.

    Linear warmup over ``warmup`` steps, then a half cosine from ``lr`` down to ``min_lr`` at
    ``max_iters`` (nanoGPT's schedule, with its decay length equal to the run).

    Example:
        >>> cfg = TrainConfig(lr=1.0, min_lr_ratio=0.1, warmup=10, max_iters=110)
        >>> [round(lr_at(s, cfg), 3) for s in (0, 9, 10, 60, 110)]
        [0.1, 1.0, 1.0, 0.55, 0.1]
    """
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    if step >= cfg.max_iters:
        return cfg.min_lr
    progress = (step - cfg.warmup) / max(1, cfg.max_iters - cfg.warmup)  # 0 -> 1
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.lr - cfg.min_lr)


def configure_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on parameters of 2 or more dimensions only.

    Matrices and embeddings decay; biases and LayerNorm gains do not (nanoGPT's and minGPT's
    rule: decaying a gain towards 0 shrinks the signal rather than regularising). Tied
    parameters appear once, as ``named_parameters`` lists them.

    Example:
        >>> opt = configure_optimizer(nn.Linear(3, 2), TrainConfig())
        >>> [(len(g["params"]), g["weight_decay"]) for g in opt.param_groups]
        [(1, 0.1), (1, 0.0)]
    """
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))
