"""The ``--map`` arguments to suggest when the checker could not read a block's weights itself.

``suggest_map`` lists the block's weight-holding parts (``gptblock.check.parts.discover``) and
gives them the roles in the order the lessons' block registers them: the first two norms are
``ln1`` and ``ln2``; four matrices are ``qkv proj fc1 fc2``, six ``q k v proj fc1 fc2``. The
suggestion is only offered when, passed back as ``--map``, it gives the role mapping a reading
it can compare (``gptblock.check.mapping.map_roles`` accepts it): the user then only has to
check that the roles are right, or swap the names that are not.
"""

from __future__ import annotations

import torch.nn as nn

from .mapping import MappedBlock, map_roles, resolve_roles
from .parts import discover

__all__ = ["suggest_map"]

ORDERS = {4: ("qkv", "proj", "fc1", "fc2"), 6: ("q", "k", "v", "proj", "fc1", "fc2")}


def suggest_map(module: nn.Module, C: int) -> str:
    """``--map ROLE=NAME ...`` for ``module`` by registration order, or "" if none fits.

    Example:
        >>> from gptblock import lesson
        >>> suggest_map(lesson.Block(16, 2, 8), 16)  # one module per head: no fixed order fits
        ''
    """
    parts = discover(module)
    norms = [p for p in parts if p.kind == "norm"][:2]
    matrices = [p for p in parts if p.kind in ("linear", "matrix")]
    order = ORDERS.get(len(matrices))
    if order is None:
        return ""
    roles = {f"ln{i + 1}": p.name for i, p in enumerate(norms)}
    roles.update({role: p.name for role, p in zip(order, matrices, strict=True)})
    try:
        fixed = resolve_roles(parts, roles)
    except ValueError:
        return ""
    if not isinstance(map_roles(module, C, parts, {}, fixed), MappedBlock):
        return ""
    return "--map " + " ".join(f"{r}={n}" for r, n in roles.items())
