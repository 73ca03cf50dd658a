"""The machinery ``tests/rewrites.py``'s rewrites share: the ``Rewrite`` mode, its count of
substitutions (``APPLIED``) and the argument helpers. Shapes: B batch, T time, C channels."""

from __future__ import annotations

import math
from collections import Counter

import torch
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

Tensor = torch.Tensor
MATMULS = {torch.matmul, Tensor.matmul, Tensor.__matmul__, torch.bmm, Tensor.bmm}
SOFTMAXES = {F.softmax, torch.softmax, Tensor.softmax}
RESHAPES = {Tensor.view, Tensor.reshape, torch.reshape}
MASKED_FILLS = {Tensor.masked_fill, torch.masked_fill, Tensor.masked_fill_}
APPLIED: Counter[str] = Counter()  # rewrite name -> substitutions made, over all calls


def _arg(args, kwargs, i, name, default=None):
    return args[i] if len(args) > i else kwargs.get(name, default)


def _rows_first(x: Tensor) -> tuple[Tensor, tuple[int, ...]]:
    """(..., T, C) -> (N, C, T), channels first, and the leading shape to undo it."""
    if x.dim() >= 3:
        return x.reshape(-1, x.shape[-2], x.shape[-1]).transpose(1, 2), tuple(x.shape[:-1])
    return x.reshape(-1, x.shape[-1]).T.unsqueeze(0), tuple(x.shape[:-1])


def _rows_last(y: Tensor, lead: tuple[int, ...]) -> Tensor:
    """(N, out, T) -> (..., T, out), the inverse of ``_rows_first``."""
    return y.transpose(1, 2).reshape(*lead, y.shape[1]).contiguous()


def _linear_parts(args, kwargs):
    x, w = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "weight")
    return x, w, _arg(args, kwargs, 2, "bias")


class Rewrite(TorchFunctionMode):
    """Replace some torch calls by equivalents: each subclass's ``rewrite(func, args, kwargs)``
    returns the equivalent, or NotImplemented to keep the call."""

    name = ""
    doc = ""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = self.rewrite(func, args, kwargs)
        if out is NotImplemented:
            return func(*args, **kwargs)
        APPLIED[self.name] += 1
        return out


def _resolved(shape: list[int], numel: int) -> list[int] | None:
    if shape.count(-1) > 1:
        return None
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        if known == 0 or numel % known:
            return None
        shape[shape.index(-1)] = numel // known
    return shape if math.prod(shape) == numel else None
