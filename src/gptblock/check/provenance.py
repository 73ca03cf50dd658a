"""The weights a check uses, chosen by the checker, and the parts read back traced to them.

Before the probes run, the checker gives every parameter of its copy of the block a value of its
own choosing (``choose``): matrices (two or more dimensions longer than 1: (out, in), (in, out),
(nh, C, hs), conv kernels) drawn N(0, 1/C), vectors (gains, biases) moved by ~0.1 from where they
are (freshly built LayerNorms are the identity, and many biases start at 0: a block that used
the wrong norm or dropped a bias would compute exactly the right function until trained). With
GPT-2's std-0.02 weights attention is nearly uniform and a scale mistake moves the output by
1e-4; with these it moves it by 1e-2 or more.

In ``gptblock check`` the draw comes from a seed the block's process never sees, and every
weight read back (``gptblock.check.plain``) must then be made of those values (``untraced``):
each entry one the checker chose (or exactly 0 or 1: a missing bias, an identity, a norm without
gain; a norm's gain may be stored as ``gain - 1``, as Gemma's RMSNorm does), and no two roles
made of the same entries. A process that misreports its weights (q
scaled by sqrt(hs), which would pass a block that does not scale its scores; ln1's weights
sent again as ln2's, which would pass a block with one LayerNorm) is then caught, since the
numbers it would have to send are not among the ones chosen. It checks values, not where they
sit: the block's own entries rearranged (a projection's columns permuted) still pass.

Shapes: C channels.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

__all__ = ["choose", "nearest", "untraced"]

Tensor = torch.Tensor
RELATIVE = {torch.float64: 1e-9, torch.float32: 1e-6}  # a read entry's distance, x its role's scale
SHARED = 0.5  # two roles sharing more than this fraction of their entries are one part read twice


def choose(current: Mapping[str, Tensor], C: int, g: torch.Generator) -> dict[str, Tensor]:
    """New values for the parameters ``current`` (name -> value), drawn from ``g``.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> new = choose({"w": torch.zeros(4, 4), "b": torch.zeros(4)}, 4, g)
        >>> new["w"].std().item() > 0.2, new["b"].abs().max().item() < 0.5
        (True, True)
    """
    chosen = {}
    for name, value in current.items():
        if value.dim() == 0:
            chosen[name] = value.to(torch.float64)
            continue
        noise = torch.randn(value.shape, generator=g, dtype=torch.float64)
        if sum(n > 1 for n in value.shape) >= 2:
            chosen[name] = noise * C**-0.5
        else:
            chosen[name] = value.to(torch.float64) + noise * 0.1
    return chosen


def nearest(values: Tensor, t: Tensor) -> Tensor:
    """For each entry of ``t``, the index of the nearest of the sorted, non-empty ``values``.

    Example:
        >>> nearest(torch.tensor([0.0, 1.0, 5.0]), torch.tensor([0.4, 4.0, 9.0])).tolist()
        [0, 2, 2]
    """
    at = torch.searchsorted(values, t)
    below, above = (at - 1).clamp(0, len(values) - 1), at.clamp(0, len(values) - 1)
    return torch.where((t - values[below]).abs() <= (values[above] - t).abs(), below, above)


def _positions(read: Tensor, values: Tensor, tol: float) -> Tensor | None:
    """For each entry of ``read``, the index in the sorted ``values`` it is (-1 for an exact 0 or
    1), or None if one is neither."""
    flat = read.flatten().to(torch.float64)
    special = (flat == 0.0) | (flat == 1.0)
    at = nearest(values, flat)
    close = (values[at] - flat).abs() <= tol
    if not bool((close | special).all()):
        return None
    return torch.where(special, -1, at)


def untraced(roles: Mapping[str, list[Tensor]], chosen: Mapping[str, Tensor], dtype: torch.dtype) -> str:  # fmt: skip
    """Why the weights read for ``roles`` (role -> its weight and bias) are not made of the
    values ``chosen``, or ``""`` when they are. A norm's (``ln1``, ``ln2``) gain may be 1 + them.

    Example:
        >>> chosen = choose({"w": torch.zeros(3, 4)}, 4, torch.Generator().manual_seed(0))
        >>> w = chosen["w"]
        >>> untraced({"q": [w[:2]], "k": [w[2:]]}, chosen, torch.float64)
        ''
        >>> untraced({"q": [w[:2] * 2], "k": [w[2:]]}, chosen, torch.float64)
        'the weights read for q are not the values the checker gave the block'
        >>> untraced({"ln1": [w[0]], "ln2": [w[0]]}, chosen, torch.float64)
        'ln1 and ln2 were read from the same parameters'
    """
    if not chosen:
        return "the block has no parameters to read weights from"
    values = torch.cat([v.to(dtype).to(torch.float64).flatten() for v in chosen.values()])
    values = values.sort().values
    used: dict[str, set[int]] = {}
    for role, tensors in roles.items():
        scale = max((float(t.abs().max()) for t in tensors if t.numel()), default=0.0)
        tol = RELATIVE[dtype] * scale + 1e-300
        found = [_positions(t, values, tol) for t in tensors]
        if role.startswith("ln") and found and found[0] is None:
            found[0] = _positions(tensors[0] - 1.0, values, tol)
        if any(f is None for f in found):
            return f"the weights read for {role} are not the values the checker gave the block"
        used[role] = {int(i) for f in found if f is not None for i in f.tolist() if i >= 0}
    names = list(used)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            smaller = min(len(used[a]), len(used[b]))
            if smaller and len(used[a] & used[b]) > SHARED * smaller:
                return f"{a} and {b} were read from the same parameters"
    return ""
