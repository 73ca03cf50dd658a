"""Semantics-preserving rewrites of any block, for the checker's tests (issue 28, item 5).

A rewrite changes *how* a block computes, not *what*: its forward pass runs under a
``TorchFunctionMode`` that replaces chosen torch calls by equivalents written another way
(``F.linear`` by a 1x1 convolution on the channels-first tensor, ``a @ b`` by ``(b^T a^T)^T``,
``F.softmax`` by ``exp(x - max) / sum``...). The checker records at the dispatch level,
underneath, so it sees the rewritten operators as if the learner had written them.

``REWRITES`` names them; ``rewritten(cls, name)`` is ``cls`` with its forward pass rewritten (a
subclass of the same name); ``rewrite_module(module, name)`` rewrites a built block in place.
``APPLIED`` counts the substitutions made (a rewrite that finds nothing to change is told
apart); ``same_function`` proves a rewrite keeps the block (same weights, float64, 1e-10) and
``same_backward`` that its backward pass fails exactly when the original's does.

Shapes: B batch, T time, C channels, nh heads, hs head size.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn as nn
from torch.nn import functional as F

from gptblock.check.serve.subject import _copy, one_thread  # the checker's float64 copy
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
    _rows_first,
    _rows_last,
)  # fmt: skip
from rewrites_more import (
    Addmm,
    Baddbmm,
    Bmm,
    Flatten,
    LinearParts,
    LogSoftmax,
    LoopBatch,
    Narrow,
    Permute,
    SplitScale,
    VarMean,
    WhereMask,
)  # fmt: skip

Tensor = torch.Tensor


class ChannelsFirst(Rewrite):
    """A linear layer computed on the channels-first (N, C, T) tensor by each subclass's
    ``channels_first(xt, w, b)``."""

    def rewrite(self, func, args, kwargs):
        x, w, b = _linear_parts(args, kwargs) if func is F.linear else (None, None, None)
        if x is None or x.dim() < 2:
            return NotImplemented
        xt, lead = _rows_first(x)
        return _rows_last(self.channels_first(xt, w, b), lead)


class Conv1d(ChannelsFirst):
    name, doc = "conv1d", "nn.Linear as a 1x1 Conv1d on the channels-first (B, C, T) tensor"

    def channels_first(self, xt, w, b):
        return F.conv1d(xt, w[:, :, None], b)


class Conv2d(ChannelsFirst):
    name, doc = "conv2d", "nn.Linear as a 1x1 Conv2d on a (B, C, 1, T) tensor"

    def channels_first(self, xt, w, b):
        return F.conv2d(xt.unsqueeze(2), w[:, :, None, None], b).squeeze(2)


class WeightLeft(ChannelsFirst):
    name, doc = "weight_left", "a linear layer as W @ x on channels-first x: (W x^T)^T + b"

    def channels_first(self, xt, w, b):
        return w @ xt if b is None else w @ xt + b[:, None]


class Einsum(Rewrite):
    name, doc = "einsum", "every matmul and linear layer as torch.einsum"

    def rewrite(self, func, args, kwargs):
        if func is F.linear:
            x, w, b = _linear_parts(args, kwargs)
            y = torch.einsum("...c,oc->...o", x, w)
            return y if b is None else y + b
        if func in MATMULS:
            a, b = args[0], args[1]
            if a.dim() < 2 or b.dim() < 2:
                return NotImplemented
            return torch.einsum("...ij,...jk->...ik", a, b)
        return NotImplemented


class Transposed(Rewrite):
    name, doc = "transposed", "every product a @ b written transposed: (b^T @ a^T)^T"

    def rewrite(self, func, args, kwargs):
        if func in MATMULS:
            a, b = args[0], args[1]
            if a.dim() < 2 or b.dim() < 2:
                return NotImplemented
            return torch.matmul(b.mT, a.mT).mT.contiguous()
        return NotImplemented


class BatchFirst(Rewrite):
    name, doc = (
        "seq_first",
        "linear layers on (T, B, C), products on (nh, B, T, hs): batch dims moved",
    )

    def rewrite(self, func, args, kwargs):
        if func is F.linear:
            x, w, b = _linear_parts(args, kwargs)
            if x.dim() != 3:
                return NotImplemented
            return F.linear(x.transpose(0, 1), w, b).transpose(0, 1).contiguous()
        if func in MATMULS:
            a, b = args[0], args[1]
            if a.dim() != 4 or b.dim() != 4:
                return NotImplemented
            return torch.matmul(a.transpose(0, 1), b.transpose(0, 1)).transpose(0, 1).contiguous()
        return NotImplemented


class Softmax(Rewrite):
    name, doc = "softmax", "softmax by hand: e = exp(x - max); e / e.sum()"

    def rewrite(self, func, args, kwargs):
        if func not in SOFTMAXES:
            return NotImplemented
        x, dim = args[0], _arg(args, kwargs, 1, "dim")
        if dim is None or kwargs.get("dtype") is not None or len(args) > 2:
            return NotImplemented
        e = torch.exp(x - x.amax(dim, keepdim=True).detach())
        return e / e.sum(dim, keepdim=True)


class LayerNorm(Rewrite):
    name, doc = "layernorm", "LayerNorm (and RMSNorm) by hand: (x - mean) / sqrt(var + eps) * g + b"

    def rewrite(self, func, args, kwargs):
        if func is F.layer_norm:
            x, shape = args[0], _arg(args, kwargs, 1, "normalized_shape")
            w, b = _arg(args, kwargs, 2, "weight"), _arg(args, kwargs, 3, "bias")
            eps = _arg(args, kwargs, 4, "eps", 1e-5)
            dims = tuple(range(-len(shape), 0))
            mean = x.mean(dims, keepdim=True)
            var = ((x - mean) ** 2).mean(dims, keepdim=True)
            y = (x - mean) / torch.sqrt(var + eps)
        elif hasattr(F, "rms_norm") and func is F.rms_norm:
            x, shape = args[0], _arg(args, kwargs, 1, "normalized_shape")
            w, b = _arg(args, kwargs, 2, "weight"), None
            eps = _arg(args, kwargs, 3, "eps")
            if eps is None:
                eps = torch.finfo(x.dtype).eps
            dims = tuple(range(-len(shape), 0))
            y = x * torch.rsqrt(x.pow(2).mean(dims, keepdim=True) + eps)
        else:
            return NotImplemented
        if w is not None:
            y = y * w
        return y if b is None else y + b


class AdditiveMask(Rewrite):
    name, doc = (
        "additive_mask",
        "masked_fill(m, -inf) as x + where(m, -inf, 0); other fills by where",
    )

    def rewrite(self, func, args, kwargs):
        if func not in MASKED_FILLS:
            return NotImplemented
        x, mask, value = args[0], _arg(args, kwargs, 1, "mask"), _arg(args, kwargs, 2, "value")
        v = float(value) if not isinstance(value, Tensor) or value.numel() == 1 else None
        if v is None:
            return NotImplemented
        fill = torch.full((), v, dtype=x.dtype, device=x.device)
        if v == -math.inf:  # the additive mask, exactly equal: finite + -inf = -inf
            out = x + torch.where(mask, fill, torch.zeros_like(fill))
        else:
            out = torch.where(mask, fill, x)
        if func is Tensor.masked_fill_:
            return x.copy_(out)
        return out


class Heads(Rewrite):
    name, doc = "heads_stack", "heads split by stack(split) and merged by cat(unbind)"

    def rewrite(self, func, args, kwargs):
        if func not in RESHAPES:
            return NotImplemented
        x = args[0]
        shape = _arg(args, kwargs, 1, "shape")
        if len(args) > 2 or isinstance(shape, int):
            shape = args[1:]
        if not isinstance(shape, (tuple, list, torch.Size)) or not all(
            isinstance(s, int) for s in shape
        ):
            return NotImplemented
        shape = _resolved(list(shape), x.numel())
        if shape is None or x.dim() < 2:
            return NotImplemented
        lead = list(x.shape[:-1])
        if len(shape) == x.dim() + 1 and shape[:-2] == lead and shape[-2] > 1 and shape[-1] > 1:
            parts = x.split(shape[-1], -1)  # (..., C) -> nh of (..., hs)
            if x.dim() == 3:  # (B, T, C): stacked as (B, nh, T, hs), then as asked
                return torch.stack(parts, 1).transpose(1, 2).contiguous()
            return torch.stack(parts, -2)
        if (
            len(shape) == x.dim() - 1
            and x.dim() >= 3
            and shape[:-1] == list(x.shape[:-2])
            and shape[-1] == x.shape[-2] * x.shape[-1]
            and x.shape[-2] > 1
        ):
            if x.dim() == 4:  # (B, T, nh, hs) -> heads first, then concatenated
                return torch.cat(x.transpose(1, 2).unbind(1), -1)
            return torch.cat(x.unbind(-2), -1)
        return NotImplemented


class Gelu(Rewrite):
    name, doc = "gelu", "GELU by hand: 0.5 x (1 + erf(x / sqrt 2)), or its tanh form"

    def rewrite(self, func, args, kwargs):
        if func is not F.gelu:
            return NotImplemented
        x, approximate = args[0], _arg(args, kwargs, 1, "approximate", "none")
        if approximate == "tanh":
            inner = math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)
            return 0.5 * x * (1 + torch.tanh(inner))
        return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


class Attention(Rewrite):
    name, doc = "sdpa", "F.scaled_dot_product_attention by hand: scores, mask, softmax, @ v"

    def rewrite(self, func, args, kwargs):
        if func is not F.scaled_dot_product_attention:
            return NotImplemented
        q, k, v = args[0], args[1], args[2]
        mask = _arg(args, kwargs, 3, "attn_mask")
        if _arg(args, kwargs, 4, "dropout_p", 0.0) or kwargs.get("enable_gqa"):
            return NotImplemented
        causal, scale = _arg(args, kwargs, 5, "is_causal", False), _arg(args, kwargs, 6, "scale")
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        att = (q @ k.transpose(-2, -1)) * scale
        if causal:
            Tq, Tk = q.shape[-2], k.shape[-2]
            keep = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril()
            att = att.masked_fill(~keep, -math.inf)
        if mask is not None:
            att = att.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else att + mask
        return torch.softmax(att, -1) @ v


REWRITES: dict[str, type[Rewrite]] = {
    r.name: r
    for r in (
        Conv1d,
        Conv2d,
        WeightLeft,
        Einsum,
        Transposed,
        BatchFirst,
        Softmax,
        LayerNorm,
        AdditiveMask,
        Heads,
        Gelu,
        Attention,
        Bmm,
        Baddbmm,
        SplitScale,
        LogSoftmax,
        LinearParts,
        Addmm,
        VarMean,
        Flatten,
        WhereMask,
        Narrow,
        Permute,
        LoopBatch,
    )
}


def rewritten(cls: type[nn.Module], name: str) -> type[nn.Module]:
    """``cls`` with its forward pass run under the rewrite ``name`` (same name, same __init__)."""
    mode = REWRITES[name]

    def forward(self, *args, **kwargs):
        if hasattr(mode, "forward"):  # a rewrite of the whole forward pass (``loop_batch``)
            return mode.forward(cls.forward, self, args, kwargs)
        with mode():
            return cls.forward(self, *args, **kwargs)

    return type(
        cls.__name__,
        (cls,),
        {"forward": forward, "__module__": cls.__module__, "__qualname__": cls.__qualname__},
    )


def rewrite_module(module: nn.Module, name: str) -> nn.Module:
    """``module`` itself, its forward pass now rewritten by ``name``."""
    module.__class__ = rewritten(type(module), name)
    return module


def same_function(
    original: nn.Module, name: str, C: int, T: int = 8, seed: int = 0, tol: float = 1e-10
) -> tuple[bool, int]:
    """Whether the rewrite ``name`` keeps ``original`` the same function (float64, eval, ``tol``
    relative to the output's largest entry), and how many substitutions it made. A block that
    computes a step in float32 on purpose (the zoo's ``TOLERANCE``) passes its own tolerance:
    float32 products round differently when their operands' strides differ.

    Proved at ``T`` and ``2 T``, with constants made in forward in float64 and in the default
    dtype, as the checker runs it: PyTorch's own paths differ there (an encoder layer's float32
    mask on a float64 input is misread by its slow path from T = 16 on, which the rewritten block,
    unable to take the fast path, then shows)."""
    before = APPLIED[name]
    for T_ in (T, 2 * T):
        for constants in (_float64, contextlib.nullcontext):
            a = _copy(original, torch.float64)
            b = rewrite_module(_copy(a, torch.float64), name)
            g = torch.Generator().manual_seed(seed)
            x = torch.randn(2, T_, C, generator=g, dtype=torch.float64)
            with constants(), torch.no_grad():
                try:
                    ya = _run(a, x, seed)
                except (RuntimeError, ValueError, IndexError):  # T_ past the block's block_size
                    continue
                yb = _run(b, x, seed)
            if isinstance(ya, tuple):
                ya, yb = ya[0], yb[0]
            scale = max(ya.nan_to_num(0.0, 0.0, 0.0).abs().max().item(), 1.0)
            close = torch.allclose(ya, yb, rtol=0, atol=tol * scale, equal_nan=True)
            if ya.shape != yb.shape or not close:
                return False, APPLIED[name] - before
    return True, APPLIED[name] - before


def same_backward(original: nn.Module, name: str, C: int, T: int = 8, seed: int = 0) -> bool:
    """Whether a backward pass fails for the rewritten block exactly when it fails for the
    original. An in-place residual (``x += attn(ln1(x))``) breaks backward because
    ``F.layer_norm`` saved ``x``; a LayerNorm written by hand saves ``x - mean`` instead, so the
    same residual then trains: that rewrite makes another block, not the same one."""
    a = _copy(original, torch.float64)
    b = rewrite_module(_copy(a, torch.float64), name)
    x = torch.randn(2, T, C, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    with _float64():
        return _backward_fails(a, x, seed) == _backward_fails(b, x, seed)


@contextlib.contextmanager
def _float64():
    """Constants made in forward (``torch.full``) in float64 too, on one thread."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with one_thread():
            yield
    finally:
        torch.set_default_dtype(default)


def _run(module: nn.Module, x: Tensor, seed: int):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # the same draws for both: a dropout left on stays equal
        return module(x)


def _backward_fails(module: nn.Module, x: Tensor, seed: int) -> bool:
    try:
        y = _run(module, x.clone(), seed)  # the parameters need gradients, as in training
        (y[0] if isinstance(y, tuple) else y).sum().backward()
    except RuntimeError:
        return True
    return False
