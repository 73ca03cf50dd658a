"""Every parameter accounted for, after a match without mistakes: a block can match the lessons'
block with fewer weights than it holds (every head reading head 0's key projection, a gate never
called), so the weights read are traced to the values the checker chose (``provenance``) and
every parameter no role read is perturbed; docs/checker.md, "Every parameter accounted for".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from ..mistakes.report import CAUGHT, Finding
from ..roles.provenance import Traced, unread
from ..serve.subject import Probed
from .probes import listed

__all__ = ["account"]

Tensor = torch.Tensor


def account(
    set_parameters: Callable[[Mapping[str, Tensor]], None], subject: Probed,
    chosen: Mapping[str, Tensor], traced: Traced, fresh: torch.Generator, findings: list[Finding],
    details: dict[str, str],
) -> list[str]:  # fmt: skip
    """The mistakes of a block that matched the reference without one: ``["unused_parameters"]``
    when a head's weights read are another head's or a parameter (or a part of one) no role
    read never moves the output, with its finding (added to ``findings``) and its account (to
    ``details``); else ``[]``. Each parameter is changed through ``set_parameters`` and given
    back its chosen value."""
    said = list(traced.repeats)
    masks = unread(chosen, traced.used, subject.dtype)
    dead: list[str] = []
    if masks:  # else nothing is drawn from ``fresh``
        x = torch.randn(2, subject.T, subject.C, generator=fresh, dtype=torch.float64)
        x = x.to(device=subject.device, dtype=subject.dtype)
        y = subject(x)
    for name, mask in masks.items():
        value = chosen[name]
        spread = max(float(value.abs().max()), subject.C**-0.5)
        noise = torch.randn(value.shape, generator=fresh, dtype=torch.float64) * spread
        set_parameters({name: torch.where(mask, value + noise, value)})
        try:
            acts = bool(subject.moved(y, subject(x)).any())
        except CAUGHT:  # it changed something, if only the block's mind
            acts = True
        finally:
            set_parameters({name: value})
        part, n = int(mask.sum()), mask.numel()
        dead += [] if acts else [name if part == n else f"{name} ({part} of its {n} values)"]
    if dead:
        said.append(f"{listed(dead, 6)} never {'acts' if len(dead) == 1 else 'act'} on the output")
    if not said:
        return []
    findings.append(Finding("parameters", False, "; ".join(said)))
    details["unused_parameters"] = "; ".join(said)
    return ["unused_parameters"]
