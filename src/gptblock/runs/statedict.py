"""A module's and an optimizer's state in a ``Checkpoint``, checked on the way in.

Loading refuses what ``load_state_dict`` would take silently or fail on cryptically: tensors of
another model (each named), tied names holding two values, NaN or infinite parameters or
moments, and optimizer hyperparameters of another kind than the optimizer's own.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from .checkpoint import Checkpoint, CheckpointError, is_count, is_finite_number

__all__ = ["load_model_state", "load_optimizer_state", "optimizer_parts"]


def load_model_state(module: nn.Module, ckpt: Checkpoint, prefix: str = "model.") -> None:
    """Copy the checkpoint's ``prefix``-named tensors into ``module``, after checking them."""
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
    for names in _tied_names(expected):
        first = names[0]
        for other in names[1:]:
            a, b = saved[first], saved[other]
            if not _same_values(a, b):
                raise CheckpointError(
                    f"{ckpt.tensors_path}: {prefix}{first} and {prefix}{other} are one tensor "
                    f"in the model (tied) but hold different values here"
                )
    for name, _ in module.named_parameters(remove_duplicate=False):
        _check_finite(ckpt, f"{prefix}{name}", saved[name])
    module.load_state_dict(saved, strict=True)


def _tied_names(state: dict[str, torch.Tensor]) -> list[list[str]]:
    groups: dict[tuple[Any, ...], list[str]] = {}
    for name, t in state.items():
        if t.numel() > 0:
            key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), t.shape)
            groups.setdefault(key, []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    # NaN equals NaN here: a NaN in both copies is a non-finite weight, reported as such.
    if a.dtype != b.dtype or not a.is_floating_point():
        return a.dtype == b.dtype and torch.equal(a, b)
    return bool(torch.allclose(a, b, rtol=0, atol=0, equal_nan=True))


def _check_finite(ckpt: Checkpoint, name: str, t: torch.Tensor) -> None:
    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
        bad = int((~torch.isfinite(t)).sum())
        raise CheckpointError(
            f"{ckpt.tensors_path}: {name} holds {bad} NaN or infinite value(s); a run never "
            f"saves such a state, so the file was damaged or written by something else"
        )


def _check_state_tensor(ckpt: Checkpoint, name: str, t: torch.Tensor) -> None:
    # A moment is a float tensor of its parameter's shape (checked by the caller); a step is
    # a float scalar (torch's AdamW), >= 0 and whole.
    if not t.is_floating_point():
        raise CheckpointError(f"{ckpt.tensors_path}: {name} must be a float tensor, got {t.dtype}")
    _check_finite(ckpt, name, t)
    if name.endswith(".step") and not (t.dim() == 0 and t >= 0 and t == t.round()):
        raise CheckpointError(
            f"{ckpt.tensors_path}: {name} must be a step count, got {t.tolist()!r:.40}"
        )


def optimizer_parts(
    optimizer: torch.optim.Optimizer, prefix: str = "optim."
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """``optimizer.state_dict()`` as tensors named ``{prefix}{param index}.{key}`` and JSON (the
    param groups and any non-tensor state)."""
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
    """Restore the state saved by ``optimizer_parts`` from ``ckpt`` (field ``optimizer``)."""
    ckpt.require("optimizer")
    saved = ckpt.meta["optimizer"]
    try:
        groups = [
            {k: tuple(v) if k == "betas" and isinstance(v, list) else v for k, v in g.items()}
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
    # Which parameters each group holds, as state_dict() numbers them: the same, in order (a
    # group listing one parameter six times would have torch step it six times).
    own = [g["params"] for g in optimizer.state_dict()["param_groups"]]
    for i, (indices, theirs) in enumerate(zip(own, groups, strict=True)):
        if theirs.get("params") != indices:
            raise CheckpointError(
                f"{ckpt.path}: optimizer group {i} lists parameters {theirs.get('params')!r:.60}, "
                f"this model's optimizer {indices!r:.60}"
            )
    for i, (mine, theirs) in enumerate(zip(optimizer.param_groups, groups, strict=True)):
        for key, value in mine.items():
            if key != "params" and key in theirs and not _same_kind(value, theirs[key]):
                raise CheckpointError(
                    f"{ckpt.path}: optimizer group {i} has {key}={theirs[key]!r:.40}, which is "
                    f"not of the kind of this optimizer's {value!r:.40}"
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
            if isinstance(t, torch.Tensor):
                _check_state_tensor(ckpt, f"{prefix}{idx}.{key}", t)
            elif not is_count(t):  # a count: step
                raise CheckpointError(
                    f"{ckpt.path}: optimizer state {idx}.{key} must be an int >= 0 (a step "
                    f"count), got {t!r:.40}"
                )
    try:
        optimizer.load_state_dict({"state": state, "param_groups": groups})
    except (ValueError, KeyError, RuntimeError) as e:
        raise CheckpointError(f"{ckpt.tensors_path}: optimizer state does not fit ({e})") from None


def _same_kind(mine: object, saved: object) -> bool:
    # A finite number for a number, a flag (or None) for a flag, a tuple of as many numbers.
    if mine is None or isinstance(mine, bool):
        return saved is None or isinstance(saved, bool)
    if is_finite_number(mine):
        return is_finite_number(saved)
    if isinstance(mine, tuple):
        return (
            isinstance(saved, tuple)
            and len(saved) == len(mine)
            and all(map(is_finite_number, saved))
        )
    return type(saved) is type(mine)
