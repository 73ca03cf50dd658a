"""``rearrange`` as einops spells it, for the zoo's blocks whose sources use einops (x-transformers,
MPT, vit-pytorch); the project does not depend on einops. Axes are single names, groups one level
deep: ``rearrange(t, "b n (h d) -> b h n d", h=4)``.

Example:
    >>> import torch
    >>> t = torch.arange(24).reshape(1, 2, 12)
    >>> rearrange(t, "b n (h d) -> b h n d", h=3).shape
    torch.Size([1, 3, 2, 4])
    >>> torch.equal(rearrange(rearrange(t, "b n (h d) -> b h n d", h=3), "b h n d -> b n (h d)"), t)
    True
"""

from __future__ import annotations

import math
import re

import torch


def _axes(side: str) -> list[list[str]]:
    """'b n (h d)' -> [['b'], ['n'], ['h', 'd']]"""
    return [
        g.split() if g.startswith("(") is False else g[1:-1].split()
        for g in re.findall(r"\([^)]*\)|\S+", side)
    ]


def rearrange(t: torch.Tensor, pattern: str, **sizes: int) -> torch.Tensor:
    left, right = (_axes(s) for s in pattern.split("->"))
    known = dict(sizes)
    for group, n in zip(left, t.shape, strict=True):
        missing = [a for a in group if a not in known]
        if len(missing) > 1:
            raise ValueError(f"cannot infer the sizes of {missing} in {pattern!r}")
        if missing:
            known[missing[0]] = n // math.prod(known[a] for a in group if a in known)
    flat = [a for group in left for a in group]
    t = t.reshape([known[a] for a in flat])
    t = t.permute([flat.index(a) for group in right for a in group])
    return t.reshape([math.prod(known[a] for a in group) for group in right])
