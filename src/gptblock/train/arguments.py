"""What the ``Trainer`` refuses before it builds anything, each refusal naming the argument
(rather than a failure mid-run, or at the first checkpoint, about something else).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import cast

import torch.nn as nn

from ..data.batches import TokenSplits
from ..errors import UserTypeError, UserValueError
from .config import TrainConfig

__all__ = ["check_arguments"]


def check_arguments(
    model: object, data: object, config: object, out_dir: object, meta: object
) -> None:
    """Refuse the ``Trainer``'s arguments where they cannot work, naming the argument."""
    for name, value, kind, what in (
        ("model", model, nn.Module, "a torch.nn.Module"),
        ("data", data, TokenSplits, "a gptblock.data.batches.TokenSplits"),
        ("config", config, TrainConfig, "a TrainConfig"),
        ("out_dir", out_dir, (str, os.PathLike, type(None)), "a path or None"),
    ):
        if not isinstance(value, kind):
            raise UserTypeError(f"{name} must be {what}, got {type(value).__name__}")
    splits = cast(TokenSplits, data)
    block_size = cast(TrainConfig, config).block_size
    for name, part in (("training", splits.train), ("validation", splits.val)):
        if len(part) <= block_size:
            raise UserValueError(
                f"the {name} data has {len(part)} tokens; a window of block_size="
                f"{block_size} needs {block_size + 1}"
            )
    if not any(p.requires_grad for p in cast(nn.Module, model).parameters()):
        raise UserValueError("the model has no trainable parameters: there is nothing to train")
    if isinstance(meta, Mapping | None):
        fields = dict(meta or {})
    elif hasattr(meta, "check_resume") and hasattr(meta, "to_json"):
        fields = meta.to_json()
    else:
        raise UserTypeError(
            f"meta must be a mapping of JSON fields or a RunMetadata, got {type(meta).__name__}"
        )
    try:  # now, rather than at the first checkpoint
        json.dumps(fields, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise UserTypeError(
            f"meta must be JSON: strings, finite numbers, lists, dicts ({e})"
        ) from None
