"""A block's input gradient held to the reference's, on a fresh input and direction.

A block can compute the right outputs and the wrong backward pass (a custom autograd
``Function``, a ``.detach()`` on a branch whose value is kept, ``x + (f(x) - f(x).detach())``
tricks): the outputs the comparison checks do not see it, so a ``PASS`` also needs the block's
gradient with respect to its input, for an output-gradient direction it could not foresee, to be
the reference's. Both the lessons' block and the modern block are held to it
(``conditions.confirm``), the reference computed here in float64 by autograd through the
checker's own steps.

Shapes: B batch, T time, C channels.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..mistakes.report import CAUGHT
from ..mistakes.search import distance
from ..serve.subject import Tested

__all__ = ["GRADIENT_TOLERANCE", "input_gradient_error"]

Tensor = torch.Tensor
GRADIENT_TOLERANCE = 1e-4  # of the reference's input gradient's scale (float32 blocks ~1e-6)


def input_gradient_error(
    subject: Tested,
    reference: Callable[[Tensor], Tensor],
    fresh: torch.Generator,
    dtype: torch.dtype | None = None,
) -> float:
    """How far the block's gradient of ``sum(y * w)`` with respect to a fresh input (T, T, C),
    for a fresh direction ``w``, is from ``reference``'s (a float64 function of the input),
    relative to the reference's scale; ``inf`` when the block gives none. The block runs in
    ``dtype`` (its copy's by default), the reference on the same input in float64.

    Example:
        >>> from gptblock.check.serve.subject import Subject
        >>> s = Subject(torch.nn.Identity(), 4, 3)
        >>> g = torch.Generator().manual_seed(0)
        >>> input_gradient_error(s, lambda x: x, g), input_gradient_error(s, lambda x: 2 * x, g)
        (0.0, 0.5)
    """
    dtype = dtype or subject.dtype
    x = torch.randn(subject.T, subject.T, subject.C, generator=fresh, dtype=torch.float64)
    weights = torch.randn(x.shape, generator=fresh, dtype=torch.float64)
    x, weights = x.to(dtype).to(torch.float64), weights.to(dtype).to(torch.float64)
    x.requires_grad_(True)
    with torch.enable_grad():
        (ours,) = torch.autograd.grad((reference(x) * weights).sum(), [x])
    try:
        got = subject.grads(
            x.detach().to(device=subject.device, dtype=dtype),
            weights.to(device=subject.device, dtype=dtype),
            inputs=True,
        ).input
    except CAUGHT:  # its backward pass ran for the probe: failing now is not one fixed block's
        got = None
    return float("inf") if got is None else distance(got.to(torch.float64).cpu(), ours)
