"""The ``--map`` to suggest when the checker could not read a block's weights itself.

``suggest_map`` gives the block's weight-holding parts the roles in the order the lessons'
block registers them (two norms ``ln1 ln2``; four matrices ``qkv proj fc1 fc2``, six ``q k v
proj fc1 fc2``: ``mapping.FORMS``), with the slice or layout a 3-D per-head parameter
(TransformerLens's ``W_Q``) or an (in, out) weight needs, and offers it only if ``fix_roles``
and ``mapping.map_roles`` accept it back.
"""

from __future__ import annotations

import torch.nn as nn

from .given import fix_roles
from .mapping import FORMS, QKV, READS_C, ROLES, MappedBlock, map_roles
from .parts import discover, paired_bias

__all__ = ["suggest_map"]

ORDERS = {len(FORMS[f]): FORMS[f] for f in ("packed", "separate")}  # by the number of matrices


def suggest_map(module: nn.Module, C: int) -> str:
    """``--map ROLE=NAME ...`` for ``module`` by registration order, or "" if none fits.

    Example:
        >>> from gptblock import lesson
        >>> suggest_map(lesson.Block(16, 2, 8), 16)  # one module per head: no fixed order fits
        ''
    """
    parts = discover(module)
    named = dict(module.named_parameters())
    place = {n: i for i, n in enumerate(named)}
    per_head = [n for n, p in named.items() if p.dim() == 3]
    biases = {paired_bias(named, n, named[n]) for n in per_head}  # b_Q (nh, hs): no matrix
    # (registration order of its weight, what --map names: the part or the 3-D parameter, the weight)
    matrices = [(place[n], n, n) for n in per_head] + [
        (place[p.params[0]], p.name, p.params[0])
        for p in parts
        if p.kind in ("linear", "matrix") and p.params[0] not in biases
    ]
    matrices.sort()
    order = ORDERS.get(len(matrices), ())
    norms = [p.name for p in parts if p.kind == "norm"]
    for laid in (False, True) if order else ():
        roles = dict(zip(ROLES[:2], norms, strict=False))
        for role, (_, name, weight) in zip(order, matrices, strict=True):
            roles.update(_given(role, C, name, weight, tuple(named[weight].shape), laid))
        try:
            fixed = fix_roles(module, C, parts, roles)
        except ValueError:
            continue
        if isinstance(map_roles(module, C, fixed.parts, {}, fixed.roles), MappedBlock):
            return "--map " + " ".join(f"{r}={n}" for r, n in roles.items())
    return ""


def _given(
    role: str, C: int, name: str, weight: str, shape: tuple[int, ...], laid: bool
) -> dict[str, str]:
    """The --map values for one matrix in ``role``: its name, or a slice / layout of it."""
    if len(shape) == 3:  # per head: (nh, C, hs) is in_out for q/k/v, (nh, hs, C) for proj
        in_out = (shape[1] == C) == (role in READS_C)
        layout = "in_out" if in_out else "out_in"
        if role != "qkv":
            return {role: f"{name}:{layout}"}
        hs = shape[2 if in_out else 1] // 3  # q, k, v packed per head: thirds of each head
        at = "[:,:,{}:{}]" if in_out else "[:,{}:{},:]"
        return {r: f"{name}{at.format(i * hs, (i + 1) * hs)}:{layout}" for i, r in enumerate(QKV)}
    rows, cols = shape
    stored_in_out = rows == C and cols != C if role in READS_C else cols == C and rows != C
    return {role: f"{weight}:in_out" if laid and stored_in_out else name}
