"""Reading a block's state_dict into the oracle's ``params`` (the key mapping is ``layout``'s)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .layout import (
    IN_PROJ,
    LESSON_ANCHOR,
    LESSON_RENAMES,
    LESSON_TRIL,
    PARAM_KEYS,
    lesson_head,
    lesson_head_count,
    lesson_qkv_keys,
)
from .pieces import Array


def params_from_state_dict(state_dict: Mapping[str, Any], *, prefix: str = "") -> dict[str, Array]:
    """Turn a block's state_dict into ``params`` for ``block_forward``: float64 NumPy copies.

    The lesson's ``Block``'s per-head weights are stacked into ``in_proj_weight``, with no
    ``in_proj_bias`` (zero; its MLP is ReLU: ``activation="relu"``). Values may be torch
    tensors or anything ``np.asarray`` takes; the mapping is linear, so it maps gradients too.
    Only keys under ``prefix`` (``"blocks.0."``) are read.

    Example:
        >>> C, hs = 8, 4
        >>> sd = {f"sa.heads.{i}.{n}.weight": np.full((hs, C), 10 * i + j)
        ...       for i in range(2) for j, n in enumerate(("query", "key", "value"))}
        >>> shapes = {"ln1": (C,), "sa.proj": (C, C), "ln2": (C,), "ffwd.net.0": (4 * C, C),
        ...           "ffwd.net.2": (C, 4 * C)}
        >>> sd |= {f"{name}.weight": np.ones(shape) for name, shape in shapes.items()}
        >>> params = params_from_state_dict(sd)
        >>> params["self_attn.in_proj_weight"][::hs, 0].tolist()  # q0 q1 k0 k1 v0 v1
        [0.0, 10.0, 1.0, 11.0, 2.0, 12.0]
        >>> "self_attn.in_proj_bias" in params
        False
    """
    sd = {key[len(prefix) :]: value for key, value in state_dict.items() if key.startswith(prefix)}
    if IN_PROJ[0] in sd:
        out = {key: _to_float64(sd.pop(key)) for key in PARAM_KEYS if key in sd}
    elif LESSON_ANCHOR in sd:
        out = _from_lesson_layout(sd)
    else:
        raise ValueError(
            f"no block parameters found under prefix {prefix!r}: expected "
            f"'{prefix}{IN_PROJ[0]}' (TransformerBlock / nn.TransformerEncoderLayer names) or "
            f"'{prefix}{LESSON_ANCHOR}' (the lesson's Block); got keys {sorted(sd)[:6]}"
        )
    if sd:
        raise ValueError(f"unexpected keys for a block's state_dict: {sorted(sd)}")
    missing = [key for key in PARAM_KEYS if key.endswith("weight") and key not in out]
    if missing:
        raise ValueError(f"the state_dict has no {missing} (after prefix {prefix!r})")
    return out


def _to_float64(value: Any) -> Array:
    if hasattr(value, "detach"):  # a torch.Tensor, recognised without importing torch
        value = value.detach().cpu().double().numpy()
    # A copy, never a view: the oracle must not alias (or be changed by) a module's weights.
    return np.array(value, dtype=np.float64)


def _from_lesson_layout(sd: dict[str, Any]) -> dict[str, Array]:
    """The lesson's keys, popped from ``sd``, as packed ``params``."""
    nh = lesson_head_count(sd)
    qkv = lesson_qkv_keys(nh)
    if any(key not in sd for key in qkv):
        raise ValueError(
            f"the lesson's Block has {nh} heads, but its state_dict lacks some of {qkv}"
        )
    # 3 * nh blocks of (hs, C), q of heads 0..nh-1, then k, then v -> (3C, C)
    out = {IN_PROJ[0]: np.concatenate([_to_float64(sd.pop(key)) for key in qkv])}
    for i in range(nh):
        sd.pop(lesson_head(i) + LESSON_TRIL, None)  # the causal mask buffer, not a parameter
    for old, new in LESSON_RENAMES.items():
        for kind in ("weight", "bias"):
            if f"{old}.{kind}" in sd:
                out[f"{new}.{kind}"] = _to_float64(sd.pop(f"{old}.{kind}"))
    return {key: out[key] for key in PARAM_KEYS if key in out}
