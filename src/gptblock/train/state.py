"""What a checkpoint of a training run holds, so that a resumed run continues exactly.

Every source of randomness is saved: the model's and optimizer's tensors, every process's global
RNG (dropout) and the batches' generator; evaluation re-seeds its own, so on the CPU a resumed
run ends with bit-identical weights. Tensors (``model.*``, ``optim.*``, ``rng.*``) go to
safetensors, the rest to the JSON. A trainer hands ``capture`` its ``Parts`` and ``History`` and
takes a ``History`` back from ``restore``: no ``Trainer`` needed here.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import torch
import torch.nn as nn

from ..blocks.config import applicable
from ..distributed import DistInfo, all_gather_rows, comm_device
from ..runs.checkpoint import (
    Checkpoint,
    CheckpointError,
    check_same_field,
    is_count,
    is_finite_number,
)
from ..runs.statedict import load_model_state, load_optimizer_state, optimizer_parts
from .config import TrainConfig

__all__ = [
    "History",
    "Parts",
    "PlainMeta",
    "RunMetadata",
    "capture",
    "check_fields",
    "restore",
]


class RunMetadata(Protocol):
    """What a trainer saves about its run, and how it recognises its own checkpoints."""

    def to_json(self) -> dict[str, Any]:
        """JSON-ready fields saved in every checkpoint."""
        ...

    def check_resume(self, ckpt: Checkpoint) -> None:
        """Raise ``CheckpointError`` if ``ckpt`` is not a checkpoint of this run."""
        ...


@dataclass(frozen=True)
class PlainMeta:
    """Metadata given as a plain mapping: every field must be the checkpoint's to resume."""

    fields: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return dict(self.fields)

    def check_resume(self, ckpt: Checkpoint) -> None:
        for name, value in self.fields.items():
            check_same_field(ckpt, name, ckpt.meta.get(name), value)


class Parts(NamedTuple):
    """The objects of a run whose state a checkpoint holds (``Trainer.parts()``)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler  # float16's loss scale
    generator: torch.Generator  # draws the training batches


@dataclass
class History:
    """How far a run has come: the steps done, the losses read and estimated, the best."""

    step: int = 0  # optimizer steps completed
    best_val_loss: float | None = None  # lowest validation estimate; None before any
    losses: list[float] = field(default_factory=list)  # training loss of each step, from 1
    evals: list[dict[str, float]] = field(default_factory=list)  # {"step", "train", "val"}


def capture(
    parts: Parts,
    history: History,
    *,
    meta: RunMetadata,
    config: TrainConfig,
    device: torch.device,
    world_size: int,
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """A run's checkpoint: tensors and JSON fields (collective under DDP: RNGs are gathered)."""
    tensors = {f"model.{k}": v for k, v in parts.model.state_dict().items()}
    opt_tensors, opt_json = optimizer_parts(parts.optimizer)
    tensors.update(opt_tensors)
    tensors["rng.data"] = parts.generator.get_state()
    comm = comm_device(device)
    for r, s in enumerate(all_gather_rows(torch.get_rng_state().to(comm))):
        tensors[f"rng.cpu.{r}"] = s.cpu()
    if device.type == "cuda":
        cuda_state = torch.cuda.get_rng_state(device).to(comm)
        for r, s in enumerate(all_gather_rows(cuda_state)):
            tensors[f"rng.cuda.{r}"] = s.cpu()
    fields = {
        **meta.to_json(),
        "step": history.step,
        "best_val_loss": history.best_val_loss,
        "train_config": dataclasses.asdict(config),
        "world_size": world_size,
        # Where the randomness lives, for a reader of the JSON: the batches' generator
        # (seeded with train_config.seed) and each process's global RNG (dropout).
        "rng": {
            "batches": "rng.data",
            "dropout": sorted(k for k in tensors if k.startswith(("rng.cpu.", "rng.cuda."))),
        },
        "optimizer": opt_json,
        "scaler": parts.scaler.state_dict(),
        "history": {"loss": history.losses, "evals": history.evals},
    }
    return tensors, fields


def check_fields(ckpt: Checkpoint, max_iters: int | None = None) -> None:
    """Check the type and range of every field ``capture`` writes, naming the first bad one
    (``step`` at most ``max_iters``, by default the checkpoint's own)."""
    ckpt.require("step", "optimizer", "history", "best_val_loss", "world_size")
    meta, where = ckpt.meta, ckpt.path

    def bad(field: str, expected: str, value: object) -> CheckpointError:
        return CheckpointError(f"{where}: field {field!r} must be {expected}, got {value!r:.60}")

    saved_config = meta.get("train_config")
    if isinstance(saved_config, dict):  # a value that could not act is dropped
        saved_config = applicable(TrainConfig, saved_config)
    if saved_config is not None:
        try:
            saved_max_iters = TrainConfig(**saved_config).max_iters
        except (TypeError, ValueError) as error:
            raise CheckpointError(f"{where}: invalid field 'train_config' ({error})") from None
        max_iters = saved_max_iters if max_iters is None else max_iters
    step = meta["step"]
    if max_iters is not None and step > max_iters:
        raise CheckpointError(
            f"{where}: field 'step' is {step}, beyond max_iters={max_iters}: the run has already "
            f"trained {step} steps; pass a larger --max-iters (max_iters) to train further"
        )
    world_size = meta["world_size"]
    if not is_count(world_size) or world_size < 1:
        raise bad("world_size", "an int >= 1", world_size)
    history = meta["history"]
    if not isinstance(history, dict) or not {"loss", "evals"} <= set(history):
        raise bad("history", 'an object with "loss" and "evals"', history)
    losses, evals = history["loss"], history["evals"]
    if (
        not isinstance(losses, list)
        or len(losses) != step
        or not all(map(is_finite_number, losses))
    ):
        raise bad("history.loss", f"a list of {step} finite losses, one per step", losses)
    last = -1
    for e in evals if isinstance(evals, list) else [None]:
        if not (
            isinstance(e, dict)
            and set(e) == {"step", "train", "val"}
            and is_count(e["step"])
            and last < e["step"] <= step
            and is_finite_number(e["train"])
            and is_finite_number(e["val"])
        ):
            raise bad("history.evals", f"estimates at increasing steps <= {step}", evals)
        last = e["step"]
    best = min((e["val"] for e in evals), default=None)
    if meta["best_val_loss"] != best:
        raise bad(
            "best_val_loss", f"the lowest validation estimate ({best})", meta["best_val_loss"]
        )
    scaler = meta.get("scaler")
    if scaler is not None and not isinstance(scaler, dict):
        raise bad("scaler", "an object", scaler)
    if scaler:  # empty: a disabled scaler's (every run but float16's)
        like = torch.amp.GradScaler("cpu").state_dict()  # its keys, and a value of each kind
        if set(scaler) != set(like):
            raise bad("scaler", f"an object of {sorted(like)}", sorted(scaler))
        for key, value in like.items():
            if isinstance(value, int):  # growth_interval, _growth_tracker: counts
                if not is_count(scaler[key]):
                    raise bad(f"scaler.{key}", "an int >= 0", scaler[key])
            elif not (is_finite_number(scaler[key]) and scaler[key] > 0):  # the scale, its factors
                raise bad(f"scaler.{key}", "a positive, finite number", scaler[key])


def _rng_state(ckpt: Checkpoint, name: str, like: torch.Tensor) -> torch.Tensor:
    # Refused unless it is a generator's state: as many uint8 as ``like`` holds.
    t = ckpt.tensors.get(name)
    if t is not None and (t.dtype != torch.uint8 or t.shape != like.shape):
        raise CheckpointError(
            f"{ckpt.tensors_path}: {name} must be an RNG state ({like.numel()} uint8), got "
            f"{t.dtype} of shape {tuple(t.shape)}"
        )
    return ckpt.tensors[name]  # a missing one: KeyError, said by the caller


def restore(
    parts: Parts,
    ckpt: Checkpoint,
    *,
    meta: RunMetadata,
    config: TrainConfig,
    device: torch.device,
    dist: DistInfo,
) -> History:
    """Put ``parts`` in the state ``capture`` saved, after checking (``meta``) that it is this
    run's; and the run's ``History`` as it was then."""
    check_fields(ckpt, config.max_iters)
    meta.check_resume(ckpt)
    load_model_state(parts.model, ckpt)
    load_optimizer_state(parts.optimizer, ckpt)
    if ckpt.meta.get("scaler"):
        parts.scaler.load_state_dict(ckpt.meta["scaler"])
    d = dist
    try:
        parts.generator.set_state(_rng_state(ckpt, "rng.data", parts.generator.get_state()))
        if ckpt.meta["world_size"] == d.world_size:
            torch.set_rng_state(_rng_state(ckpt, f"rng.cpu.{d.rank}", torch.get_rng_state()))
            if device.type == "cuda" and f"rng.cuda.{d.rank}" in ckpt.tensors:
                like = torch.cuda.get_rng_state(device)
                torch.cuda.set_rng_state(_rng_state(ckpt, f"rng.cuda.{d.rank}", like), device)
        else:
            warnings.warn(
                f"{ckpt.path} was saved by {ckpt.meta['world_size']} processes, this run has "
                f"{d.world_size}: dropout is re-seeded, so the run is not an exact continuation",
                stacklevel=3,
            )
            torch.manual_seed(config.seed + 1000 * d.rank + ckpt.meta["step"])
    except (KeyError, RuntimeError) as e:
        raise CheckpointError(
            f"{ckpt.tensors_path}: missing or malformed RNG state ({e})"
        ) from None
    saved = ckpt.meta
    history = saved["history"]
    return History(
        int(saved["step"]), saved["best_val_loss"], list(history["loss"]), list(history["evals"])
    )
