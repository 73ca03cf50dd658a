"""Every parameter accounted for: each weight the comparison used is its own, and every
parameter of the block acts on its output.

A block can compute a valid block with fewer weights than it holds: every head reading head
0's key projection, one key module given to every head, a gate declared and never called, a
frozen (``requires_grad=False``) matrix meant to be applied and forgotten. Its outputs are the
lessons' block's with its own weights, so the comparison matches; but the learner's code is
wrong (the other heads' key weights are dead, and a trained model would have one key per
block). After a match without mistakes, ``account`` looks at what the comparison used:

* the weights read are traced to the values the checker chose (``provenance.trace``): the same
  values read by two heads of one role are one weight where the lessons' block has one per
  head (two roles read from the same values are refused there, as a process misreporting its
  weights would send them);
* every parameter (or the part of one) that no role read is perturbed, with the block in its
  copy's dtype (float64) and eval mode: if its output does not move beyond round-off, the
  parameter never acts. A parameter read into a role is accounted for even if it is inert in
  the reference itself: the key projection's bias only adds ``q . b_k`` to a query's row of
  scores, which the softmax ignores (nanoGPT's ``c_attn`` bias and ``nn.MultiheadAttention``'s
  ``in_proj_bias`` hold one).

Either is the catalogued ``unused_parameters``, naming the parameters.

Shapes: B batch, T time, C channels.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from ..mistakes.report import CAUGHT, Finding
from ..roles.provenance import Traced, unread
from ..serve.subject import Tested

__all__ = ["account", "silent"]

Tensor = torch.Tensor


def silent(
    set_parameters: Callable[[Mapping[str, Tensor]], None],
    subject: Tested,
    chosen: Mapping[str, Tensor],
    used: frozenset[int],
    fresh: torch.Generator,
) -> list[str]:
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
    set_parameters: Callable[[Mapping[str, Tensor]], None],
    subject: Tested,
    chosen: Mapping[str, Tensor],
    traced: Traced,
    fresh: torch.Generator,
    findings: list[Finding],
    details: dict[str, str],
) -> list[str]:
    """The mistakes of a block that matched the reference without one: ``["unused_parameters"]``
    when a head's weights read are another head's or a parameter never acts, with its finding
    (added to ``findings``) and its account (to ``details``); else ``[]``."""
    said = list(traced.repeats)
    dead = silent(set_parameters, subject, chosen, traced.used, fresh)
    if dead:
        shown = ", ".join(dead[:6]) + (f" and {len(dead) - 6} more" if len(dead) > 6 else "")
        said.append(f"{shown} never {'acts' if len(dead) == 1 else 'act'} on the output")
    if not said:
        return []
    findings.append(Finding("parameters", False, "; ".join(said)))
    details["unused_parameters"] = "; ".join(said)
    return ["unused_parameters"]
