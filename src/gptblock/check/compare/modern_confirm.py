"""A modern block's PASS, confirmed in the checker's process from the parts the block sent.

The modern comparison runs where the block runs (``gptblock.check.isolation.served``), so in ``gptblock
check`` its PASS is the block's claim. With it come the parts it read, as numbers
(``gptblock.check.roles.modern_plain``); ``confirm`` holds them to what the lessons' block's readings
are held to (``verdict._unpack``, ``verdict._confirm``): every weight must be made of the values
the checker chose (``provenance.untraced``; each value read is first snapped to the nearest
chosen one, within ``READ`` of its scale for a matrix measured from traced values and ``SNAP``
for a norm's gain, read as a ratio, and the block is then rebuilt from those), and the modern block rebuilt from
them, run here in float64, must reproduce the block's outputs on fresh inputs it never saw,
within ``search.TOLERANCE``, and its input gradient for a fresh direction the block's, within
``gradient.GRADIENT_TOLERANCE`` (a backward pass that is not the forward pass's derivative, as
a custom autograd ``Function`` or a ``.detach()`` trick can make, shows only there).

Shapes: B batch, T time, C channels.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..mistakes.report import CAUGHT, Finding, one_line
from ..mistakes.search import TOLERANCE, distance
from ..roles.modern_plain import ModernParts, receive
from ..roles.plain import NotPlain
from ..roles.provenance import Traced, nearest, trace
from ..serve.subject import Tested
from .conditions import hold
from .gradient import GRADIENT_TOLERANCE, input_gradient_error

__all__ = ["READ", "SNAP", "confirm"]

Tensor = torch.Tensor
SNAP = 1e-3  # a gain read as a ratio is this close (x its scale) to the value the checker chose
READ = 1e-6  # a matrix measured from traced values (a float32 step on the way) is this close


def _snap(t: Tensor, values: Tensor, tol: float, shifts: tuple[float, ...]) -> Tensor | None:
    """``t`` with each entry replaced by the nearest chosen value (plus a shift: 1 for a gain
    stored as ``gain - 1``), exact 0s and 1s kept (a missing bias, a norm without gain); None
    when an entry is further than ``tol`` of ``t``'s scale from all of them."""
    g = t.to(torch.float64).flatten()
    tol = tol * (float(g.abs().max()) if g.numel() else 0.0) + 1e-300
    found = (g == 0.0) | (g == 1.0)
    best = g.clone()
    for shift in shifts:
        near = values[nearest(values, g - shift)] + shift
        fits = ((near - g).abs() <= tol) & ~found
        best, found = torch.where(fits, near, best), found | fits
    return best.reshape(t.shape) if bool(found.all()) else None


def confirm(
    modern: Mapping[str, Any],
    subject: Tested,
    chosen: Mapping[str, Tensor],
    fresh: torch.Generator,
    backward: bool = True,
) -> tuple[Finding | str, Traced | None]:
    """A failed comparison when the block's outputs on fresh inputs are not the rebuilt modern
    block's, or (when its backward pass ran for the probe: ``backward``) its input gradient for
    a fresh direction is not, or it is not under the learner's conditions (``conditions``);
    else why the block's PASS cannot be confirmed, ``""`` when it is (``"note: ..."``: with a
    condition not compared). With it, what the parts read were traced to (``provenance``),
    once they are made of the values chosen."""
    if not modern.get("parts"):
        return "its process sent no parts the checker can rebuild it from", None
    try:
        parts = receive(modern["parts"], dict(modern.get("tensors") or {}), subject.C)
    except NotPlain as e:
        return str(e), None
    values = torch.cat([v.to(subject.dtype).to(torch.float64).flatten() for v in chosen.values()])
    values = values.sort().values
    roles: dict[str, list[Tensor]] = {}
    for role, ts in [*parts.linears.items(), *parts.gains.items()]:
        gain = role.startswith("ln")  # (gain,) or a LayerNorm's (gain, bias): read as ratios
        snapped = [
            _snap(t, values, SNAP if gain else READ, (0.0, 1.0) if gain and i == 0 else (0.0,))
            for i, t in enumerate(ts)
        ]
        if not values.numel() or any(s is None for s in snapped):
            why = f"the weights read for {role} are not the values the checker gave the block"
            return why, None
        roles[role] = [s for s in snapped if s is not None]
    hs = parts.linears["q"][0].shape[0] // parts.n_head
    heads: dict[str, int] = {r: parts.linears[r][0].shape[0] // hs for r in ("q", "k", "v")}
    traced = trace(roles, chosen, subject.dtype, heads)
    if traced.why:
        return traced.why, None
    linears = {r: (w[0], w[1]) for r, w in roles.items() if not r.startswith("ln")}
    gains = {r: tuple(w) for r, w in roles.items() if r.startswith("ln")}
    parts = ModernParts(**{**parts.__dict__, "linears": linears, "gains": gains})
    for shape in ((2, subject.T, subject.C), (subject.T, subject.T, subject.C)):
        x = torch.randn(*shape, generator=fresh, dtype=torch.float64)
        try:
            with torch.no_grad():
                ours = parts.run(x)  # (B, T, C)
        except CAUGHT as e:  # parts whose shapes do not chain: the block's process made them up
            return f"the parts sent cannot be run as a block ({one_line(e)})", None
        if ours.shape != x.shape:
            return "the parts sent do not map C channels to C channels", None
        try:
            theirs = subject(x.to(device=subject.device, dtype=subject.dtype))
        except CAUGHT as e:
            msg = f"the block raised {one_line(e)} on a fresh {shape} input"
            return Finding("reference comparison", False, msg), None
        error = distance(theirs.to(torch.float64).cpu(), ours)
        if not error <= TOLERANCE:
            msg = (
                "the modern block rebuilt from the parts its process sent reproduces it only "
                f"there, not on a fresh {shape} input (off by {error:.2g} of its scale): its "
                "comparison's PASS does not hold"
            )
            return Finding("reference comparison", False, msg), None
    error = input_gradient_error(subject, parts.run, fresh) if backward else 0.0
    if not error <= GRADIENT_TOLERANCE:
        msg = (
            "the block's outputs are the modern block's, but its gradient with respect to its "
            f"input is not (off by {error:.2g} of its scale): its backward pass is not its "
            "forward pass's"
        )
        return Finding("reference comparison", False, msg), None
    held = hold(subject, parts.run, fresh, backward)
    if isinstance(held, Finding):
        return held, None
    return (f"note: {held}" if held else ""), traced
