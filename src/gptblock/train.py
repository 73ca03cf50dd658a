"""The training loop: for any module whose ``forward(idx, targets)`` returns ``(logits, loss)``.

The trainer knows nothing about GPT (minGPT's rule): it draws batches, steps AdamW, estimates
losses, saves checkpoints and calls back. What to build from a checkpoint, and what to print at
the end, is the caller's business; the caller passes JSON-ready ``meta`` (for gptblock: the
model config and the vocabulary) that is saved with every checkpoint.

Exact resume. Every source of randomness is state the checkpoint saves: the model's and
optimizer's tensors, the global RNG (dropout) of every process, and the data generator that
draws the batches. Evaluation draws its batches from generators re-seeded at each evaluation
and runs without dropout, so how often a run evaluates does not change what it trains on. On the
CPU a run stopped at step k and resumed therefore ends with bit-identical weights.

Shapes: B batch (per process), T time (``block_size``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import signal
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from .checkpoint import (
    Checkpoint,
    CheckpointError,
    check_same_field,
    load_checkpoint,
    load_model_state,
    load_optimizer_state,
    optimizer_parts,
    save_checkpoint,
)
from .data import TokenSplits, full_windows, get_batch
from .distributed import all_gather_rows, all_reduce_sum, dist_info
from .recipe import TrainConfig, autocast_context, configure_optimizer, lr_at
from .trainlog import ProgressBar, save_loss_plot

__all__ = ["NonFiniteLossError", "TrainResult", "Trainer"]

EVENTS = ("on_step_end", "on_eval_end")


class NonFiniteLossError(FloatingPointError):
    """The loss became NaN or infinite; the run stopped without saving that state."""


@dataclass(frozen=True)
class TrainResult:
    """What a call to ``Trainer.fit`` did."""

    step: int  # optimizer steps completed
    interrupted: bool  # stopped early (Ctrl-C or request_stop) after saving "last"
    val_loss: float | None  # mean loss over the whole validation split; None if interrupted
    best_val_loss: float | None  # lowest estimated validation loss of the run
    checkpoint: Path | None  # the "last" checkpoint's JSON file, if an out_dir was given


class Trainer:
    """Train ``model`` on ``data`` with AdamW, checkpoints and (under torchrun) DDP.

    Args:
        model: any module with ``forward(idx, targets) -> (logits, loss)``, ``loss`` the mean
            cross-entropy over the batch. Moved to ``config.device``.
        data: the training and validation token ids.
        config: the ``TrainConfig``.
        out_dir: where checkpoints ("last", "best") and ``loss.png`` go; None writes nothing.
        meta: JSON-ready fields saved in every checkpoint. A ``model_config`` or ``vocab``
            field must match the checkpoint's when resuming.
        progress: show a tqdm progress bar (rank 0 only).

    Shape:
        ``model`` receives ``idx`` and ``targets`` of shape (B, T) int64.

    Example:
        >>> class Bigram(nn.Module):
        ...     def __init__(self, V):
        ...         super().__init__()
        ...         self.table = nn.Embedding(V, V)
        ...     def forward(self, idx, targets=None):
        ...         logits = self.table(idx)  # (B, T, V)
        ...         loss = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        ...         return logits, loss
        >>> data = TokenSplits(torch.arange(200) % 5, torch.arange(50) % 5)
        >>> cfg = TrainConfig(block_size=8, batch_size=4, max_iters=30, lr=0.3, warmup=0)
        >>> result = Trainer(Bigram(5), data, cfg, progress=False).fit()
        >>> result.step, result.val_loss < 0.1
        (30, True)
    """

    def __init__(
        self,
        model: nn.Module,
        data: TokenSplits,
        config: TrainConfig,
        *,
        out_dir: str | Path | None = None,
        meta: Mapping[str, Any] | None = None,
        progress: bool = True,
    ) -> None:
        for name, part in (("training", data.train), ("validation", data.val)):
            if len(part) <= config.block_size:
                raise ValueError(
                    f"the {name} data has {len(part)} tokens; a window of block_size="
                    f"{config.block_size} needs {config.block_size + 1}"
                )
        self.config = config
        self.dist = dist_info()
        self.device = torch.device(config.device)
        self.model = model.to(self.device)
        self.data = data
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.meta = dict(meta or {})
        self.progress = progress
        self.optimizer = configure_optimizer(self.model, config)
        self.autocast = autocast_context(self.device, config.dtype)
        # float16 needs loss scaling against gradient underflow; bfloat16 has float32's range.
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=config.dtype == "float16")
        self.generator = torch.Generator().manual_seed(config.seed)  # draws the training batches
        self.step = 0
        self.best_val_loss: float | None = None
        self.losses: list[float] = []  # training loss of each step, from step 1
        self.evals: list[dict[str, float]] = []  # {"step", "train", "val"} of each estimate
        self._callbacks: dict[str, list[Callable[[Trainer], None]]] = {e: [] for e in EVENTS}
        self._stop_requested = False
        self._saved_step = -1  # the step "last" was last saved at
        net: nn.Module = torch.compile(self.model) if config.compile else self.model  # type: ignore[assignment]
        if self.dist.world_size > 1:
            ids = [self.device.index] if self.device.type == "cuda" else None
            net = DistributedDataParallel(net, device_ids=ids)
        self.net = net  # what the training steps call; evaluation uses self.model directly

    def add_callback(self, event: str, fn: Callable[[Trainer], None]) -> None:
        """Call ``fn(trainer)`` on ``event``: "on_step_end" (after each update) or "on_eval_end"."""
        if event not in EVENTS:
            raise ValueError(f"event must be one of {EVENTS}, got {event!r}")
        self._callbacks[event].append(fn)

    def request_stop(self) -> None:
        """Stop after the current step, saving "last" (what Ctrl-C does)."""
        self._stop_requested = True

    def fit(self, resume: bool = False) -> TrainResult:
        """Train to ``config.max_iters`` steps, or resume from ``out_dir``'s "last" checkpoint.

        A fresh run seeds the global RNG, which dropout draws from, with ``config.seed`` (plus
        1000 * rank under DDP) and saves a checkpoint at step 0; a resumed run restores the
        RNG states, the data generator, the weights and the optimizer from "last".

        Raises:
            NonFiniteLossError: a training or validation loss was NaN or infinite; the message
                names the step, and no checkpoint is written for that state.
            CheckpointError, FileNotFoundError: ``resume`` with no usable checkpoint, or one of
                a different model (the message names the differing fields).
        """
        self._stop_requested = False
        with _stop_on_signals(self.request_stop):
            if resume:
                if self.out_dir is None:
                    raise ValueError("resume needs an out_dir to resume from")
                self.restore(load_checkpoint(self.out_dir, "last"))
            else:
                # Each process gets its own dropout stream; rank 0's is the single-process one.
                torch.manual_seed(self.config.seed + 1000 * self.dist.rank)
                self._evaluate_and_save()  # step 0: from here on there is always a checkpoint
            self._loop()
            stopped = self.step < self.config.max_iters
            if stopped and self._saved_step != self.step:
                self.save("last")
        return self._result(interrupted=stopped)

    def _loop(self) -> None:
        bar = ProgressBar(
            self.step, self.config.max_iters, enabled=self.progress and self.dist.is_main
        )
        try:
            while self.step < self.config.max_iters and not self._agree_to_stop():
                loss = self._train_step()
                bar.update(loss, lr_at(self.step - 1, self.config), self._tokens_per_step())
                for fn in self._callbacks["on_step_end"]:
                    fn(self)
                if self.step % self.config.eval_interval == 0 or self.step == self.config.max_iters:
                    self._evaluate_and_save()
        finally:
            bar.close()

    def _agree_to_stop(self) -> bool:
        # Every process must stop at the same step, even if only one of them got the signal.
        flag = torch.tensor([float(self._stop_requested)], device=self._comm_device())
        return bool(all_reduce_sum(flag).item() > 0)

    def _train_step(self) -> float:
        cfg = self.config
        lr = lr_at(self.step, cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        x, y = self._batch(self.data.train, self.generator)  # (B, T) each
        with self.autocast:
            _, loss = self.net(x, y)
        # The mean over all processes: the loss of the global batch, and the same on every rank,
        # so all of them stop together if it is not finite.
        local = torch.tensor([loss.item()], dtype=torch.float64, device=self._comm_device())
        mean_loss = all_reduce_sum(local).item() / self.dist.world_size
        if not math.isfinite(mean_loss):
            raise NonFiniteLossError(
                f"training loss is {mean_loss} at step {self.step + 1}; stopped without saving "
                f"this state{self._last_good()}"
            )
        self.scaler.scale(loss).backward()
        if cfg.grad_clip > 0:
            self.scaler.unscale_(self.optimizer)
            nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.losses.append(mean_loss)
        return mean_loss

    def _batch(
        self, tokens: torch.Tensor, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # This process's share of one global batch, on the device.
        cfg, d = self.config, self.dist
        x, y = get_batch(
            tokens, cfg.block_size, cfg.batch_size, generator, rank=d.rank, world_size=d.world_size
        )
        return x.to(self.device), y.to(self.device)

    def _tokens_per_step(self) -> int:
        return self.config.batch_size * self.config.block_size

    def _comm_device(self) -> torch.device:
        # nccl moves CUDA tensors only; gloo and single processes use the CPU.
        return (
            self.device
            if self.device.type == "cuda" and self.dist.world_size > 1
            else torch.device("cpu")
        )

    def _last_good(self) -> str:
        if self.out_dir is None or not (self.out_dir / "last.json").exists():
            return ""
        return f" (the last good checkpoint is {self.out_dir / 'last.json'})"

    @torch.no_grad()
    def estimate_loss(self) -> dict[str, float]:
        """Mean loss over ``eval_iters`` batches of each split, with dropout off.

        The batches come from generators seeded afresh each time, so every estimate of a run
        sees the same batches: estimates differ only because the model did.
        """
        cfg = self.config
        out = {}
        with _eval_mode(self.model):
            for offset, (split, tokens) in enumerate(
                (("train", self.data.train), ("val", self.data.val))
            ):
                g = torch.Generator().manual_seed(cfg.seed + 1 + offset)
                total = 0.0
                for _ in range(cfg.eval_iters):
                    x, y = self._batch(tokens, g)  # (B, T) each
                    with self.autocast:
                        _, loss = self.model(x, y)
                    total += loss.item()
                summed = all_reduce_sum(
                    torch.tensor([total], dtype=torch.float64, device=self._comm_device())
                )
                out[split] = summed.item() / (cfg.eval_iters * self.dist.world_size)
        return out

    @torch.no_grad()
    def validation_loss(self) -> float:
        """Mean loss per token over the WHOLE validation split, in non-overlapping windows.

        Each process takes every world_size-th batch; the sums of loss * targets are combined.
        """
        cfg = self.config
        batches = full_windows(self.data.val, cfg.block_size, cfg.batch_size)
        total = torch.zeros(2, dtype=torch.float64)  # (sum of token losses, number of tokens)
        with _eval_mode(self.model):
            for x, y in batches[self.dist.rank :: self.dist.world_size]:  # (B', T') each
                with self.autocast:
                    _, loss = self.model(x.to(self.device), y.to(self.device))
                total += torch.tensor([loss.item() * y.numel(), y.numel()], dtype=torch.float64)
        summed = all_reduce_sum(total.to(self._comm_device())).cpu()
        return summed[0].item() / summed[1].item()

    def _evaluate_and_save(self) -> None:
        losses = self.estimate_loss()
        for split, value in losses.items():
            if not math.isfinite(value):
                raise NonFiniteLossError(
                    f"{split} loss estimate is {value} at step {self.step}; stopped without "
                    f"saving this state{self._last_good()}"
                )
        self.evals.append({"step": self.step, **losses})
        improved = self.best_val_loss is None or losses["val"] < self.best_val_loss
        if improved:
            self.best_val_loss = losses["val"]
        self.save("last")
        if improved:
            self.save("best")
        if self.out_dir is not None and self.dist.is_main:
            save_loss_plot(self.losses, self.evals, self.out_dir / "loss.png")
        for fn in self._callbacks["on_eval_end"]:
            fn(self)

    def _result(self, interrupted: bool) -> TrainResult:
        val = None if interrupted else self.validation_loss()
        path = self.out_dir / "last.json" if self.out_dir is not None else None
        return TrainResult(self.step, interrupted, val, self.best_val_loss, path)

    def state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Everything a checkpoint holds: tensors (for safetensors) and JSON fields.

        Collective under DDP: every process must call it (the RNG states are gathered).
        """
        tensors = {f"model.{k}": v for k, v in self.model.state_dict().items()}
        opt_tensors, opt_json = optimizer_parts(self.optimizer)
        tensors.update(opt_tensors)
        tensors["rng.data"] = self.generator.get_state()
        comm = self._comm_device()
        for r, s in enumerate(all_gather_rows(torch.get_rng_state().to(comm))):
            tensors[f"rng.cpu.{r}"] = s.cpu()
        if self.device.type == "cuda":
            for r, s in enumerate(all_gather_rows(torch.cuda.get_rng_state(self.device).to(comm))):
                tensors[f"rng.cuda.{r}"] = s.cpu()
        meta = {
            **self.meta,
            "step": self.step,
            "best_val_loss": self.best_val_loss,
            "train_config": dataclasses.asdict(self.config),
            "world_size": self.dist.world_size,
            # Where the randomness lives, for a reader of the JSON: the batches' generator
            # (seeded with train_config.seed) and each process's global RNG (dropout).
            "rng": {
                "batches": "rng.data",
                "dropout": sorted(k for k in tensors if k.startswith(("rng.cpu.", "rng.cuda."))),
            },
            "optimizer": opt_json,
            "scaler": self.scaler.state_dict(),
            "history": {"loss": self.losses, "evals": self.evals},
        }
        return tensors, meta

    def save(self, kind: str) -> None:
        """Save checkpoint ``kind`` ("last" or "best") to ``out_dir`` (rank 0 writes)."""
        tensors, meta = self.state()  # collective: every rank takes part
        if self.out_dir is not None and self.dist.is_main:
            save_checkpoint(self.out_dir, kind, tensors, meta)
        if kind == "last":
            self._saved_step = self.step

    def restore(self, ckpt: Checkpoint) -> None:
        """Load a checkpoint written by ``save``, checking it belongs to this model and data."""
        ckpt.require("step", "optimizer", "history", "best_val_loss", "world_size")
        for field in ("model_config", "vocab"):
            check_same_field(ckpt, field, ckpt.meta.get(field), self.meta.get(field))
        load_model_state(self.model, ckpt)
        load_optimizer_state(self.optimizer, ckpt)
        if ckpt.meta.get("scaler"):
            self.scaler.load_state_dict(ckpt.meta["scaler"])
        try:
            self.generator.set_state(ckpt.tensors["rng.data"])
            rank = self.dist.rank
            if ckpt.meta["world_size"] == self.dist.world_size:
                torch.set_rng_state(ckpt.tensors[f"rng.cpu.{rank}"])
                if self.device.type == "cuda" and f"rng.cuda.{rank}" in ckpt.tensors:
                    torch.cuda.set_rng_state(ckpt.tensors[f"rng.cuda.{rank}"], self.device)
            else:
                warnings.warn(
                    f"{ckpt.path} was saved by {ckpt.meta['world_size']} processes, this run has "
                    f"{self.dist.world_size}: dropout is re-seeded, so the run is not an exact "
                    f"continuation",
                    stacklevel=2,
                )
                torch.manual_seed(self.config.seed + 1000 * rank + ckpt.meta["step"])
        except (KeyError, RuntimeError) as e:
            raise CheckpointError(
                f"{ckpt.tensors_path}: missing or malformed RNG state ({e})"
            ) from None
        self.step = int(ckpt.meta["step"])
        self.best_val_loss = ckpt.meta["best_val_loss"]
        self.losses = list(ckpt.meta["history"]["loss"])
        self.evals = list(ckpt.meta["history"]["evals"])


@contextlib.contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


@contextlib.contextmanager
def _stop_on_signals(request_stop: Callable[[], None]) -> Iterator[None]:
    """Turn the first Ctrl-C (or SIGTERM) into ``request_stop``; a second one interrupts at once.

    Stopping between steps, rather than wherever KeyboardInterrupt lands, is what keeps the saved
    state consistent: an exception inside ``optimizer.step`` could leave half the weights updated.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be installed from the main thread
        return

    def handler(signum: int, frame: object) -> None:
        # The second signal is not caught: it aborts at once.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        request_stop()

    old_int = signal.signal(signal.SIGINT, handler)
    old_term = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)
