"""A module's state_dict under another convention's names: Hugging Face's Llama (``q_proj``,
``gate_proj``, ``input_layernorm`` ...) or Meta's (``wq``, ``w1``, ``attention_norm`` ...) over
gptblock's own modules (``linear1``, the packed ``in_proj_weight`` ...).

Two state_dict hooks rename the keys both ways, so one module computes and the conventions are
names only. Rejected: a module per convention (each with its own forward), and a second set of
attributes (two parameters for one weight).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.nn as nn

__all__ = ["rename_state"]

PACKED = ("in_proj_weight", "in_proj_bias")  # nn.MultiheadAttention's packed q; k; v


def _renamed(key: str, table: Mapping[str, str]) -> str:
    """``key`` with its longest leading module path found in ``table`` replaced."""
    parts = key.split(".")
    for i in range(len(parts) - 1, 0, -1):
        if (head := ".".join(parts[:i])) in table:
            return ".".join([table[head], *parts[i:]])
    return key


def rename_state(
    module: nn.Module,
    names: Mapping[str, str],
    aliases: Mapping[str, str] | None = None,
    pack: tuple[Sequence[str], Callable[[], list[int]]] | None = None,
) -> None:
    """Let ``module`` save under ``names`` (own module path -> theirs) and load under them or
    ``aliases`` (alias -> theirs; strict loading still names a stray key); with ``pack`` (their
    q, k, v module names and the rows of each), ``in_proj_*`` are saved split, loaded joined.

    Example:
        >>> m = nn.Module(); m.linear1 = nn.Linear(2, 2, bias=False)
        >>> rename_state(m, {"linear1": "gate_proj"}, {"w1": "gate_proj"})
        >>> list(m.state_dict())
        ['gate_proj.weight']
        >>> m.load_state_dict({"w1.weight": torch.eye(2)})
        <All keys matched successfully>
    """
    back = {theirs: own for own, theirs in names.items()}
    alias = dict(aliases or {})

    def save(_: nn.Module, state: dict[str, Any], prefix: str, *__: Any) -> None:
        keys = [key for key in state if key.startswith(prefix)]  # the module's, in order
        for key in keys:
            value, rel = state.pop(key), key[len(prefix) :]
            if pack is not None and rel in PACKED:
                kind = rel.rpartition("_")[2]  # weight or bias
                for name, part in zip(pack[0], torch.split(value, pack[1]()), strict=True):
                    state[f"{prefix}{name}.{kind}"] = part
            else:
                state[prefix + _renamed(rel, names)] = value

    def load(_: nn.Module, state: dict[str, Any], prefix: str, *__: Any) -> None:
        for key in [key for key in state if key.startswith(prefix)]:
            rel = _renamed(key[len(prefix) :], alias)
            state[prefix + _renamed(rel, back)] = state.pop(key)
        for kind, own in zip(("weight", "bias"), PACKED, strict=True):
            parts = [f"{prefix}{name}.{kind}" for name in pack[0]] if pack else []
            if parts and all(p in state for p in parts):
                state[prefix + own] = torch.cat([state.pop(p) for p in parts])

    module.register_state_dict_post_hook(save)  # type: ignore[no-untyped-call]
    module.register_load_state_dict_pre_hook(load)  # type: ignore[no-untyped-call]
