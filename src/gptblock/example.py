"""The second lesson's worked example, run: change one token of a ``TransformerBlock``'s input
and see which outputs move (before it, none; from it on, all). ``gptblock example`` prints it.

Shapes: B batch, T time, C channels, nh heads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .blocks.config import check_seed
from .blocks.mha import TransformerBlock

__all__ = ["WorkedExample", "worked_example"]


@dataclass(frozen=True)
class WorkedExample:
    """What ``worked_example`` measured."""

    shape: tuple[int, int, int]  # (B, T, C) of the input, and of the output
    n_heads: int  # nh
    moved: list[list[float]]  # moved[t][p]: max |change| of output position p when token t changed
    passed: bool  # positions before t never moved, positions from t on always did


def worked_example(
    seed: int = 0, B: int = 2, T: int = 5, C: int = 16, nh: int = 2
) -> WorkedExample:
    """Perturb each position of a random input and record how far every output position moves.

    Example:
        >>> r = worked_example(seed=0)
        >>> r.passed, r.shape, r.moved[3][:3]
        (True, (2, 5, 16), [0.0, 0.0, 0.0])
    """
    torch.manual_seed(check_seed(seed))
    block = TransformerBlock(C, nh).double().eval()
    x = torch.randn(B, T, C, dtype=torch.float64)
    moved: list[list[float]] = []
    ok = True
    with torch.no_grad():
        y = block(x)  # (B, T, C)
        for t in range(T):
            x2 = x.clone()
            x2[:, t] += torch.randn(B, C, dtype=torch.float64)
            diff = (block(x2) - y).abs().amax(dim=(0, 2))  # (T,): over the batch and channels
            ok &= bool((diff[:t] == 0).all() and (diff[t:] > 0).all())
            moved.append(diff.tolist())
    return WorkedExample((B, T, C), nh, moved, ok)
