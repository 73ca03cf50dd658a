"""The ``--map`` arguments to suggest when the checker could not read a block's weights itself.

``suggest_map`` lists the block's weight-holding parts (``gptblock.check.parts.discover``) and
gives them the roles in the order the lessons' block registers them: the first two norms are
``ln1`` and ``ln2``; four matrices are ``qkv proj fc1 fc2``, six ``q k v proj fc1 fc2``. The
suggestion is only offered when, passed back as ``--map``, it gives the role mapping a reading
it can compare (``gptblock.check.mapping.map_roles`` accepts it): the user then only has to
check that the roles are right, or swap the names that are not.

A 3-D parameter, one matrix per head, that no module holds (TransformerLens's ``W_Q`` (nh, C,
hs), ``W_O`` (nh, hs, C)) takes its place among the matrices in registration order, written with
the layout that fits its role (``q=W_Q:in_out``, ``gptblock.check.given``).
"""

from __future__ import annotations

import torch.nn as nn

from .given import fix_roles, paired_bias
from .mapping import MappedBlock, map_roles
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
    named = dict(module.named_parameters())
    place = {n: i for i, n in enumerate(named)}
    per_head = {n: p for n, p in named.items() if p.dim() == 3}
    biases = {paired_bias(named, n, p) for n, p in per_head.items()}  # b_Q (nh, hs): no matrix
    matrices: list[tuple[int, str, tuple[int, ...] | None]] = [
        (place[p.params[0]], p.name, None)
        for p in parts
        if p.kind in ("linear", "matrix") and p.params[0] not in biases
    ]
    matrices += [(place[n], n, tuple(p.shape)) for n, p in per_head.items()]
    matrices.sort()
    order = ORDERS.get(len(matrices))
    if order is None:
        return ""
    roles = {f"ln{i + 1}": p.name for i, p in enumerate(norms)}
    roles.update(
        {
            role: _laid(role, C, name, shape)
            for role, (_, name, shape) in zip(order, matrices, strict=True)
        }
    )
    try:
        fixed = fix_roles(module, C, parts, roles)
    except ValueError:
        return ""
    if not isinstance(map_roles(module, C, fixed.parts, {}, fixed.roles), MappedBlock):
        return ""
    return "--map " + " ".join(f"{r}={n}" for r, n in roles.items())


def _laid(role: str, C: int, name: str, shape: tuple[int, ...] | None) -> str:
    """``name``, with the layout a 3-D (per head) parameter of ``shape`` has in ``role``: the
    side of width C is q/k/v's input and proj's output."""
    if shape is None:
        return name
    c_first = shape[1] == C  # (nh, C, hs)
    return f"{name}:{'in_out' if c_first != (role == 'proj') else 'out_in'}"
