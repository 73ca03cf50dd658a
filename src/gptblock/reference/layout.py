"""The block's parameter names: the packed layout every form but the lesson's uses, and the lesson's.

*Packed* is ``TransformerBlock``'s layout (and ``FusedBlock``'s and ``nn.TransformerEncoderLayer``'s):
q, k and v of every head in one (3C, C) ``self_attn.in_proj_weight``, the q rows of heads 0..nh-1
first, then the k rows, then the v rows. The lesson's ``Block`` keeps one bias-free ``Linear`` per
head and per q/k/v (``sa.heads.{i}.query.weight``, (hs, C)); stacking them in ``lesson_qkv_keys``
order gives the packed weight. ``convert`` and the model use the names too;
``params_from_state_dict`` reads a block's state_dict into the oracle's ``params``.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

Array = NDArray[np.float64]

# (weight, bias) keys of each of the block's parameterised modules, in the packed layout.
NORM1 = ("norm1.weight", "norm1.bias")
IN_PROJ = ("self_attn.in_proj_weight", "self_attn.in_proj_bias")  # q, k, v packed: (3C, C), (3C,)
OUT_PROJ = ("self_attn.out_proj.weight", "self_attn.out_proj.bias")
NORM2 = ("norm2.weight", "norm2.bias")
LINEAR1 = ("linear1.weight", "linear1.bias")
LINEAR2 = ("linear2.weight", "linear2.bias")
# Every key, in state_dict order.
PARAM_KEYS = tuple(
    key for pair in (NORM1, IN_PROJ, OUT_PROJ, NORM2, LINEAR1, LINEAR2) for key in pair
)

# The lesson's name for each module other than the q/k/v -> the packed layout's; each has a
# ``.weight`` and a ``.bias`` in both.
LESSON_RENAMES = {
    "ln1": "norm1",
    "sa.proj": "self_attn.out_proj",
    "ln2": "norm2",
    "ffwd.net.0": "linear1",
    "ffwd.net.2": "linear2",
}
LESSON_QKV = ("query", "key", "value")  # the per-head Linears, in the packed order of thirds
LESSON_TRIL = "tril"  # each head's causal-mask buffer: in the state_dict, but not a parameter


def lesson_head(i: int) -> str:
    """The prefix of head ``i``'s keys in the lesson's ``Block``.

    Example:
        >>> lesson_head(1) + "query.weight", lesson_head(1) + LESSON_TRIL
        ('sa.heads.1.query.weight', 'sa.heads.1.tril')
    """
    return f"sa.heads.{i}."


LESSON_ANCHOR = lesson_head(0) + "query.weight"  # a key only the lesson's layout has


def lesson_qkv_keys(n_head: int, kind: str = "weight") -> list[str]:
    """The lesson's per-head q/k/v keys (``kind``: weight or bias) in packed order: q of heads
    0..nh-1, then k, then v. Row block ``j`` of 3 * nh of the packed weight is key ``j``'s.

    Example:
        >>> lesson_qkv_keys(2)  # doctest: +NORMALIZE_WHITESPACE
        ['sa.heads.0.query.weight', 'sa.heads.1.query.weight', 'sa.heads.0.key.weight',
         'sa.heads.1.key.weight', 'sa.heads.0.value.weight', 'sa.heads.1.value.weight']
    """
    return [f"{lesson_head(i)}{name}.{kind}" for name in LESSON_QKV for i in range(n_head)]


def lesson_head_count(keys: Container[str], prefix: str = "") -> int:
    """How many heads a lesson state_dict's ``keys`` (under ``prefix``, e.g. ``"blocks.0."``)
    have: heads 0, 1, ... that have a query weight.

    Example:
        >>> lesson_head_count({"sa.heads.0.query.weight", "sa.heads.1.query.weight"})
        2
        >>> lesson_head_count({"ln1.weight"})
        0
    """
    n = 0
    while f"{prefix}{lesson_head(n)}query.weight" in keys:
        n += 1
    return n


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
