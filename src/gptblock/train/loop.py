"""The training loop, for any module whose ``forward(idx, targets)`` returns ``(logits, loss)``.

The trainer knows nothing about GPT (minGPT's rule); the caller's ``meta`` is saved with every
checkpoint and decides on resume whether one belongs to this run (``gptblock.runs.meta``).
Losses stay on the device and are read every ``log_interval`` steps (and before a checkpoint),
so a NaN stops the run before its state is saved. Everything random is checkpointed
(``gptblock.train.state``): on the CPU a resumed run ends bit-identical.

Shapes: B batch (per process), T time (``block_size``).
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from ..data.batches import TokenSplits, get_batch
from ..devices import autocast_context, resolve_device
from ..distributed import all_reduce_sum, comm_device, dist_info
from ..errors import UserTypeError, UserValueError
from ..runs.checkpoint import (
    BEST,
    LAST,
    Checkpoint,
    checkpoint_path,
    load_checkpoint,
    save_checkpoint,
)
from ..runs.owned import record_written
from ..runs.rundir import LOSS_PLOT, locked_run_dir, run_dir_of_processes
from . import state as train_state
from .arguments import check_arguments
from .config import TrainConfig, configure_optimizer, lr_at
from .evaluate import estimate_loss, loss_of, validation_loss
from .log import ProgressBar, save_loss_plot
from .result import NonFiniteLossError, TrainResult
from .state import History, Parts, PlainMeta, RunMetadata

__all__ = ["Trainer"]

EVENTS = ("on_step_end", "on_eval_end")


class Trainer:
    """Train ``model`` on ``data`` with AdamW, checkpoints and (under torchrun) DDP.

    ``model(idx, targets)`` takes (B, T) int64 and returns the mean cross-entropy as ``loss``.
    ``out_dir`` (None: nothing written) gets checkpoints "last", "best" and ``loss.png``.
    ``meta`` is a ``RunMetadata`` or a mapping of JSON fields the checkpoint must match to resume.

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
        out_dir: str | os.PathLike[str] | None = None,
        meta: RunMetadata | Mapping[str, Any] | None = None,
        progress: bool = True,
    ) -> None:
        check_arguments(model, data, config, out_dir, meta)
        self.config = config
        self.dist = dist_info()
        self.device = torch.device(resolve_device(config.device))
        self.model = model.to(self.device)
        self.data = data
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.meta: RunMetadata = PlainMeta(meta or {}) if isinstance(meta, Mapping | None) else meta
        self.progress = progress
        self.optimizer = configure_optimizer(self.model, config)
        self.autocast = autocast_context(self.device, config.dtype)
        # float16 needs loss scaling against gradient underflow; bfloat16 has float32's range.
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=config.dtype == "float16")
        self.generator = torch.Generator().manual_seed(config.seed)  # draws the training batches
        self.iter_num = 0
        self.best_val_loss: float | None = None
        self.losses: list[float] = []  # training loss of each step read so far, from step 1
        self._unread: list[torch.Tensor] = []  # the losses of the steps since, on the device
        self.evals: list[dict[str, float]] = []  # {"step", "train", "val"} of each estimate
        self._callbacks: dict[str, list[Callable[[Trainer], None]]] = {e: [] for e in EVENTS}
        self._stop_requested = False
        self._saved_step = -1  # the step "last" was last saved at
        self._holding = False  # whether fit holds out_dir's lock now
        self._ran_in_out_dir = False  # whether fit has started or resumed a run in out_dir
        net: nn.Module = torch.compile(self.model) if config.compile else self.model  # type: ignore[assignment]
        if self.dist.world_size > 1:
            ids = [self.device.index] if self.device.type == "cuda" else None
            net = DistributedDataParallel(net, device_ids=ids)
        self.net = net  # what the training steps call; evaluation uses self.model directly

    def add_callback(self, event: str, fn: Callable[[Trainer], None]) -> None:
        """Call ``fn(trainer)`` on ``event``: "on_step_end" (after each update) or "on_eval_end"."""
        if event not in EVENTS:
            raise UserValueError(f"event must be one of {EVENTS}, got {event!r}")
        if not callable(fn):
            raise UserTypeError(f"a callback must be callable, got {fn!r:.60}")
        self._callbacks[event].append(fn)

    def request_stop(self) -> None:
        """Stop after the current step, saving "last" (what Ctrl-C does)."""
        self._stop_requested = True

    def fit(self, resume: bool = False) -> TrainResult:
        """Train to ``config.max_iters`` steps, or resume from ``out_dir``'s "last" checkpoint.

        A fresh run seeds dropout's RNG with ``config.seed`` (+ 1000 * rank) and saves step 0.
        ``NonFiniteLossError`` names the step of a NaN loss; no checkpoint holds that state.
        """
        if not isinstance(resume, bool):
            raise UserTypeError(f"resume must be a bool, got {resume!r:.40}")
        if resume and self.out_dir is None:
            raise UserValueError("resume needs an out_dir to resume from")
        self._stop_requested = False
        with stop_on_signals(self.request_stop), self._claim_out_dir(resume):
            if resume:
                self.restore(load_checkpoint(cast(Path, self.out_dir), LAST))
            else:
                # Each process gets its own dropout stream; rank 0's is the single-process one.
                torch.manual_seed(self.config.seed + 1000 * self.dist.rank)
                self._evaluate_and_save()  # step 0: from here on there is always a checkpoint
            self._loop()
            stopped = self.iter_num < self.config.max_iters
            if stopped and self._saved_step != self.iter_num:
                self.save(LAST)
        return self._result(interrupted=stopped)

    @contextlib.contextmanager
    def _claim_out_dir(self, resume: bool) -> Iterator[None]:
        if self.out_dir is None:
            yield
            return
        main, comm = self.dist.is_main, comm_device(self.device)
        with run_dir_of_processes(self.out_dir, resume=resume, is_main=main, comm=comm):
            self._holding = self._ran_in_out_dir = True
            try:
                yield
            finally:
                self._holding = False

    def _loop(self) -> None:
        cfg = self.config
        bar = ProgressBar(self.iter_num, cfg.max_iters, enabled=self.progress and self.dist.is_main)
        try:
            while self.iter_num < cfg.max_iters and not self._agree_to_stop():
                self.step()
                bar.advance()
                evaluate = self.iter_num % cfg.eval_interval == 0 or self.iter_num == cfg.max_iters
                if evaluate or self.iter_num % cfg.log_interval == 0:
                    self.read_losses()
                    bar.show(
                        self.losses[-1], lr_at(self.iter_num - 1, cfg), self._tokens_per_step()
                    )
                for fn in self._callbacks["on_step_end"]:
                    fn(self)
                if evaluate:
                    self._evaluate_and_save()
        finally:
            bar.close()

    def _agree_to_stop(self) -> bool:
        if self.dist.world_size == 1:
            return self._stop_requested
        # Every process must stop at the same step, even if only one of them got the signal.
        # Agreeing is a collective and a host read, so it happens where the losses are read.
        if self.iter_num % self.config.log_interval != 0:
            return False
        flag = torch.tensor([float(self._stop_requested)], device=comm_device(self.device))
        return bool(all_reduce_sum(flag).item() > 0)

    def read_losses(self) -> list[float]:
        """Bring the losses since the last read to the host (one sync; under DDP one collective,
        the mean over processes); return them all. ``NonFiniteLossError`` names a NaN's step."""
        if not self._unread:
            return self.losses
        first = len(self.losses) + 1  # the step the first unread loss belongs to
        local = torch.stack(self._unread).to(comm_device(self.device), torch.float64)  # (n,)
        self._unread = []
        values = (all_reduce_sum(local) / self.dist.world_size).tolist()
        for i, value in enumerate(values):
            if not math.isfinite(value):
                raise NonFiniteLossError(
                    f"training loss is {value} at step {first + i}; stopped without saving "
                    f"this state{self._last_good()}"
                )
        self.losses.extend(values)
        return self.losses

    def step(self) -> None:
        """One update (its loss kept on the device for ``read_losses``). Under a profiler each
        phase is a range ("data", "forward", "backward", "optimizer"): benchmarks read them."""
        cfg = self.config
        lr = lr_at(self.iter_num, cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)  # each group's peak, on one schedule
        with _phase("data"):
            x, y = self._batch(self.data.train, self.generator)  # (B, T) each
        with _phase("forward"), self.autocast:
            loss = loss_of(self.net(x, y))
        if not loss.requires_grad:
            raise UserValueError(
                "the loss the model returns does not require grad: was it computed under "
                "torch.no_grad(), or detached from the model's parameters?"
            )
        self._unread.append(loss.detach())  # read with the others by read_losses
        with _phase("backward"):
            self.scaler.scale(loss).backward()  # type: ignore[no-untyped-call]
        with _phase("optimizer"):
            if cfg.grad_clip > 0:
                self.scaler.unscale_(self.optimizer)
                nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.optimizer.zero_grad(set_to_none=True)
        self.iter_num += 1

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

    def _last_good(self) -> str:
        if self.out_dir is None or not checkpoint_path(self.out_dir, LAST).exists():
            return ""
        return f" (the last good checkpoint is {checkpoint_path(self.out_dir, LAST)})"

    def estimate_loss(self) -> dict[str, float]:
        """``gptblock.train.evaluate.estimate_loss`` of the model with this run's settings."""
        cfg = self.config
        return estimate_loss(
            self.model, self.data, block_size=cfg.block_size, batch_size=cfg.batch_size,
            iters=cfg.eval_iters, seed=cfg.seed, device=self.device, autocast=self.autocast,
        )  # fmt: skip

    def validation_loss(self) -> float:
        """Mean loss per token over the WHOLE validation split (``gptblock.train.evaluate``)."""
        cfg = self.config
        return validation_loss(
            self.model, self.data.val, block_size=cfg.block_size, batch_size=cfg.batch_size,
            device=self.device, autocast=self.autocast,
        )  # fmt: skip

    def _evaluate_and_save(self) -> None:
        losses = self.estimate_loss()
        for split, value in losses.items():
            if not math.isfinite(value):
                raise NonFiniteLossError(
                    f"{split} loss estimate is {value} at step {self.iter_num}; stopped without "
                    f"saving this state{self._last_good()}"
                )
        self.evals.append({"step": self.iter_num, **losses})
        improved = self.best_val_loss is None or losses["val"] < self.best_val_loss
        if improved:
            self.best_val_loss = losses["val"]
        self.save(LAST)
        if improved:
            self.save(BEST)
        if self.out_dir is not None and self.dist.is_main:
            record_written(self.out_dir, LOSS_PLOT)  # the run's own file from now on
            save_loss_plot(self.losses, self.evals, self.out_dir / LOSS_PLOT)
        for fn in self._callbacks["on_eval_end"]:
            fn(self)

    def _result(self, interrupted: bool) -> TrainResult:
        val = None if interrupted else self.validation_loss()
        path = checkpoint_path(self.out_dir, LAST) if self.out_dir is not None else None
        return TrainResult(self.iter_num, interrupted, val, self.best_val_loss, path)

    def state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """A checkpoint's tensors and JSON fields (collective under DDP: every process calls)."""
        self.read_losses()
        history = History(self.iter_num, self.best_val_loss, self.losses, self.evals)
        return train_state.capture(
            self.parts(), history, meta=self.meta, config=self.config, device=self.device,
            world_size=self.dist.world_size,
        )  # fmt: skip

    def parts(self) -> Parts:
        """The model, optimizer, loss scaler and batch generator: what has state to save."""
        return Parts(self.model, self.optimizer, self.scaler, self.generator)

    def save(self, kind: str) -> None:
        """Save checkpoint ``kind`` to ``out_dir`` (rank 0 writes); outside ``fit`` under the
        directory's lock, and only where ``fit`` could write."""
        if self.out_dir is None:
            # Nowhere to write (every rank alike): the state is not captured, which would copy
            # the weights and optimizer for nothing (and import torch._dynamo, for 0.8 s, in
            # the optimizer's state_dict); its check of the losses still runs.
            self.read_losses()
        else:
            tensors, meta = self.state()  # collective: every rank takes part
            if self.dist.is_main:
                held = contextlib.nullcontext() if self._holding else self._claim_for_save()
                with held:
                    save_checkpoint(self.out_dir, kind, tensors, meta)
        if kind == LAST:
            self._saved_step = self.iter_num

    def _claim_for_save(self) -> contextlib.AbstractContextManager[Path]:
        # A trainer that has run in out_dir continues its run; any other starts a fresh one.
        return locked_run_dir(cast(Path, self.out_dir), resume=self._ran_in_out_dir)

    def restore(self, ckpt: Checkpoint) -> None:
        """Load a checkpoint written by ``save``, after ``meta`` says it belongs to this run."""
        history = train_state.restore(
            self.parts(), ckpt, meta=self.meta, config=self.config, device=self.device,
            dist=self.dist,
        )  # fmt: skip
        self.iter_num, self.best_val_loss = history.step, history.best_val_loss
        self.losses, self.evals = history.losses, history.evals
        self._unread = []


def _phase(name: str) -> contextlib.AbstractContextManager[object]:
    # A profiler range costs ~20 us even with no profiler on: mark phases only under one.
    on = torch.autograd._profiler_enabled()  # type: ignore[attr-defined]
    return torch.profiler.record_function(name) if on else contextlib.nullcontext()


@contextlib.contextmanager
def stop_on_signals(request_stop: Callable[[], None]) -> Iterator[None]:
    """Turn the first Ctrl-C (or SIGTERM) into ``request_stop``: a KeyboardInterrupt inside
    ``optimizer.step`` could leave half the weights updated."""
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
