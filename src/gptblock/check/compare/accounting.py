"""Every parameter accounted for, after a match without mistakes: each weight the comparison
used is its own, and every parameter acts on the output.

A block can compute a valid block with fewer weights than it holds (every head reading head 0's
key projection, a gate declared and never called, a frozen matrix never applied): its outputs
match the lessons' block's with its own weights, yet its code is wrong. So the weights read are
traced to the values the checker chose (``provenance``: two heads' reading the same values are
one weight where the lessons have one per head), and every parameter (or part of one) no role
read is perturbed: if the output does not move beyond round-off, it never acts. Either is
``unused_parameters``, naming the parameters. (A parameter read into a role counts even if inert
in the reference: a key bias only adds ``q . b_k`` to a row of scores, which the softmax ignores.)

Shapes: B batch, T time, C channels.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from ..mistakes.report import CAUGHT, Finding
from ..roles.provenance import Traced, unread
from ..serve.subject import Tested
from .probes import listed

__all__ = ["account", "silent"]

Tensor = torch.Tensor


def silent(
    set_parameters: Callable[[Mapping[str, Tensor]], None], subject: Tested,
    chosen: Mapping[str, Tensor], used: frozenset[int], fresh: torch.Generator,
) -> list[str]:  # fmt: skip
    """The parameters (``name``, or ``name (k of its n values)`` for a part) whose values no
    role read (``used``: ``Traced.used``) and whose change moves no output; each is changed
    through ``set_parameters`` and given back its chosen value."""
    masks = unread(chosen, used, subject.dtype)
    if not masks:
        return []
    x = torch.randn(2, subject.T, subject.C, generator=fresh, dtype=torch.float64)
    x = x.to(device=subject.device, dtype=subject.dtype)
    y = subject(x)
    dead = []
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
        if not acts:
            part = int(mask.sum())
            dead.append(
                name if part == mask.numel() else f"{name} ({part} of its {mask.numel()} values)"
            )
    return dead


def account(
    set_parameters: Callable[[Mapping[str, Tensor]], None], subject: Tested,
    chosen: Mapping[str, Tensor], traced: Traced, fresh: torch.Generator, findings: list[Finding],
    details: dict[str, str],
) -> list[str]:  # fmt: skip
    """The mistakes of a block that matched the reference without one: ``["unused_parameters"]``
    when a head's weights read are another head's or a parameter never acts, with its finding
    (added to ``findings``) and its account (to ``details``); else ``[]``."""
    said = list(traced.repeats)
    dead = silent(set_parameters, subject, chosen, traced.used, fresh)
    if dead:
        said.append(f"{listed(dead, 6)} never {'acts' if len(dead) == 1 else 'act'} on the output")
    if not said:
        return []
    findings.append(Finding("parameters", False, "; ".join(said)))
    details["unused_parameters"] = "; ".join(said)
    return ["unused_parameters"]
