"""Checkpoints: safetensors for every tensor, JSON for everything else, nothing executable.

Checkpoint ``last`` in ``out`` is ``out/last.json`` (config, vocabulary, step, optimizer layout,
the tensors file's name and SHA-256, ``json_sha256`` of its other fields) and
``out/last-00000500-1a2b3c4d.safetensors`` (weights, moments, RNG states as uint8 tensors).
The tensors are written first under a fresh name, the JSON last: replacing the JSON is the one
atomic step from the old checkpoint to the new, so a kill at any instant leaves one of them
whole. Tied tensors are stored once (``tied``). Format 1 (gptblock 0.1, 0.2) still loads, with
a warning that its fields carry no hash. docs/running.md says why each choice was made.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import uuid
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

import safetensors.torch
import torch

from ..errors import UserFileExistsError, UserFileNotFoundError, UserTypeError, UserValueError
from ..files import atomic_write_bytes, atomic_write_json, temporary_of
from .owned import is_written, record_written, written

__all__ = [
    "BEST",
    "KINDS",
    "LAST",
    "Checkpoint",
    "CheckpointError",
    "check_same_field",
    "checkpoint_path",
    "holds_run",
    "is_count",
    "is_finite_number",
    "is_tensors_file",
    "load_checkpoint",
    "require_fields",
    "run_exists_error",
    "save_checkpoint",
]

FORMAT = "gptblock-checkpoint"
VERSION = 2  # what save_checkpoint writes
READABLE = (1, 2)  # what load_checkpoint reads; 1 has no json_sha256 and no tied tensors
LAST = "last"  # the newest state of a run: what --resume continues
BEST = "best"  # the state with the lowest validation estimate: what sample and load_gpt read
KINDS = (LAST, BEST)
REQUIRED = ("format", "version", "tensors", "sha256", "step")
JSON_HASH = "json_sha256"  # the field holding the hash of all the others
SHA256 = re.compile(r"[0-9a-f]{64}")
TENSORS_FILE = re.compile(r"(last|best)-\d{8,}-[0-9a-f]{8}\.safetensors")


class CheckpointError(UserValueError):
    """A checkpoint that is missing, truncated, corrupted, malformed or from another model."""


@dataclass(frozen=True)
class Checkpoint:
    """One loaded checkpoint: its JSON fields, its tensors and where they came from."""

    meta: dict[str, Any]  # every field of the JSON file
    tensors: dict[str, torch.Tensor]  # every tensor of the safetensors file, on the CPU
    path: Path  # the JSON file
    tensors_path: Path  # the safetensors file it names

    def require(self, *fields: str) -> None:
        """Raise ``CheckpointError`` naming the JSON file if any of ``fields`` is absent."""
        require_fields(self.meta, self.path, fields)


def require_fields(meta: Mapping[str, Any], where: object, fields: Sequence[str]) -> None:
    """Raise ``CheckpointError`` naming ``where`` and every one of ``fields`` absent."""
    missing = [f for f in fields if f not in meta]
    if missing:
        raise CheckpointError(f"{where}: missing field(s) {', '.join(missing)}")


def checkpoint_path(out_dir: str | os.PathLike[str], kind: str = LAST) -> Path:
    """The JSON file of checkpoint ``kind`` (``LAST`` or ``BEST``) in ``out_dir``.

    Example:
        >>> checkpoint_path("out", BEST).as_posix()
        'out/best.json'
    """
    if kind not in KINDS:
        raise UserValueError(f"checkpoint kind must be one of {KINDS}, got {kind!r}")
    return Path(out_dir) / f"{kind}.json"


def is_tensors_file(name: str, kind: str | None = None) -> bool:
    """Whether ``name`` is a tensors file ``save_checkpoint`` writes (of ``kind``, if given).

    Example:
        >>> is_tensors_file("last-00000500-1a2b3c4d.safetensors"), is_tensors_file("last.pt")
        (True, False)
    """
    match = TENSORS_FILE.fullmatch(name)
    return match is not None and kind in (None, match.group(1))


def holds_run(out_dir: str | os.PathLike[str] | None) -> bool:
    """Whether ``out_dir`` holds a ``LAST`` checkpoint, which a fresh run must never replace."""
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
    """Save ``tensors`` (tied ones once) and JSON ``meta`` (with an int ``step`` >= 0, no NaN)
    as checkpoint ``kind`` in ``out_dir`` (made if needed); return the JSON path.

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> w = torch.ones(2, 3)
        >>> p = save_checkpoint(d, "last", {"w": w, "same_w": w}, {"step": 7})
        >>> ckpt = load_checkpoint(d, "last")
        >>> ckpt.meta["step"], ckpt.tensors["w"].shape, ckpt.meta["tied"], ckpt.path == p
        (7, torch.Size([2, 3]), {'same_w': 'w'}, True)
    """
    json_path = checkpoint_path(out_dir, kind)
    step = meta.get("step")
    if isinstance(step, bool) or not isinstance(step, int):
        raise UserTypeError(f"meta['step'] must be an int, got {step!r}")
    if step < 0:
        raise UserValueError(f"meta['step'] must be >= 0, got {step}")
    reserved = sorted({"format", "version", "tensors", "sha256", "tied", JSON_HASH} & set(meta))
    if reserved:
        raise UserValueError(f"meta must not set the checkpoint's own fields {reserved}")
    cpu, tied = _store_once(tensors)
    blob = safetensors.torch.save(cpu)
    record: dict[str, Any] = {
        **meta,
        "format": FORMAT,
        "version": VERSION,
        "tensors": f"{kind}-{step:08d}-{uuid.uuid4().hex[:8]}.safetensors",
        "sha256": hashlib.sha256(blob).hexdigest(),
        "tied": tied,
    }
    # Hash the fields as a reader will parse them back (tuples become lists, and so on).
    record = json.loads(json.dumps(record, allow_nan=False))
    record[JSON_HASH] = _fields_sha256(record)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    previous = _tensors_named(json_path)  # ours to delete once replaced, recorded or not
    for name in (record["tensors"], json_path.name):  # recorded before they exist
        record_written(json_path.parent, name)
    # A fresh name each time: the file the current JSON names is never overwritten.
    atomic_write_bytes(json_path.parent / record["tensors"], blob)
    atomic_write_json(json_path, record)  # the commit point
    _remove_stale(json_path.parent, kind, keep=record["tensors"], previous=previous)
    return json_path


def _tensors_named(json_path: Path) -> str | None:
    try:
        name = json.loads(json_path.read_bytes()).get("tensors")
    except (OSError, ValueError, AttributeError):
        return None
    return name if isinstance(name, str) and is_tensors_file(name) else None


def _store_once(
    tensors: Mapping[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    cpu: dict[str, torch.Tensor] = {}
    tied: dict[str, str] = {}
    first: dict[tuple[Any, ...], str] = {}
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise UserTypeError(f"tensors[{name!r}] must be a torch.Tensor, got {type(t).__name__}")
        # The same memory seen the same way is the same tensor (an empty one shares nothing).
        view = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), t.shape, t.stride())
        key = (*view, t.dtype)
        if t.numel() > 0 and key in first:
            tied[name] = first[key]
            continue
        first[key] = name
        # Cloning to the CPU also unties storage shared otherwise, which safetensors refuses.
        cpu[name] = t.detach().to("cpu", copy=True).contiguous()
    return cpu, tied


def _fields_sha256(record: Mapping[str, Any]) -> str:
    fields = {k: v for k, v in record.items() if k != JSON_HASH}
    text = json.dumps(
        fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _remove_stale(directory: Path, kind: str, keep: str, previous: str | None) -> None:
    # Tensors files of this kind that the JSON no longer names, and temporaries of killed saves:
    # only files a run recorded writing (gptblock.runs.owned) and the one the replaced JSON
    # named, never another file that merely looks similar.
    recorded = written(directory) | ({previous} if previous else set())
    for p in directory.iterdir():
        of = temporary_of(p.name)
        stale = is_tensors_file(p.name, kind) or (
            of is not None and (of == f"{kind}.json" or is_tensors_file(of, kind))
        )
        if stale and p.name != keep and is_written(p.name, recorded):
            with contextlib.suppress(OSError):
                p.unlink()


def load_checkpoint(out_dir: str | os.PathLike[str], kind: str = LAST) -> Checkpoint:
    """Load and verify checkpoint ``kind`` from ``out_dir``: a ``CheckpointError`` naming the
    file for anything malformed, changed or corrupted, ``FileNotFoundError`` if absent."""
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
    meta = _read_fields(json_path, raw)
    tensors_path = json_path.parent / meta["tensors"]
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
    tied = meta.get("tied", {})
    if not isinstance(tied, dict) or not all(
        isinstance(a, str) and a not in tensors and t in tensors for a, t in tied.items()
    ):
        raise CheckpointError(
            f"{json_path}: field 'tied' must map names absent from {tensors_path.name} to "
            f"names in it, got {tied!r:.120}"
        )
    tensors.update({alias: tensors[target] for alias, target in tied.items()})
    return Checkpoint(meta, tensors, json_path, tensors_path)


def _read_fields(json_path: Path, raw: bytes) -> dict[str, Any]:
    try:
        meta = json.loads(raw.decode("utf-8"), parse_constant=_not_json, parse_float=_finite)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:  # JSONDecodeError: ValueError
        raise CheckpointError(f"{json_path}: not valid JSON ({e})") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{json_path}: expected a JSON object, got {type(meta).__name__}")
    require_fields(meta, json_path, REQUIRED)
    if meta["format"] != FORMAT or meta["version"] not in READABLE:
        raise CheckpointError(
            f"{json_path}: format {meta['format']!r} version {meta['version']!r} is not "
            f"{FORMAT!r} version {' or '.join(map(str, READABLE))} (a newer gptblock may read it)"
        )
    if meta["version"] >= 2:
        if not isinstance(meta.get(JSON_HASH), str):
            raise CheckpointError(f"{json_path}: missing field(s) {JSON_HASH}")
        if _fields_sha256(meta) != meta[JSON_HASH]:
            raise CheckpointError(
                f"{json_path}: its fields were changed after it was written (their SHA-256 "
                f"differs from its {JSON_HASH}); restore the file or train again"
            )
    else:
        # The default warning filter shows one text once: once per file.
        warnings.warn(
            f"{json_path} is a format-1 checkpoint (gptblock 0.2 or earlier): its tensors are "
            f"verified, its JSON fields cannot be (they carry no hash)",
            UserWarning,
            stacklevel=4,
        )
    name = meta["tensors"]
    # The JSON names a file next to itself, never a path elsewhere.
    if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
        raise CheckpointError(f"{json_path}: field 'tensors' must be a file name, got {name!r}")
    if not isinstance(meta["sha256"], str) or not SHA256.fullmatch(meta["sha256"]):
        raise CheckpointError(f"{json_path}: field 'sha256' must be a SHA-256 hex digest")
    step = meta["step"]
    if not is_count(step):
        raise CheckpointError(f"{json_path}: field 'step' must be an int >= 0, got {step!r:.40}")
    return meta


def is_count(value: object) -> TypeGuard[int]:
    """Whether ``value`` is an int >= 0 (a bool is not): a step, a size, a count."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def is_finite_number(value: object) -> bool:
    """Whether ``value`` is a finite int or float (a bool is not): a loss, a hyperparameter."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _not_json(constant: str) -> Any:
    # Python's json module reads NaN and Infinity, which JSON has not: a checkpoint never holds one.
    raise ValueError(f"{constant} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)  # 1e999 parses as inf
    if not math.isfinite(value):
        raise ValueError(f"{text} is beyond a float's range")
    return value


def check_same_field(ckpt: Checkpoint, field: str, saved: Any, current: Any) -> None:
    """Raise ``CheckpointError`` if the checkpoint's ``field`` differs from this run's (a dict's
    differing keys named with both values); nothing is checked when either side is None."""
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
