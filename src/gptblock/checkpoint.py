"""Checkpoints: safetensors for every tensor, JSON for everything else, nothing executable.

A checkpoint named ``last`` in directory ``out`` is two files::

    out/last.json                              config, vocabulary, step, optimizer layout, ...
    out/last-00000500-1a2b3c4d.safetensors     weights, optimizer moments, RNG states

Loading never runs code from the files: ``torch.load`` (pickle) is not used anywhere, and
RNG states are stored as the uint8 tensors PyTorch itself returns.

Crash safety. Each file is written to a temporary file in the same directory, flushed and
fsynced, then moved into place with ``os.replace``, which is atomic. The pair is kept
consistent by writing the tensors first under a fresh, never reused name, and the JSON last:
the JSON names its tensors file and holds its SHA-256, so replacing the JSON is the single
atomic step that switches from the old checkpoint to the new one. Until that moment the old
JSON still names the old tensors file, which is deleted only afterwards. A process killed at
any instant therefore leaves either the old or the new checkpoint, complete; at worst an
unreferenced tensors file or temporary file, which the next save removes. Rejected: writing
``last.safetensors`` and ``last.json`` in place one after the other (a crash between the two
leaves a mismatched pair), and swapping whole directories (no portable atomic replace of a
non-empty directory).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
import torch.nn as nn

from .errors import UserFileExistsError, UserFileNotFoundError, UserTypeError, UserValueError
from .files import atomic_write_bytes, atomic_write_json

__all__ = [
    "BEST",
    "KINDS",
    "LAST",
    "Checkpoint",
    "CheckpointError",
    "check_same_field",
    "checkpoint_path",
    "holds_run",
    "load_checkpoint",
    "load_model_state",
    "load_optimizer_state",
    "optimizer_parts",
    "run_exists_error",
    "save_checkpoint",
]

FORMAT = "gptblock-checkpoint"
VERSION = 1
LAST = "last"  # the newest state of a run: what --resume continues
BEST = "best"  # the state with the lowest validation estimate: what sample and load_gpt read
KINDS = (LAST, BEST)
REQUIRED = ("format", "version", "tensors", "sha256", "step")


class CheckpointError(UserValueError):
    """A checkpoint that is missing, truncated, corrupted, malformed or from another model.

    The message names the file and the problem. A ``UserError`` (and a ``ValueError``), so the
    command line reports it as one line.
    """


@dataclass(frozen=True)
class Checkpoint:
    """One loaded checkpoint: its JSON fields, its tensors and where they came from."""

    meta: dict[str, Any]  # every field of the JSON file
    tensors: dict[str, torch.Tensor]  # every tensor of the safetensors file, on the CPU
    path: Path  # the JSON file
    tensors_path: Path  # the safetensors file it names

    def require(self, *fields: str) -> None:
        """Raise ``CheckpointError`` naming the JSON file if any of ``fields`` is absent."""
        missing = [f for f in fields if f not in self.meta]
        if missing:
            raise CheckpointError(f"{self.path}: missing field(s) {', '.join(missing)}")


def checkpoint_path(out_dir: str | os.PathLike[str], kind: str = LAST) -> Path:
    """The JSON file of checkpoint ``kind`` (``LAST`` or ``BEST``) in ``out_dir``.

    Example:
        >>> checkpoint_path("out", BEST).as_posix()
        'out/best.json'
    """
    if kind not in KINDS:
        raise UserValueError(f"checkpoint kind must be one of {KINDS}, got {kind!r}")
    return Path(out_dir) / f"{kind}.json"


def holds_run(out_dir: str | os.PathLike[str] | None) -> bool:
    """Whether ``out_dir`` holds a training run: a ``LAST`` checkpoint, which a fresh run must
    never replace."""
    return out_dir is not None and checkpoint_path(out_dir, LAST).exists()


def run_exists_error(out_dir: str | os.PathLike[str]) -> UserFileExistsError:
    """The error for starting a fresh run where ``holds_run(out_dir)``."""
    return UserFileExistsError(
        f"{out_dir} already holds a training run; pass --resume (resume=True) to continue it, "
        f"or choose another --out (or delete {out_dir})"
    )


def save_checkpoint(
    out_dir: str | os.PathLike[str],
    kind: str,
    tensors: Mapping[str, torch.Tensor],
    meta: Mapping[str, Any],
) -> Path:
    """Save ``tensors`` and the JSON-ready ``meta`` as checkpoint ``kind``; return the JSON path.

    Args:
        out_dir: the directory (created if needed).
        kind: "last" or "best".
        tensors: name -> tensor; copied to the CPU. Tensors that share memory (tied weights)
            are stored once each, as safetensors requires.
        meta: must hold ``step`` (int); everything else is free-form JSON (no NaN or inf:
            ``best_val_loss`` and the like must be finite or None).

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> p = save_checkpoint(d, "last", {"w": torch.ones(2, 3)}, {"step": 7})
        >>> ckpt = load_checkpoint(d, "last")
        >>> ckpt.meta["step"], ckpt.tensors["w"].shape, ckpt.path == p
        (7, torch.Size([2, 3]), True)
    """
    json_path = checkpoint_path(out_dir, kind)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    step = meta.get("step")
    if isinstance(step, bool) or not isinstance(step, int):
        raise UserTypeError(f"meta['step'] must be an int, got {step!r}")
    # Cloning to the CPU also unties shared storage, which safetensors refuses to save.
    cpu = {name: t.detach().to("cpu", copy=True).contiguous() for name, t in tensors.items()}
    blob = safetensors.torch.save(cpu)
    # A fresh name each time: the file the current JSON names is never overwritten.
    tensors_name = f"{kind}-{step:08d}-{uuid.uuid4().hex[:8]}.safetensors"
    atomic_write_bytes(json_path.parent / tensors_name, blob)
    record = {
        **meta,
        "format": FORMAT,
        "version": VERSION,
        "tensors": tensors_name,
        "sha256": hashlib.sha256(blob).hexdigest(),
    }
    atomic_write_json(json_path, record)  # the commit point
    _remove_stale(json_path.parent, kind, keep=tensors_name)
    return json_path


def _remove_stale(directory: Path, kind: str, keep: str) -> None:
    # Tensors files of this kind that the JSON no longer names, and temporaries of killed saves.
    stale = [*directory.glob(f"{kind}-*.safetensors"), *directory.glob(f".{kind}[-.]*.tmp")]
    for p in stale:
        if p.name != keep:
            with contextlib.suppress(OSError):
                p.unlink()


def load_checkpoint(out_dir: str | os.PathLike[str], kind: str = LAST) -> Checkpoint:
    """Load and verify checkpoint ``kind`` from ``out_dir``.

    Raises:
        FileNotFoundError: there is no ``kind`` checkpoint in ``out_dir``.
        CheckpointError: the JSON does not parse or lacks a field, the tensors file is missing,
            truncated or corrupted (its SHA-256 differs from the one the JSON recorded), or
            it is not a safetensors file. The message names the file.
    """
    json_path = checkpoint_path(out_dir, kind)
    # A training run may commit a new checkpoint (and delete the old tensors file) between our
    # reading the JSON and its tensors file: then the JSON has changed, and we read it again.
    for _ in range(3):
        if not json_path.is_file():
            raise UserFileNotFoundError(
                f"no {kind} checkpoint in {Path(out_dir)}: {json_path} not found"
            )
        raw = json_path.read_bytes()
        try:
            return _load(json_path, raw)
        except CheckpointError:
            if json_path.read_bytes() == raw:
                raise
    return _load(json_path, json_path.read_bytes())


def _load(json_path: Path, raw: bytes) -> Checkpoint:
    try:
        meta = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{json_path}: not valid JSON ({e})") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{json_path}: expected a JSON object, got {type(meta).__name__}")
    missing = [f for f in REQUIRED if f not in meta]
    if missing:
        raise CheckpointError(f"{json_path}: missing field(s) {', '.join(missing)}")
    if meta["format"] != FORMAT or meta["version"] != VERSION:
        raise CheckpointError(
            f"{json_path}: format {meta['format']!r} version {meta['version']!r} is not "
            f"{FORMAT!r} version {VERSION}"
        )
    name = meta["tensors"]
    # The JSON names a file next to itself, never a path elsewhere.
    if not isinstance(name, str) or Path(name).name != name or not name:
        raise CheckpointError(f"{json_path}: field 'tensors' must be a file name, got {name!r}")
    tensors_path = json_path.parent / name
    if not tensors_path.is_file():
        raise CheckpointError(f"{json_path}: its tensors file {tensors_path} is missing")
    blob = tensors_path.read_bytes()
    if hashlib.sha256(blob).hexdigest() != meta["sha256"]:
        raise CheckpointError(
            f"{tensors_path}: truncated or corrupted ({len(blob)} bytes; its SHA-256 "
            f"differs from the one recorded in {json_path.name})"
        )
    try:
        tensors = safetensors.torch.load(blob)
    except Exception as e:  # safetensors raises its own SafetensorError
        raise CheckpointError(f"{tensors_path}: not a readable safetensors file ({e})") from None
    return Checkpoint(meta, tensors, json_path, tensors_path)


def load_model_state(module: nn.Module, ckpt: Checkpoint, prefix: str = "model.") -> None:
    """Copy the checkpoint's ``prefix``-named tensors into ``module``, checking names and shapes.

    Raises:
        CheckpointError: naming the tensors file and every missing, unexpected or
            differently shaped tensor (a checkpoint of a different model).
    """
    saved = {k[len(prefix) :]: v for k, v in ckpt.tensors.items() if k.startswith(prefix)}
    expected = module.state_dict()
    problems = [f"missing {k} {tuple(v.shape)}" for k, v in expected.items() if k not in saved]
    problems += [f"unexpected {k}" for k in saved if k not in expected]
    problems += [
        f"{k} has shape {tuple(saved[k].shape)}, the model expects {tuple(v.shape)}"
        for k, v in expected.items()
        if k in saved and saved[k].shape != v.shape
    ]
    if problems:
        shown = "; ".join(problems[:6]) + (
            f"; and {len(problems) - 6} more" if len(problems) > 6 else ""
        )
        raise CheckpointError(f"{ckpt.tensors_path}: does not fit this model: {shown}")
    module.load_state_dict(saved, strict=True)


def optimizer_parts(
    optimizer: torch.optim.Optimizer, prefix: str = "optim."
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Split ``optimizer.state_dict()`` into tensors (for safetensors) and JSON.

    Tensors are named ``{prefix}{param index}.{key}`` (for AdamW: ``exp_avg``,
    ``exp_avg_sq`` and ``step``); the param groups (hyperparameters and which parameters each
    group holds) and any non-tensor state go to the JSON.
    """
    sd = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for idx, state in sd["state"].items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{prefix}{idx}.{key}"] = value
            else:
                scalars.setdefault(str(idx), {})[key] = value
    groups = []
    for group in sd["param_groups"]:
        for key, value in group.items():
            if isinstance(value, torch.Tensor):
                raise TypeError(
                    f"optimizer hyperparameter {key!r} is a tensor; checkpoints store "
                    f"hyperparameters as JSON numbers"
                )
        groups.append(dict(group))
    return tensors, {"param_groups": groups, "state_scalars": scalars}


def load_optimizer_state(
    optimizer: torch.optim.Optimizer, ckpt: Checkpoint, prefix: str = "optim."
) -> None:
    """Restore the state saved by ``optimizer_parts`` from ``ckpt`` (field ``optimizer``).

    Raises:
        CheckpointError: naming the file, when the saved parameter groups do not match the
            optimizer's (another model, or another optimizer).
    """
    ckpt.require("optimizer")
    saved = ckpt.meta["optimizer"]
    try:
        groups = [
            {k: tuple(v) if k == "betas" else v for k, v in g.items()}
            for g in saved["param_groups"]
        ]
        state: dict[int, dict[str, Any]] = {}
        for name, t in ckpt.tensors.items():
            if name.startswith(prefix):
                index, key = name[len(prefix) :].split(".", 1)
                state.setdefault(int(index), {})[key] = t
        for index, values in saved["state_scalars"].items():
            state.setdefault(int(index), {}).update(values)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise CheckpointError(f"{ckpt.path}: malformed optimizer state ({e!r})") from None
    shape = [len(g["params"]) for g in optimizer.param_groups]
    if [len(g.get("params", ())) for g in groups] != shape:
        raise CheckpointError(
            f"{ckpt.path}: optimizer parameter groups of sizes "
            f"{[len(g.get('params', ())) for g in groups]} do not match this model's {shape}"
        )
    # state_dict() numbers the parameters in group order; moments have their parameter's shape.
    params = [p for g in optimizer.param_groups for p in g["params"]]
    for idx, values in sorted(state.items()):
        for key, t in sorted(values.items()):
            if not 0 <= idx < len(params):
                raise CheckpointError(
                    f"{ckpt.tensors_path}: optimizer state for parameter {idx}, which this model lacks"
                )
            if isinstance(t, torch.Tensor) and t.dim() > 0 and t.shape != params[idx].shape:
                raise CheckpointError(
                    f"{ckpt.tensors_path}: {prefix}{idx}.{key} has shape {tuple(t.shape)}, "
                    f"its parameter has {tuple(params[idx].shape)}"
                )
    try:
        optimizer.load_state_dict({"state": state, "param_groups": groups})
    except (ValueError, KeyError, RuntimeError) as e:
        raise CheckpointError(f"{ckpt.tensors_path}: optimizer state does not fit ({e})") from None


def check_same_field(ckpt: Checkpoint, field: str, saved: Any, current: Any) -> None:
    """Raise ``CheckpointError`` if the checkpoint's ``field`` differs from this run's.

    For dicts (a model config) the message names every differing key with both values, so
    resuming another model's run says what differs instead of failing on a tensor shape.
    Nothing is checked when either side is None.
    """
    if saved is None or current is None or saved == current:
        return
    if isinstance(saved, dict) and isinstance(current, dict):
        keys = sorted(set(saved) | set(current))
        diffs = [
            f"{k}={saved.get(k)!r} in the checkpoint, {current.get(k)!r} now"
            for k in keys
            if saved.get(k) != current.get(k)
        ]
        raise CheckpointError(f"{ckpt.path}: a different {field}: {'; '.join(diffs)}")
    raise CheckpointError(
        f"{ckpt.path}: a different {field} (the checkpoint's has {len(saved)} entries, this "
        f"run's {len(current)}); resume with the same data and model"
    )
