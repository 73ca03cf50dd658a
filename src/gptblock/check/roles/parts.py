"""The weight-holding parts of a block's module tree (``discover``), what each computes, and the
order the forward pass calls them in (``observe``)."""

from __future__ import annotations

import contextlib
import fnmatch
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import partial

import torch
import torch.nn as nn

from ..mistakes.report import CAUGHT
from ..mistakes.steps import SubLayer, affine
from ..serve.loop import SCRIPTED

__all__ = [
    "Given", "Matrix", "Part", "discover", "glob", "named_parts", "observe", "paired_bias",
    "tensor_ids",
]  # fmt: skip

Tensor = torch.Tensor
NORM_TYPES: tuple[type[nn.Module], ...] = (nn.LayerNorm, nn.RMSNorm)


@dataclass(frozen=True)
class Given:
    """A role given as a parameter, its slices (``None``: all), layout ("": none) and the text;
    ``read`` as a matrix (a slice, layout or 3-D parameter), else a name (``named_parts``)."""

    path: str
    slices: tuple[slice, ...] | None
    layout: str
    text: str
    read: bool = True


class Matrix(nn.Module):
    """A parameter, or a slice of it, in its layout as a linear layer; read from the live
    parameter at each call: the checker sets it."""

    role: str
    weight_of: Tensor
    bias_of: Tensor | None
    given: Given

    def __init__(self, role: str, weight: Tensor, bias: Tensor | None, g: Given):
        super().__init__()
        # plain attributes, not parameters: the block owns them
        self.__dict__.update(role=role, weight_of=weight, bias_of=bias, given=g)

    def canonical(self) -> tuple[Tensor, Tensor | None]:
        g, w, b = self.given, self.weight_of.detach(), self.bias_of
        b = b.detach() if b is not None else None
        in_out = g.layout == "in_out"
        if g.slices is not None:
            out = g.slices[w.dim() - (1 if in_out else 2)]  # the stored dimension of the output
            w = w[g.slices]
            if b is not None:  # (nh, hs) per head: heads, output
                b = b[g.slices[0], out] if b.dim() == 2 == w.dim() - 1 else b[out]
        w = w.transpose(-1, -2) if in_out else w  # (out, in), or (nh, out_h, in_h) per head
        if w.dim() == 3:
            nh, out_h, in_h = w.shape
            if self.role == "proj":  # heads concatenate the input: (C, nh*hs)
                w = w.permute(1, 0, 2).reshape(out_h, nh * in_h)
            else:  # heads concatenate the output: (nh*hs, C)
                w = w.reshape(nh * out_h, in_h)
            b = b.reshape(-1) if b is not None else None
        return w, b

    def forward(self, h: Tensor) -> Tensor:
        return affine(*self.canonical())(h)


@dataclass(frozen=True)
class Part:
    """A ``linear`` module (weight and bias; ``Conv1D`` stores (in, out)) or a ``Matrix``; a
    ``matrix``: a bare matrix parameter with its bias, read (out, in) unless ``laid``."""

    name: str  # the module's dotted name, or a ``matrix``'s parameter's ("" = the block)
    kind: str  # "norm", "linear", "matrix" or "mha"
    index: int  # its place in registration order
    module: nn.Module
    params: tuple[str, ...]  # the full names of the parameters it holds
    shape: tuple[int, int] | None = None  # (out, in) of a ``linear`` or ``matrix``
    width: int | None = None  # a ``norm``'s width (None: no weights to tell)

    def function(self) -> SubLayer:
        module = self.module
        dtype = next((p.dtype for p in module.parameters()), None)

        def call(h: Tensor) -> Tensor:
            h = h.contiguous()  # the reference transposes; Conv1D-style modules call .view
            out = module(h.to(dtype) if dtype is not None else h)
            if not isinstance(out, Tensor):
                raise TypeError(f"{type(module).__name__} returned a {type(out).__name__}")
            return out.to(h.dtype)

        return call

    def laid(self, in_out: bool) -> Part:
        """A ``matrix`` read as stored (in, out) where ``in_out``."""
        m = self.module
        if not (in_out and isinstance(m, Matrix) and self.kind == "matrix" and self.shape):
            return self
        m = Matrix(m.role, m.weight_of, m.bias_of, replace(m.given, layout="in_out"))
        return replace(self, name=f"{self.name} (in, out)", module=m, shape=self.shape[::-1])

    @property
    def mha(self) -> nn.MultiheadAttention:
        if not isinstance(self.module, nn.MultiheadAttention):
            raise TypeError(f"{self.name} is not an nn.MultiheadAttention")
        return self.module

    def attention(self) -> tuple[SubLayer, SubLayer]:
        """An ``mha``'s packed q/k/v (B, T, 3E) and output projection, from its weights."""
        mha = self.mha
        w: Tensor = mha.in_proj_weight
        if not mha._qkv_same_embed_dim:
            w = torch.cat([mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight])
        return affine(w, mha.in_proj_bias), affine(mha.out_proj.weight, mha.out_proj.bias)


def glob(names: list[str]) -> str:
    """Names that differ in one component as one glob (``heads.*.query``), else listed."""
    split = [n.split(".") for n in names]
    if len(names) > 1 and len({len(s) for s in split}) == 1:
        pattern = [p[0] if len(set(p)) == 1 else "*" for p in zip(*split, strict=True)]
        if pattern.count("*") == 1:
            return ".".join(pattern)
    return ", ".join(names)


def named_parts(parts: list[Part], name: str) -> list[Part]:
    """The part of that name or parameter, else those a glob (``heads.*.query``) matches."""
    found = [p for p in parts if p.name == name or name in p.params]
    return found or [p for p in parts if fnmatch.fnmatchcase(p.name, name)]


def tensor_ids(module: nn.Module, *names: str) -> set[int]:
    """The tensors ``names`` name (a tensor, module or glob each), by identity: tied weights and
    a module's own tensors agree (``named_parts``: the parts, by their names)."""
    tensors = dict(module.named_buffers(remove_duplicate=False))
    tensors |= dict(module.named_parameters(remove_duplicate=False))
    modules = list(module.named_modules(remove_duplicate=False))
    ids: set[int] = set()
    for name in names:  # a name matches itself as a glob
        found = [m for n, m in modules if fnmatch.fnmatchcase(n, name)]
        ids |= {id(t) for m in found for t in (*m.parameters(), *m.buffers())}
        ids |= {id(t) for n, t in tensors.items() if fnmatch.fnmatchcase(n, name)}
    return ids


def _is_norm(m: nn.Module, own: dict[str, nn.Parameter]) -> bool:
    if isinstance(m, NORM_TYPES):
        return True
    name = type(m).__name__.lower()
    leaf = next(m.children(), None) is None  # a block class called `PostNormBlock` is no norm
    return "norm" in name and leaf and all(p.dim() == 1 for p in own.values())


def _norm_width(m: nn.Module, own: dict[str, nn.Parameter]) -> int | None:
    shape = getattr(m, "normalized_shape", None)
    if isinstance(shape, (tuple, list)) and shape and isinstance(shape[-1], int):
        return int(shape[-1])
    sizes = {p.shape[0] for p in own.values()}
    return sizes.pop() if len(sizes) == 1 else None


def _linear_shape(m: nn.Module, weight: Tensor, bias: Tensor | None) -> tuple[int, int] | None:
    """From the bias, or by calling the module once."""
    a, b = weight.shape
    if isinstance(m, nn.Linear) or a == b:
        return (a, b)
    if bias is not None and bias.shape[0] in (a, b):
        return (a, b) if bias.shape[0] == a else (b, a)
    for width, other in ((b, a), (a, b)):
        try:
            with torch.no_grad():
                out = m(torch.zeros(1, 1, width, dtype=weight.dtype, device=weight.device))
        except CAUGHT:
            continue
        if isinstance(out, Tensor) and out.shape[-1] == other:
            return (other, width)
    return None


_BIAS_PAIRS = (("weight", "bias"), ("Weight", "Bias"), ("W", "b"), ("w", "b"))


def paired_bias(named: Mapping[str, nn.Parameter], path: str, w: nn.Parameter) -> str | None:
    """The full name of the bias paired with the weight ``path``: weight/bias, W_Q/b_Q."""
    prefix, _, own = path.rpartition(".")
    sizes = {int(w.shape[0]), int(w.shape[-1])}
    per_head = {(w.shape[0], w.shape[-1]), (w.shape[0], w.shape[1])}
    for wn, bn in _BIAS_PAIRS:
        for candidate in (own.replace(wn, bn, 1), re.sub(rf"{wn}$", bn, own)):
            full = f"{prefix}.{candidate}" if prefix else candidate
            b = named.get(full)
            if candidate == own or b is None:
                continue
            if w.dim() == 3 and (tuple(b.shape) in per_head or b.dim() == 1):
                return full
            if w.dim() == 2 and b.dim() == 1 and int(b.shape[0]) in sizes:
                return full
    return None


def discover(module: nn.Module) -> list[Part]:
    """Every weight-holding part of ``module``, in registration order (called on zeros only to
    tell the shape of a linear-like module whose bias does not)."""
    parts: list[Part] = []
    inside: list[str] = []  # parts whose submodules belong to them
    for name, m in module.named_modules():
        if any(name.startswith(p + ".") or p == "" for p in inside):
            continue
        own = dict(m.named_parameters(recurse=False))
        full = {k: f"{name}.{k}" if name else k for k in own}
        held, at = tuple(full.values()), len(parts)
        if isinstance(m, nn.MultiheadAttention):
            params = tuple(f"{name}.{n}" if name else n for n, _ in m.named_parameters())
            parts.append(Part(name, "mha", at, m, params))
        elif _is_norm(m, own):
            parts.append(Part(name, "norm", at, m, held, width=_norm_width(m, own)))
        elif "weight" in own and own["weight"].dim() == 2 and set(own) <= {"weight", "bias"}:
            embedding = isinstance(m, nn.Embedding)
            shape = None if embedding else _linear_shape(m, own["weight"], own.get("bias"))
            parts += [Part(name, "linear", at, m, held, shape)] if shape else []
        else:  # bare matrices: parts of their own, the module none
            for pname, p in own.items():
                if p.dim() != 2:
                    continue
                b = paired_bias(own, pname, p)
                names = (full[pname], full[b]) if b else (full[pname],)
                shape = (int(p.shape[0]), int(p.shape[1]))
                g = Given(full[pname], None, "out_in", full[pname])
                read = Matrix("", p, own[b] if b else None, g)
                parts.append(Part(full[pname], "matrix", len(parts), read, names, shape))
        if len(parts) > at and parts[at].module is m:
            inside.append(name)
    return parts


def observe(module: nn.Module, parts: list[Part], call: Callable[[], object]) -> dict[str, int]:
    """The order in which the parts' modules are first called while ``call()`` runs the block
    (a ``matrix``'s never is); a block that raises returns what it called."""
    order: dict[str, int] = {}

    def first(name: str, *_: object) -> None:  # a pre-hook that returns a value replaces the input
        order.setdefault(name, len(order))

    with contextlib.ExitStack() as hooks:
        for p in parts:
            if not isinstance(p.module, SCRIPTED):
                hooks.callback(p.module.register_forward_pre_hook(partial(first, p.name)).remove)
        with contextlib.suppress(*CAUGHT):
            call()
    return order
