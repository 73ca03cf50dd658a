"""A modern block's PASS, confirmed in the checker's process from the parts the block sent.

The modern comparison runs where the block runs (``gptblock.check.served``), so in ``gptblock
check`` its PASS is the block's claim. With it come the parts it read, as numbers
(``gptblock.check.modern_plain``); ``confirm`` holds them to what the lessons' block's readings
are held to (``verdict._unpack``, ``verdict._confirm``): every weight must be made of the values
the checker chose (``provenance.untraced``; a norm's gain, read as a ratio, is first snapped to
the nearest chosen value, and the block is then run with that), and the modern block rebuilt from
them, run here in float64, must reproduce the block's outputs on fresh inputs it never saw,
within ``search.TOLERANCE``.

Shapes: B batch, T time, C channels.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .modern_plain import ModernParts, receive
from .plain import NotPlain
from .provenance import nearest, untraced
from .report import CAUGHT, Finding, one_line
from .search import TOLERANCE, distance
from .subject import Tested

__all__ = ["SNAP", "confirm"]

Tensor = torch.Tensor
SNAP = 1e-3  # a gain read as a ratio is this close (x its scale) to the value the checker chose


def _snap(gain: Tensor, values: Tensor) -> Tensor | None:
    """``gain`` with each entry replaced by the nearest chosen value (or 1 + it: a gain stored
    as ``gain - 1``), None when one is further than ``SNAP`` of its scale from all of them."""
    g = gain.to(torch.float64).flatten()
    tol = SNAP * float(g.abs().max()) + 1e-300
    best = g.clone()
    found = torch.zeros_like(g, dtype=torch.bool)
    for shift in (0.0, 1.0):
        near = values[nearest(values, g - shift)] + shift
        fits = ((near - g).abs() <= tol) & ~found
        best, found = torch.where(fits, near, best), found | fits
    return best.reshape(gain.shape) if bool(found.all()) else None


def confirm(
    modern: Mapping[str, Any],
    subject: Tested,
    chosen: Mapping[str, Tensor],
    fresh: torch.Generator,
) -> Finding | str:
    """A failed comparison when the block's outputs on fresh inputs are not the rebuilt modern
    block's; else why the block's PASS cannot be confirmed, ``""`` when it is."""
    if not modern.get("parts"):
        return "its process sent no parts the checker can rebuild it from"
    try:
        parts = receive(modern["parts"], dict(modern.get("tensors") or {}), subject.C)
    except NotPlain as e:
        return str(e)
    values = torch.cat([v.to(subject.dtype).to(torch.float64).flatten() for v in chosen.values()])
    values = values.sort().values
    gains = {}
    for role, gain in parts.gains.items():
        snapped = _snap(gain, values) if values.numel() else None
        if snapped is None:
            return f"the gains read for {role} are not the values the checker gave the block"
        gains[role] = snapped
    roles = {r: list(w) for r, w in parts.linears.items()} | {r: [g] for r, g in gains.items()}
    why = untraced(roles, chosen, subject.dtype)
    if why:
        return why
    parts = ModernParts(**{**parts.__dict__, "gains": gains})
    for shape in ((2, subject.T, subject.C), (subject.T, subject.T, subject.C)):
        x = torch.randn(*shape, generator=fresh, dtype=torch.float64)
        with torch.no_grad():
            ours = parts.run(x)
        try:
            theirs = subject(x.to(device=subject.device, dtype=subject.dtype))
        except CAUGHT as e:
            msg = f"the block raised {one_line(e)} on a fresh {shape} input"
            return Finding("reference comparison", False, msg)
        error = distance(theirs.to(torch.float64).cpu(), ours)
        if not error <= TOLERANCE:
            msg = (
                "the modern block rebuilt from the parts its process sent reproduces it only "
                f"there, not on a fresh {shape} input (off by {error:.2g} of its scale): its "
                "comparison's PASS does not hold"
            )
            return Finding("reference comparison", False, msg)
    return ""
