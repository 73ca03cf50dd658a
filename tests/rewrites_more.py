"""More rewrites (s22): other operators for the same products, norms, masks and views, and a
forward pass run one sequence at a time; registered in ``tests/rewrites.py``'s ``REWRITES``.
Shapes: B batch, T time, C channels, nh heads, hs head size."""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from rewrite_base import (
    APPLIED,
    MASKED_FILLS,
    MATMULS,
    RESHAPES,
    SOFTMAXES,
    Rewrite,
    _arg,
    _linear_parts,
    _resolved,
)  # fmt: skip

Tensor = torch.Tensor


def _batched(a: Tensor, b: Tensor):
    """``a @ b``'s operands as (N, m, k) and (N, k, n), broadcast over the batch, and the batch
    shape to undo it; None unless one is at least 3-D and neither is 1-D."""
    if a.dim() < 2 or b.dim() < 2 or max(a.dim(), b.dim()) < 3:
        return None
    batch = tuple(torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    a3 = a.expand(*batch, *a.shape[-2:]).reshape(-1, *a.shape[-2:])
    b3 = b.expand(*batch, *b.shape[-2:]).reshape(-1, *b.shape[-2:])
    return a3, b3, batch


class Bmm(Rewrite):
    name, doc = "bmm", "every batched product as torch.bmm on (N, m, k), the batch flattened"

    def rewrite(self, func, args, kwargs):
        if func not in MATMULS or func in (torch.bmm, Tensor.bmm):
            return NotImplemented
        parts = _batched(args[0], args[1])
        if parts is None:
            return NotImplemented
        a3, b3, batch = parts
        y = torch.bmm(a3, b3)
        return y.reshape(*batch, *y.shape[-2:])


class Baddbmm(Rewrite):
    name, doc = (
        "baddbmm",
        "batched products as baddbmm(zeros, a, b, beta=0); linear layers as baddbmm(bias, x, W^T)",
    )

    def rewrite(self, func, args, kwargs):
        if func is F.linear:
            x, w, b = _linear_parts(args, kwargs)
            if x.dim() < 3:
                return NotImplemented
            x3 = x.reshape(-1, *x.shape[-2:])
            wt = w.t().expand(x3.shape[0], *w.t().shape)
            if b is None:
                zeros = x3.new_zeros(x3.shape[0], x3.shape[1], w.shape[0])
                y = torch.baddbmm(zeros, x3, wt, beta=0.0)
            else:
                y = torch.baddbmm(b.expand(x3.shape[0], x3.shape[1], w.shape[0]), x3, wt)
            return y.reshape(*x.shape[:-1], w.shape[0])
        if func not in MATMULS:
            return NotImplemented
        parts = _batched(args[0], args[1])
        if parts is None:
            return NotImplemented
        a3, b3, batch = parts
        zeros = a3.new_zeros(a3.shape[0], a3.shape[1], b3.shape[2])
        y = torch.baddbmm(zeros, a3, b3, beta=0.0, alpha=1.0)
        return y.reshape(*batch, *y.shape[-2:])


SCALAR_MULS = {Tensor.__mul__, Tensor.__rmul__, Tensor.mul, torch.mul}
SCALAR_DIVS = {Tensor.__truediv__, Tensor.div, torch.div}


class SplitScale(Rewrite):
    """The scale of the scores moved onto both factors: ``(q @ k^T) * s`` as
    ``(q sqrt(s)) @ (k sqrt(s))^T``, and ``sdpa(q, k, v, scale=s)`` as
    ``sdpa(q sqrt(s), k sqrt(s), v, scale=1)``. A product made before its scale is known stays
    computed (unused) in the forward pass: the scaled one is computed again from its factors."""

    name, doc = "split_scale", "a scalar factor on a product moved onto its two factors, sqrt each"

    def __init__(self):
        super().__init__()
        self.products: dict[int, tuple[Tensor, int, Tensor, Tensor]] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = self.rewrite(func, args, kwargs)
        if out is NotImplemented:
            out = func(*args, **kwargs)
            if (
                func in MATMULS
                and isinstance(out, Tensor)
                and min(args[0].dim(), args[1].dim()) >= 3
            ):
                self.products[id(out)] = (out, out._version, args[0], args[1])
            return out
        APPLIED[self.name] += 1
        return out

    def rewrite(self, func, args, kwargs):
        if func is F.scaled_dot_product_attention:
            q, k, v = args[0], args[1], args[2]
            if len(args) > 6 or kwargs.get("enable_gqa"):
                return NotImplemented
            scale = _arg(args, kwargs, 6, "scale")
            scale = q.shape[-1] ** -0.5 if scale is None else scale
            if not scale > 0:
                return NotImplemented
            r = math.sqrt(scale)
            rest = {k_: v_ for k_, v_ in kwargs.items() if k_ != "scale"}
            return F.scaled_dot_product_attention(q * r, k * r, v, *args[3:6], scale=1.0, **rest)
        if func not in SCALAR_MULS | SCALAR_DIVS or len(args) != 2 or kwargs:
            return NotImplemented
        t, s = args
        if not isinstance(t, Tensor) and func in (Tensor.__rmul__, torch.mul, Tensor.mul):
            t, s = s, t
        entry = self.products.get(id(t)) if isinstance(t, Tensor) else None
        if entry is None or entry[0] is not t or isinstance(s, bool):
            return NotImplemented
        if t._version != entry[1]:  # written in place since (a mask filled in): not the product
            return NotImplemented
        if not isinstance(s, (int, float)) or s == 0:
            return NotImplemented
        s = 1.0 / s if func in SCALAR_DIVS else float(s)
        if s <= 0:
            return NotImplemented
        r = math.sqrt(s)
        return torch.matmul(entry[2] * r, entry[3] * r)


class LogSoftmax(Rewrite):
    name, doc = "log_softmax", "softmax as exp(log_softmax(x))"

    def rewrite(self, func, args, kwargs):
        if func not in SOFTMAXES:
            return NotImplemented
        x, dim = args[0], _arg(args, kwargs, 1, "dim")
        if dim is None or kwargs.get("dtype") is not None or len(args) > 2:
            return NotImplemented
        return torch.exp(torch.log_softmax(x, dim))


class LinearParts(Rewrite):
    name, doc = "linear_parts", "a linear layer as x @ W.T, then + b"

    def rewrite(self, func, args, kwargs):
        if func is not F.linear:
            return NotImplemented
        x, w, b = _linear_parts(args, kwargs)
        y = torch.matmul(x, w.t())
        return y if b is None else y + b


class Addmm(Rewrite):
    name, doc = "addmm", "a linear layer as torch.addmm(b, x, W.T) on the rows (B * T, C)"

    def rewrite(self, func, args, kwargs):
        if func is not F.linear:
            return NotImplemented
        x, w, b = _linear_parts(args, kwargs)
        if x.dim() < 2:
            return NotImplemented
        rows = x.reshape(-1, x.shape[-1])
        y = torch.mm(rows, w.t()) if b is None else torch.addmm(b, rows, w.t())
        return y.reshape(*x.shape[:-1], w.shape[0])


class VarMean(Rewrite):
    name, doc = "var_mean", "LayerNorm by torch.var_mean (biased) and rsqrt"

    def rewrite(self, func, args, kwargs):
        if func is not F.layer_norm:
            return NotImplemented
        x, shape = args[0], _arg(args, kwargs, 1, "normalized_shape")
        w, b = _arg(args, kwargs, 2, "weight"), _arg(args, kwargs, 3, "bias")
        eps = _arg(args, kwargs, 4, "eps", 1e-5)
        dims = tuple(range(-len(shape), 0))
        var, mean = torch.var_mean(x, dims, correction=0, keepdim=True)
        y = (x - mean) * torch.rsqrt(var + eps)
        if w is not None:
            y = y * w
        return y if b is None else y + b


def _shape_of(args, kwargs) -> list[int] | None:
    shape = _arg(args, kwargs, 1, "shape")
    if len(args) > 2 or isinstance(shape, int):
        shape = args[1:]
    if not isinstance(shape, (tuple, list, torch.Size)) or not all(
        isinstance(s, int) for s in shape
    ):
        return None
    return _resolved(list(shape), args[0].numel())


class Flatten(Rewrite):
    name, doc = "flatten", "a view splitting one axis as unflatten, merging two as flatten"

    def rewrite(self, func, args, kwargs):
        if func not in RESHAPES:
            return NotImplemented
        x, shape = args[0], _shape_of(args, kwargs)
        if shape is None:
            return NotImplemented
        have = list(x.shape)
        if len(shape) == len(have) + 1:  # one axis split in two
            for d in range(len(have)):
                kept = shape[:d] == have[:d] and shape[d + 2 :] == have[d + 1 :]
                if kept and shape[d] > 1 and shape[d + 1] > 1:
                    return x.unflatten(d, (shape[d], shape[d + 1]))
        if len(shape) == len(have) - 1:  # two adjacent axes merged
            for d in range(len(shape)):
                kept = shape[:d] == have[:d] and shape[d + 1 :] == have[d + 2 :]
                if kept and have[d] > 1 and have[d + 1] > 1:
                    return x.flatten(d, d + 1)
        return NotImplemented


class WhereMask(Rewrite):
    name, doc = "where_mask", "masked_fill(m, v) as torch.where(m, full_like(x, v), x)"

    def rewrite(self, func, args, kwargs):
        if func not in MASKED_FILLS:
            return NotImplemented
        x, mask, value = args[0], _arg(args, kwargs, 1, "mask"), _arg(args, kwargs, 2, "value")
        if isinstance(value, Tensor) and value.numel() != 1:
            return NotImplemented
        out = torch.where(mask, torch.full_like(x, float(value)), x)
        return x.copy_(out) if func is Tensor.masked_fill_ else out


SPLITS = {Tensor.split, torch.split, Tensor.chunk, torch.chunk}


class Narrow(Rewrite):
    name, doc = "narrow", "split / chunk as explicit narrow(dim, start, length) pieces"

    def rewrite(self, func, args, kwargs):
        if func not in SPLITS:
            return NotImplemented
        x = args[0]
        chunk = func in (Tensor.chunk, torch.chunk)
        size = _arg(args, kwargs, 1, "chunks" if chunk else "split_size_or_sections")
        if size is None:
            size = kwargs.get("split_size")
        dim = _arg(args, kwargs, 2, "dim", 0)
        n = x.shape[dim]
        if chunk:
            if not isinstance(size, int) or size < 1 or n == 0:
                return NotImplemented
            size = -(-n // size)
        if isinstance(size, int):
            if size < 1:
                return NotImplemented
            lengths = [min(size, n - s) for s in range(0, n, size)]
        elif isinstance(size, (list, tuple)) and sum(size) == n:
            lengths = list(size)
        else:
            return NotImplemented
        starts = [sum(lengths[:i]) for i in range(len(lengths))]
        return tuple(x.narrow(dim, s, m) for s, m in zip(starts, lengths, strict=True))


TRANSPOSES = {Tensor.transpose, torch.transpose, Tensor.t, torch.t}


class Permute(Rewrite):
    name, doc = "permute", "transpose(a, b) and .t() as permute with the two axes swapped"

    def rewrite(self, func, args, kwargs):
        if func not in TRANSPOSES:
            return NotImplemented
        x = args[0]
        if func in (Tensor.t, torch.t):
            if x.dim() < 2:
                return NotImplemented
            a, b = 0, 1
        else:
            a, b = _arg(args, kwargs, 1, "dim0"), _arg(args, kwargs, 2, "dim1")
            if not isinstance(a, int) or not isinstance(b, int) or x.dim() == 0:
                return NotImplemented
        perm = list(range(x.dim()))
        perm[a], perm[b] = perm[b], perm[a]
        return x.permute(perm)


class LoopBatch(Rewrite):
    """Not an operator's rewrite: the whole forward pass run on each batch element alone
    (``x[i:i+1]``), the outputs concatenated. Only for a block called with one batched tensor;
    a tuple's tensors are concatenated each, anything else kept as the whole batch gives it."""

    name, doc = "loop_batch", "the block's forward run per batch element, outputs concatenated"

    def rewrite(self, func, args, kwargs):
        return NotImplemented

    @classmethod
    def forward(cls, forward, module, args, kwargs):
        x = args[0] if args else None
        others = [*args[1:], *kwargs.values()]
        if (
            not isinstance(x, Tensor)
            or x.dim() < 2
            or x.shape[0] < 2
            or any(isinstance(o, Tensor) for o in others)
        ):
            return forward(module, *args, **kwargs)
        outs = [_kept(forward(module, x[i : i + 1], *args[1:], **kwargs)) for i in range(len(x))]
        APPLIED[cls.name] += 1
        if all(isinstance(o, Tensor) for o in outs):
            return torch.cat(outs, 0)
        if all(isinstance(o, tuple) for o in outs):
            return tuple(
                torch.cat(parts, 0) if all(isinstance(p, Tensor) for p in parts) else parts[0]
                for parts in zip(*outs, strict=True)
            )
        return outs[0]


def _kept(out):
    """A block's output copied, so that one which reuses its output buffer keeps this one."""
    if isinstance(out, Tensor):
        return out.clone()
    if isinstance(out, tuple):
        return tuple(o.clone() if isinstance(o, Tensor) else o for o in out)
    return out
