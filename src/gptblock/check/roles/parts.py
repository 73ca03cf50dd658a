"""The parts of a block that hold weights, found in its module tree, and what each one computes.

``discover(module)`` walks the module tree in registration order and lists every ``Part``:

* ``norm``: an ``nn.LayerNorm`` (or ``nn.RMSNorm``), or any module whose class name says norm
  and whose own parameters are vectors (the Annotated Transformer's ``LayerNorm`` with ``a_2`` and
  ``b_2``); it is used as the block uses it, by calling it.
* ``linear``: an ``nn.Linear``, or any module whose own parameters are a matrix ``weight`` and at
  most a vector ``bias`` (Hugging Face's ``Conv1D`` stores it (in, out)); also used by calling
  it. Its (out, in) sizes come from the bias, or from calling it once.
* ``matrix``: a matrix parameter held directly by another module (``self.W_q =
  nn.Parameter(...)``, used as ``x @ self.W_q`` or ``F.linear(x, self.W_q)``), with the vector
  parameter whose name pairs with it (``b_q``, ``q_bias``) as its bias. Whether it is stored
  (out, in) or (in, out) is not in the weights: ``Part.linear`` takes the orientation.
* ``mha``: an ``nn.MultiheadAttention``: q, k and v packed in ``in_proj_weight``, ``out_proj``.

``observe(module, parts, x)`` runs the block once with forward hooks and returns the order in
which the parts' modules were first called: the forward pass's evidence for which LayerNorm
feeds which branch and which layer comes first. ``perturb`` gives the parts (on the checker's
own copy) fresh weights of one standard scale and moves every norm parameter and bias, so that
every mistake shows in the output, whatever the block's own initialisation.

Shapes: C channels, D attention width, H the MLP's hidden width.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F

from ..mistakes.report import CAUGHT

__all__ = ["Part", "discover", "observe", "perturb"]

Tensor = torch.Tensor
SubLayer = Callable[[Tensor], Tensor]
NORM_TYPES: tuple[type[nn.Module], ...] = (nn.LayerNorm, nn.RMSNorm)


@dataclass(frozen=True)
class Part:
    """One weight-holding part of a block.

    Args:
        name: the module's dotted name, or for a ``matrix`` the parameter's ("" = the block).
        kind: ``"norm"``, ``"linear"``, ``"matrix"`` or ``"mha"``.
        index: its place in registration order.
        module: the module (for a ``matrix``, the module holding the parameter).
        params: the full names of the parameters it holds.
        shape: (out, in) of a ``linear``; the stored shape of a ``matrix``; ``None`` otherwise.
        width: the normalised width of a ``norm`` (``None`` when it has no weights to tell).
    """

    name: str
    kind: str
    index: int
    module: nn.Module
    params: tuple[str, ...]
    shape: tuple[int, int] | None = None
    width: int | None = None
    weight: Tensor | None = None  # a ``matrix``'s parameter
    bias: Tensor | None = None  # a ``matrix``'s paired bias

    @property
    def path(self) -> tuple[str, ...]:
        """The name's components: ``("sa", "heads", "0", "query")``."""
        return tuple(self.name.split(".")) if self.name else ()

    @property
    def own_name(self) -> str:
        """The nearest component that is not an index, lower case: ``"query"``, ``"to_out"``."""
        words = [p for p in self.path if not p.isdigit()]
        return words[-1].lower() if words else ""

    def shape_as(self, in_out: bool) -> tuple[int, int] | None:
        """(out, in) when a ``matrix`` is read as stored (in, out) (``in_out``) or (out, in)."""
        if self.kind != "matrix" or self.shape is None:
            return self.shape
        return (self.shape[1], self.shape[0]) if in_out else self.shape

    def linear(self, in_out: bool = False) -> SubLayer:
        """What a ``linear`` or ``matrix`` computes, as a float64 (or any dtype) function."""
        if self.kind == "linear":
            return _called(self.module)
        weight, bias = self.weight, self.bias
        if weight is None:
            raise ValueError(f"{self.name} is not a linear part")
        w = weight.detach()
        b = bias.detach() if bias is not None else None
        if in_out:
            return lambda h: h @ w.to(h.dtype) + (b.to(h.dtype) if b is not None else 0.0)
        return lambda h: F.linear(h, w.to(h.dtype), b.to(h.dtype) if b is not None else None)

    def norm(self) -> SubLayer:
        """What a ``norm`` computes: the module itself, called."""
        return _called(self.module)


def _called(module: nn.Module) -> SubLayer:
    """The module as a function of tensors of any dtype (it runs in its own)."""
    first = next(module.parameters(), None)
    dtype = first.dtype if first is not None else None

    def call(h: Tensor) -> Tensor:
        h = h.contiguous()  # the reference transposes; Conv1D-style modules call .view
        out = module(h.to(dtype) if dtype is not None else h)
        if not isinstance(out, Tensor):
            raise TypeError(f"{type(module).__name__} returned a {type(out).__name__}")
        return out.to(h.dtype)

    return call


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
    """(out, in) of a module with a matrix ``weight``: from the bias, or by calling it once."""
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


def _paired_bias(name: str, own: dict[str, nn.Parameter], out: set[int]) -> str | None:
    """The vector parameter whose name pairs with the matrix ``name``: W_q/b_q, q_weight/q_bias."""
    for w, b in _BIAS_PAIRS:
        for candidate in (name.replace(w, b, 1), re.sub(rf"{w}$", b, name)):
            p = own.get(candidate)
            if candidate != name and p is not None and p.dim() == 1 and p.shape[0] in out:
                return candidate
    return None


def discover(module: nn.Module) -> list[Part]:
    """Every weight-holding part of ``module``, in registration order.

    Args:
        module: the block; it is called (on zeros) only to tell the shape of a linear-like
            module whose bias does not.

    Example:
        >>> from gptblock import lesson
        >>> parts = discover(lesson.Block(16, 2, 8))
        >>> [(p.name, p.kind) for p in parts][:2], len(parts)
        ([('sa.heads.0.key', 'linear'), ('sa.heads.0.query', 'linear')], 11)
    """
    parts: list[Part] = []
    inside: list[str] = []  # parts whose submodules belong to them
    for name, m in module.named_modules():
        if any(name.startswith(p + ".") or p == "" for p in inside):
            continue
        own = dict(m.named_parameters(recurse=False))
        full = {k: f"{name}.{k}" if name else k for k in own}
        if isinstance(m, nn.MultiheadAttention):
            params = tuple(n for n, _ in _named(m, name))
            parts.append(Part(name, "mha", len(parts), m, params))
            inside.append(name)
        elif _is_norm(m, own):
            width = _norm_width(m, own)
            parts.append(Part(name, "norm", len(parts), m, tuple(full.values()), width=width))
            inside.append(name)
        elif "weight" in own and own["weight"].dim() == 2 and set(own) <= {"weight", "bias"}:
            if isinstance(m, nn.Embedding):
                continue
            shape = _linear_shape(m, own["weight"], own.get("bias"))
            if shape is not None:
                parts.append(Part(name, "linear", len(parts), m, tuple(full.values()), shape))
                inside.append(name)
        else:
            for pname, p in own.items():
                if p.dim() != 2:
                    continue
                b = _paired_bias(pname, own, set(p.shape))
                names = (full[pname], full[b]) if b else (full[pname],)
                shape = (int(p.shape[0]), int(p.shape[1]))
                bias = own[b] if b else None
                parts.append(
                    Part(full[pname], "matrix", len(parts), m, names, shape, weight=p, bias=bias)
                )
    return parts


def _named(m: nn.Module, prefix: str) -> list[tuple[str, nn.Parameter]]:
    return [(f"{prefix}.{n}" if prefix else n, p) for n, p in m.named_parameters()]


def observe(module: nn.Module, parts: list[Part], call: Callable[[], object]) -> dict[str, int]:
    """The order in which the parts' modules are first called while ``call()`` runs the block.

    Returns ``{part name: rank}`` for the parts that were called (a ``matrix`` never is: it is
    not a module). A block that raises here is not the mapping's business: what was called
    before the exception is returned.
    """
    order: dict[str, int] = {}
    handles = []
    for part in parts:
        if part.kind == "matrix":
            continue

        def hook(m: nn.Module, args: object, name: str = part.name) -> None:
            order.setdefault(name, len(order))

        handles.append(part.module.register_forward_pre_hook(hook))
    try:
        call()
    except CAUGHT:
        pass
    finally:
        for handle in handles:
            handle.remove()
    return order


def perturb(parts: list[Part], seed: int = 0) -> None:
    """Give the parts fresh weights of one standard scale (in place), from a fixed seed.

    Matrices are drawn N(0, 1/in): with unit-variance (normalised) inputs the attention scores
    then have unit variance and attention is neither uniform nor one-hot, so a wrong scale or
    mask moves the output by ~1e-2 or more whatever the block's own initialisation (GPT-2's
    std 0.02 leaves attention nearly uniform: a scale mistake then moves it by 1e-4). Norm
    weights and every bias are moved by ~0.1 from where they are: freshly built LayerNorms are
    all the identity (weight 1, bias 0) and many biases start at 0, so a block that uses the
    wrong norm or drops a bias computes exactly the right function until it is trained.
    """
    g = torch.Generator().manual_seed(seed)

    def draw(t: Tensor, std: float) -> Tensor:
        return (torch.randn(t.shape, generator=g, dtype=torch.float64) * std).to(t.device, t.dtype)

    with torch.no_grad():
        for part in parts:
            named = dict(part.module.named_parameters())
            if part.kind == "matrix":
                named = {n: p for n, p in named.items() if p is part.weight or p is part.bias}
            elif part.kind == "linear":
                named = {n: p for n, p in named.items() if n in ("weight", "bias")}
            for t in named.values():
                if t.dim() < 2:
                    t.add_(draw(t, 0.1))
                elif part.kind == "linear" and part.shape is not None:
                    t.copy_(draw(t, part.shape[1] ** -0.5))  # (out, in), however it is stored
                else:  # nn.MultiheadAttention's (out, in); a raw matrix: either way round
                    fan_in = t.shape[-1] if part.kind == "mha" else (t.shape[0] * t.shape[1]) ** 0.5
                    t.copy_(draw(t, float(fan_in) ** -0.5))
