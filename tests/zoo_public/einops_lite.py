"""``rearrange``, ``einsum`` and ``parse_shape`` as einops spells them, for the zoo's blocks whose
sources use einops (x-transformers, MPT, vit-pytorch, self-attention-cv, flash-attention, a CS336
solution); the project does not depend on einops. Axes are names of any length, groups one level
deep, and ``...`` may stand for leading axes.

Example:
    >>> import torch
    >>> t = torch.arange(24).reshape(1, 2, 12)
    >>> rearrange(t, "b n (h d) -> b h n d", h=3).shape
    torch.Size([1, 3, 2, 4])
    >>> torch.equal(rearrange(rearrange(t, "b n (h d) -> b h n d", h=3), "b h n d -> b n (h d)"), t)
    True
    >>> rearrange(t, "... seq (heads d_head) -> ... heads seq d_head", heads=2).shape
    torch.Size([1, 2, 2, 6])
    >>> w, x = torch.ones(5, 12), torch.ones(1, 2, 12)
    >>> einsum(w, x, "out_features in_features, ... in_features -> ... out_features").shape
    torch.Size([1, 2, 5])
    >>> parse_shape(x, "... seq d")["d"], parse_shape(x, "batch ... seq d")["batch"]
    (12, 1)
"""

from __future__ import annotations

import math
import re

import torch


def _axes(side: str) -> list[list[str]]:
    """'b n (h d)' -> [['b'], ['n'], ['h', 'd']]"""
    return [
        g[1:-1].split() if g.startswith("(") else [g] for g in re.findall(r"\([^)]*\)|\S+", side)
    ]


def rearrange(t: torch.Tensor, pattern: str, **sizes: int) -> torch.Tensor:
    left, right = (_axes(s) for s in pattern.split("->"))
    lead: list[int] = []
    if left[0] == ["..."]:
        left, right = left[1:], right[1:]
        lead = list(t.shape[: t.dim() - len(left)])
    known = dict(sizes)
    for group, n in zip(left, t.shape[len(lead) :], strict=True):
        missing = [a for a in group if a not in known]
        if len(missing) > 1:
            raise ValueError(f"cannot infer the sizes of {missing} in {pattern!r}")
        if missing:
            known[missing[0]] = n // math.prod(known[a] for a in group if a in known)
    flat = [a for group in left for a in group]
    t = t.reshape(lead + [known[a] for a in flat])
    k = len(lead)
    t = t.permute(list(range(k)) + [k + flat.index(a) for group in right for a in group])
    return t.reshape(lead + [math.prod(known[a] for a in group) for group in right])


def einsum(*operands_and_pattern):
    """einops.einsum(x, y, "named axes, ... -> ..."): names of any length, ``...`` allowed."""
    *tensors, pattern = operands_and_pattern
    letters: dict[str, str] = {}
    spec = re.sub(
        r"\.\.\.|[A-Za-z_][A-Za-z_0-9]*",
        lambda m: (
            m.group(0)
            if m.group(0) == "..."
            else letters.setdefault(m.group(0), chr(ord("a") + len(letters)))
        ),
        pattern,
    )
    return torch.einsum(spec.replace(" ", ""), *tensors)


def parse_shape(t: torch.Tensor, pattern: str) -> dict[str, int]:
    """The sizes of the named axes; ``...`` stands for any number of axes."""
    names = pattern.split()
    if "..." not in names:
        return dict(zip(names, t.shape, strict=True))
    i = names.index("...")
    head, tail = names[:i], names[i + 1 :]
    return {
        **dict(zip(head, t.shape[: len(head)], strict=True)),
        **dict(zip(tail, t.shape[t.dim() - len(tail) :], strict=True)),
    }
