"""Reading a block's weights by parameter name into the layout of ``steps.Params``.

Three naming schemes are recognised, each found by a parameter name that only it uses (its
*anchor*) and read relative to the prefix in front of that anchor, so a block wrapped in another
module (``self.layer = nn.TransformerEncoderLayer(...)``: ``layer.norm1.weight``, ...) maps too:

* the first lesson's ``Block``: ``ln1``, ``sa.heads.{i}.query/key/value``, ``sa.proj``,
  ``ffwd`` (its two linear layers, in order), ``ln2``;
* ``nn.TransformerEncoderLayer`` / ``TransformerBlock`` / ``FusedBlock``: ``norm1``,
  ``self_attn.in_proj_weight`` / ``in_proj_bias`` (q, k, v packed), ``self_attn.out_proj``,
  ``norm2``, ``linear1``, ``linear2``;
* nanoGPT / GPT-2: ``ln_1``, ``attn.c_attn`` (q, k, v packed), ``attn.c_proj``, ``ln_2``,
  ``mlp.c_fc``, ``mlp.c_proj``. nanoGPT uses ``nn.Linear`` (weights (out, in)); Hugging Face's
  GPT-2 uses ``Conv1D`` (weights (in, out)). ``c_attn``'s shape, (3C, C) or (C, 3C), tells
  which, and the same orientation is used for every layer of the block.

Names decide the mapping, never values: a block whose names match but whose arithmetic differs
is exactly what the checker is for. LayerNorm eps is read from the norm module's ``eps`` where
it has one (1e-5, ``nn.LayerNorm``'s default, otherwise). The head count is not in the weights;
it comes from the lesson's number of heads, an attribute (``num_heads``, ``n_head``,
``n_heads``, ``nhead``, also on a ``config``), or else every divisor of the width is tried.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn

from ..reference.layout import (
    LESSON_ANCHOR,
    LESSON_QKV,
    LESSON_RENAMES,
    lesson_head,
    lesson_head_count,
)
from .steps import Params

__all__ = ["MappedBlock", "Unmapped", "map_parameters"]

Tensor = torch.Tensor
DEFAULT_EPS = 1e-5  # nn.LayerNorm's default, assumed for a norm with no `eps` attribute
HEAD_ATTRIBUTES = ("num_heads", "n_head", "n_heads", "nhead")


@dataclass(frozen=True)
class MappedBlock:
    """A block's weights as ``Params``, and where they came from."""

    params: Params  # float64 copies
    layout: str  # "lesson", "nn.TransformerEncoderLayer" or "GPT-2"
    prefix: str  # where the block's parameters start inside the module ("" = the module itself)
    heads: tuple[int, ...]  # head counts to try, most likely first
    ignored: tuple[str, ...]  # parameters the reference has no place for

    def describe(self) -> str:
        where = f" under '{self.prefix[:-1]}'" if self.prefix else ""
        text = f"weights read by their {self.layout} names{where}"
        if self.ignored:
            text += f"; parameters with no place in the reference: {', '.join(self.ignored)}"
        return text


@dataclass(frozen=True)
class Unmapped:
    """Why a block's names could not be mapped."""

    reason: str


class _Missing(Exception):
    """A name the layout needs is not there (or has the wrong shape)."""


class _Scope:
    """Parameter lookup relative to one prefix, remembering what was used."""

    def __init__(self, module: nn.Module, prefix: str) -> None:
        self.named = dict(module.named_parameters())
        self.modules = dict(module.named_modules())
        self.prefix = prefix
        self.used: set[str] = set()

    def get(self, name: str) -> Tensor:
        value = self.opt(name)
        if value is None:
            raise _Missing(self.prefix + name)
        return value

    def opt(self, name: str) -> Tensor | None:
        full = self.prefix + name
        if full not in self.named:
            return None
        self.used.add(full)
        return self.named[full].detach().to(torch.float64)

    def norm(self, name: str) -> tuple[Tensor | None, Tensor | None, float]:
        weight, bias = self.opt(name + ".weight"), self.opt(name + ".bias")
        module = self.modules.get(self.prefix + name)
        if module is None and weight is None:
            raise _Missing(self.prefix + name)
        eps = getattr(module, "eps", DEFAULT_EPS)
        return weight, bias, float(eps) if isinstance(eps, (int, float)) else DEFAULT_EPS

    def linears_under(self, name: str) -> list[tuple[Tensor, Tensor | None]]:
        """The 2-D ``weight``s under ``name`` (with their biases), in registration order."""
        start = self.prefix + name + "."
        found = []
        for full, p in self.named.items():
            if full.startswith(start) and full.endswith(".weight") and p.dim() == 2:
                rel = full[len(self.prefix) :]
                found.append((self.get(rel), self.opt(rel[: -len("weight")] + "bias")))
        return found


def _lesson(s: _Scope) -> tuple[Params, int | None]:
    name = {packed: mine for mine, packed in LESSON_RENAMES.items()}  # packed -> lesson name
    ln1, ln2 = s.norm(name["norm1"]), s.norm(name["norm2"])
    n_head = lesson_head_count(s.named, s.prefix)
    heads = [lesson_head(i) for i in range(n_head)]

    def weights(part: str) -> Tensor:
        return torch.cat([s.get(h + part + ".weight") for h in heads])  # nh x (hs, C) -> (D, C)

    def biases(part: str) -> Tensor | None:
        found = [b for h in heads if (b := s.opt(h + part + ".bias")) is not None]
        if not found:
            return None
        if len(found) != n_head:
            raise _Missing(f"a {part} bias on every head (found {len(found)} of {n_head})")
        return torch.cat(found)  # nh x (hs,) -> (D,)

    # The MLP's two linear layers in order, however its Sequential numbers them (a learner may
    # leave out the ReLU module or the dropout).
    mlp = name["linear1"].split(".")[0]  # "ffwd"
    ffwd = s.linears_under(mlp)
    if len(ffwd) != 2:
        raise _Missing(f"{s.prefix}{mlp}: expected 2 linear layers, found {len(ffwd)}")
    (w1, b1), (w2, b2) = ffwd
    q, k, v = LESSON_QKV
    proj = name["self_attn.out_proj"]
    params = Params(
        *ln1,
        weights(q), biases(q),
        weights(k), biases(k),
        weights(v), biases(v),
        s.get(proj + ".weight"), s.opt(proj + ".bias"),
        *ln2, w1, b1, w2, b2,
    )  # fmt: skip
    return params, n_head


def _encoder(s: _Scope) -> tuple[Params, int | None]:
    wq, wk, wv = s.get("self_attn.in_proj_weight").chunk(3)  # (3C, C) -> 3 x (C, C)
    bias = s.opt("self_attn.in_proj_bias")
    bq, bk, bv = bias.chunk(3) if bias is not None else (None, None, None)
    params = Params(
        *s.norm("norm1"), wq, bq, wk, bk, wv, bv,
        s.get("self_attn.out_proj.weight"), s.opt("self_attn.out_proj.bias"),
        *s.norm("norm2"),
        s.get("linear1.weight"), s.opt("linear1.bias"),
        s.get("linear2.weight"), s.opt("linear2.bias"),
    )  # fmt: skip
    n_head = getattr(s.modules.get(s.prefix + "self_attn"), "num_heads", None)
    return params, n_head if isinstance(n_head, int) else None


def _gpt2(s: _Scope) -> tuple[Params, int | None]:
    c_attn = s.get("attn.c_attn.weight")
    if c_attn.shape[0] == 3 * c_attn.shape[1]:
        transposed = False  # nn.Linear: (out, in) already
    elif c_attn.shape[1] == 3 * c_attn.shape[0]:
        transposed = True  # Conv1D: (in, out)
    else:
        raise _Missing(f"{s.prefix}attn.c_attn.weight of shape (3C, C) or (C, 3C)")

    def orient(w: Tensor) -> Tensor:
        return w.t() if transposed else w

    wq, wk, wv = orient(c_attn).chunk(3)  # (3C, C) -> 3 x (C, C)
    bias = s.opt("attn.c_attn.bias")
    bq, bk, bv = bias.chunk(3) if bias is not None else (None, None, None)
    params = Params(
        *s.norm("ln_1"), wq, bq, wk, bk, wv, bv,
        orient(s.get("attn.c_proj.weight")), s.opt("attn.c_proj.bias"),
        *s.norm("ln_2"),
        orient(s.get("mlp.c_fc.weight")), s.opt("mlp.c_fc.bias"),
        orient(s.get("mlp.c_proj.weight")), s.opt("mlp.c_proj.bias"),
    )  # fmt: skip
    return params, None


_LAYOUTS: tuple[tuple[str, str, Callable[[_Scope], tuple[Params, int | None]]], ...] = (
    ("lesson", LESSON_ANCHOR, _lesson),
    ("nn.TransformerEncoderLayer", "self_attn.in_proj_weight", _encoder),
    ("GPT-2", "attn.c_attn.weight", _gpt2),
)


def map_parameters(module: nn.Module) -> MappedBlock | Unmapped:
    """Find one block's weights in ``module`` by name and read them into ``Params``.

    Args:
        module: any ``nn.Module``; it is not changed.

    Returns:
        ``MappedBlock``, or ``Unmapped`` saying why not (no known names, names of more than one
        block, a required name missing, shapes that do not fit together).

    Example:
        >>> from gptblock import TransformerBlock
        >>> mapped = map_parameters(TransformerBlock(16, 2))
        >>> mapped.layout, mapped.heads, mapped.params.C
        ('nn.TransformerEncoderLayer', (2,), 16)
        >>> map_parameters(torch.nn.Linear(4, 4)).reason
        'no parameter names of a known block (looked for lesson ...sa.heads.0.query.weight, nn.TransformerEncoderLayer ...self_attn.in_proj_weight, GPT-2 ...attn.c_attn.weight)'
    """
    names = [name for name, _ in module.named_parameters()]
    found: list[MappedBlock] = []
    problems: list[str] = []
    for layout, anchor, read in _LAYOUTS:
        for name in names:
            if name != anchor and not name.endswith("." + anchor):
                continue
            scope = _Scope(module, name[: len(name) - len(anchor)])
            try:
                params, n_head = read(scope)
            except (_Missing, ValueError) as e:
                problems.append(f"{layout} names, but {e}")
                continue
            ignored = tuple(n for n in names if n not in scope.used)
            heads = (n_head,) if n_head else _head_counts(module, params.D)
            found.append(MappedBlock(params, layout, scope.prefix, heads, ignored))
    if len(found) == 1:
        return found[0]
    if len(found) > 1:
        where = ", ".join(f"{m.layout} at '{m.prefix}'" for m in found)
        return Unmapped(f"names of {len(found)} blocks ({where}); check one block at a time")
    if problems:
        return Unmapped("; ".join(problems))
    looked = ", ".join(f"{layout} ...{anchor}" for layout, anchor, _ in _LAYOUTS)
    return Unmapped(f"no parameter names of a known block (looked for {looked})")


def _head_counts(module: nn.Module, D: int) -> tuple[int, ...]:
    """Head counts named by an attribute of any submodule (or its ``config``), else all divisors."""
    named: set[int] = set()
    for sub in module.modules():
        for owner in (sub, getattr(sub, "config", None)):
            for attr in HEAD_ATTRIBUTES:
                value = getattr(owner, attr, None)
                if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
                    named.add(value)
    named = {n for n in named if D % n == 0}
    if named:
        return tuple(sorted(named))
    return tuple(n for n in range(1, D + 1) if D % n == 0)
