"""Loading a state_dict written under another convention's names: Meta's Llama (``w1``, ``w2``,
``w3``; ``wq``, ``wk``, ``wv``, ``wo``) into modules named as Hugging Face's.

``accept_aliases(module, {"w1": "gate_proj", ...})`` registers a ``load_state_dict`` pre-hook
that renames the module's own entries ``PREFIX.w1.weight`` to ``PREFIX.gate_proj.weight`` before
loading, so either naming loads (strictly: an unknown name is still an error), while
``state_dict()`` always writes the module's own names. Rejected: a second set of attribute names
(two parameters for one weight), and a ``from_meta`` constructor per module (one per naming).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch.nn as nn

__all__ = ["accept_aliases"]


def accept_aliases(module: nn.Module, aliases: Mapping[str, str]) -> None:
    """Let ``module.load_state_dict`` take ``aliases``' names for its children (alias -> own).

    Example:
        >>> import torch
        >>> m = nn.Module(); m.gate_proj = nn.Linear(2, 2, bias=False)
        >>> accept_aliases(m, {"w1": "gate_proj"})
        >>> m.load_state_dict({"w1.weight": torch.eye(2)})
        <All keys matched successfully>
        >>> list(m.state_dict())
        ['gate_proj.weight']
    """
    table = dict(aliases)

    def rename(_: nn.Module, state_dict: dict[str, Any], prefix: str, *__: Any) -> None:
        for key in [k for k in state_dict if k.startswith(prefix)]:
            head, dot, rest = key[len(prefix) :].partition(".")
            if head in table and dot and f"{prefix}{table[head]}.{rest}" not in state_dict:
                state_dict[f"{prefix}{table[head]}.{rest}"] = state_dict.pop(key)

    module.register_load_state_dict_pre_hook(rename)  # type: ignore[no-untyped-call]
