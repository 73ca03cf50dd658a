"""The reference block step by step from a block's own parts (``run_steps``): ``CORRECT`` is the
lessons' block, a catalogued mistake replaces fields of it (docs/checker.md, "The comparison").
Shapes: B batch, T time, C channels, D = nh * hs, Dkv = nkv * hs, H hidden width, nh query heads,
nkv key/value heads, hs head size, r rotated channels of a head."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import torch
from torch.nn import functional as F

from ...blocks.qk_heads import repeat_kv
from ...blocks.rotary import cos_sin, pair_views

__all__ = [
    "CANDIDATE_ACTIVATIONS", "CORRECT", "NORM_FORMS", "Deviation", "MissingPart",
    "Parts", "Rope", "Steps", "SubLayer", "Wiring", "affine", "attention", "parallel",
    "repeat_heads", "rms", "run_steps", "way",
]  # fmt: skip

Tensor = torch.Tensor
SubLayer = Callable[[Tensor], Tensor]
Wiring = Callable[[Tensor, SubLayer, SubLayer, SubLayer, SubLayer], Tensor]


class MissingPart(ValueError):
    """The steps need a second LayerNorm and the block has one."""


@dataclass(frozen=True, repr=False)
class Parts:
    """One block's sub-layers as functions, in the roles of the lessons' block. Head i is
    channels ``i*hs:(i+1)*hs`` of what ``qkv`` returns and ``proj`` takes."""

    C: int  # channels of the residual stream
    D: int  # attention width nh * hs
    qkv: Callable[[Tensor], tuple[Tensor, Tensor, Tensor]]  # (B, T, C) -> 3 x (B, T, D)
    proj: SubLayer  # the output projection, (B, T, D) -> (B, T, C)
    fc1: SubLayer  # the MLP's first layer, (B, T, C) -> (B, T, H)
    fc2: SubLayer  # the MLP's second layer, (B, T, H) -> (B, T, C)
    ln1: SubLayer | None  # the attention branch's LayerNorm
    ln2: SubLayer | None  # the MLP branch's; ``None`` when the block has only one
    parallel: bool = False  # GPT-J's wiring (``parallel``) where no deviation changes the wiring

    def __repr__(self) -> str:
        return f"Parts(C={self.C}, D={self.D})"


def affine(weight: Tensor, bias: Tensor | None = None) -> SubLayer:
    """``F.linear`` with these (out, in) weights, detached, in the input's dtype."""
    w, b = weight.detach(), bias.detach() if bias is not None else None
    return lambda h: F.linear(h, w.to(h.dtype), b.to(h.dtype) if b is not None else None)


# The MLP activations a correct block may use: each is tried (not ``blocks.config.ACTIVATIONS``:
# a learner may use one gptblock's blocks do not).
CANDIDATE_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu": F.gelu,  # exact (erf): nn.GELU(), TransformerBlock, nanoGPT
    "gelu_tanh": partial(F.gelu, approximate="tanh"),  # Hugging Face GPT-2's gelu_new, minGPT
    "relu": F.relu,  # the first lesson's FeedForward, the Annotated Transformer
}

# RMSNorm (``rms``, Zhang & Sennrich 2019) and the forms of it learners write instead
NORM_FORMS = {
    "rms": "x / sqrt(mean(x^2) + eps)",
    "eps_outside": "x / (sqrt(mean(x^2)) + eps)",
    "square_of_mean": "x / sqrt(mean(x)^2 + eps)",
    "mean": "x / sqrt(mean(x) + eps)",
    "time": "x / sqrt(mean(x^2, dim=1) + eps), over the time axis",
    "batch": "x / sqrt(mean(x^2, dim=0) + eps), over the batch axis",
}


def rms(x: Tensor, weight: Tensor | float, eps: float, form: str = "rms") -> Tensor:
    """RMSNorm of ``x`` (B, T, C) over its channels, or one of ``NORM_FORMS``' mistaken forms."""
    if form == "eps_outside":
        return x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps) * weight
    if form == "square_of_mean":
        return x * torch.rsqrt(x.mean(-1, keepdim=True).pow(2) + eps) * weight
    if form == "mean":
        return x * torch.rsqrt(x.mean(-1, keepdim=True) + eps) * weight  # NaN where mean < -eps
    dim = {"rms": -1, "time": 1, "batch": 0}[form]
    return x * torch.rsqrt(x.pow(2).mean(dim, keepdim=True) + eps) * weight


@dataclass(frozen=True)
class Rope:
    """Rotary positions as a block computes them, right or wrong: pair i of the first ``dim``
    channels turned by ``sign * t * theta ** (-2i / dim)`` at position t."""

    theta: float
    dim: int  # r: the rotated channels of each head
    pairing: str  # "halves" or "adjacent"
    table: str  # "halves" (cat((freqs, freqs))) or "adjacent" (repeat_interleave(freqs, 2))
    sign: float  # 1.0, or -1.0 (nanochat): rotated by minus the angle

    def describe(self, hs: int) -> str:
        pairs = "halves (i, i + r/2)" if self.pairing == "halves" else "adjacent pairs (2i, 2i+1)"
        rest = f", rotary_dim {self.dim} of {hs}" if self.dim < hs else ""
        turn = ", rotated by minus the angle (as nanochat)" if self.sign < 0 else ""
        return f"rope ({pairs}, theta {self.theta:g}{rest}{turn})"

    def apply(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        """``x`` (B, heads, T, hs) rotated at ``positions`` (T,), by default 0 ... T-1."""
        r = self.dim
        at = torch.arange(x.shape[-2]) if positions is None else positions
        cos, sin = cos_sin(at.to(x.device), r, self.theta, x.dtype)  # (T, r/2): angle i of pair i
        # (T, r): angle i at i and i + r/2 (a "halves" table), else at 2i and 2i + 1
        cos, sin = (_laid(t, t, self.table) for t in (cos, sin))
        a, b = pair_views(x, r, self.pairing)  # (..., r/2) each
        turned = _laid(-b, a, self.pairing)  # (..., r): rotate_half, or (-b_i, a_i) per pair
        return torch.cat((x[..., :r] * cos + turned * (self.sign * sin), x[..., r:]), dim=-1)


def _laid(a: Tensor, b: Tensor, pairing: str) -> Tensor:
    """(..., n) twice -> (..., 2n): ``a`` then ``b`` ("halves"), else pair i (a_i, b_i)."""
    return torch.cat((a, b), -1) if pairing == "halves" else torch.stack((a, b), -1).flatten(-2)


# Each pairing of a head's rotated channels, in words, with the cos/sin table laid out for it
_PAIRINGS = {
    "halves": ("halves (i, i + r/2), as Hugging Face's Llama (rotate_half)", "cat((freqs, freqs))"),
    "adjacent": ("adjacent pairs (2i, 2i + 1), as RoFormer and Meta's Llama (complex numbers)",
                 "repeat_interleave(freqs, 2)"),
}  # fmt: skip


def repeat_heads(t: Tensor, groups: int, order: str = "interleave") -> Tensor:
    """(B, nkv, T, hs) -> (B, nkv * groups, T, hs): key/value head j serves query heads j*g ...
    (j+1)*g - 1 (``interleave``, right), or j, j + nkv, ... (``tile``, the catalogue's ``gqa_order``)."""
    return t.repeat(1, groups, 1, 1) if order == "tile" else repeat_kv(t, groups)


@dataclass(frozen=True)
class Steps:
    """How each step of the block is done; ``CORRECT`` is the lessons' block. A mistaken block
    is ``CORRECT`` with some fields replaced, never a flag tested inside the forward."""

    norms: Callable[[SubLayer | None, SubLayer | None], tuple[SubLayer | None, SubLayer | None]]
    split: Callable[[Tensor, int, str], Tensor]  # (B, T, D), nh, "q", "k" or "v" -> (B, nh, T, hs)
    blocked: Callable[[int, torch.device], Tensor]  # T -> bool (T, T) mask, True = blocked
    scale: Callable[[int, int], float]  # (C, hs) -> factor on the scores
    masking: Callable[[Tensor, Tensor, int], Tensor]  # (scores, blocked, dim) -> weights
    softmax_dim: int  # the axis of the (B, nh, T, T) scores that the softmax normalises
    merge: Callable[[Tensor], Tensor]  # (B, nh, T, hs) -> (B, T, D)
    time_axis: int  # the input axis attention runs along: 1 for (B, T, C), 0 if read as (T, B, C)
    wiring: Wiring  # how the sub-layers and norms connect to the residual stream
    # the modern block's options a mistake can change (``attention``):
    rotated: str = "qk"  # the tensors rotary positions turn: "qk" (right), "q" or "qkv"
    kv_order: str = "interleave"  # how key/value heads serve query heads (``repeat_heads``)
    rope_table: str = "fits"  # the cos/sin table laid out for the rotation's pairing, or "other"


CORRECT = Steps(
    norms=lambda ln1, ln2: (ln1, ln2),  # each branch its own LayerNorm
    # (B, T, D) -> (B, nh, T, hs)
    split=lambda t, nh, _: t.reshape(*t.shape[:2], nh, t.shape[2] // nh).transpose(1, 2),
    # lesson 2's torch.triu(..., diagonal=1): True = blocked, key j > query i
    blocked=lambda T, device: torch.triu(torch.ones(T, T, dtype=torch.bool, device=device), 1),
    scale=lambda C, hs: hs**-0.5,
    # lesson 1: wei.masked_fill(self.tril[:T, :T] == 0, float("-inf")), then F.softmax
    masking=lambda scores, blocked, dim: F.softmax(scores.masked_fill(blocked, -torch.inf), dim),
    softmax_dim=-1,
    merge=lambda y: y.transpose(1, 2).flatten(2),  # (B, nh, T, hs) -> (B, T, nh * hs)
    time_axis=1,
    # lesson 1: x = x + self.sa(self.ln1(x)); x = x + self.ffwd(self.ln2(x))
    wiring=lambda x, attn, mlp, ln1, ln2: (x := x + attn(ln1(x))) + mlp(ln2(x)),
)


@dataclass(frozen=True)
class Deviation:
    """One concrete way to make a catalogued mistake: the ``Steps`` fields it replaces. One
    ``group`` changes one step, so a variant uses at most one deviation of it."""

    mistake: str  # the catalogue id, set by its entry (``catalogue.DEVIATIONS``)
    group: str
    label: str
    changes: tuple[tuple[str, Any], ...]

    def apply(self, steps: Steps) -> Steps:
        return replace(steps, **dict(self.changes))

    def describe(self, C: int, n_head: int, hs: int | None = None, rope: Rope | None = None) -> str:
        hs = C // n_head if hs is None else hs
        value = dict(self.changes).get("scale", lambda C, hs: None)(C, hs)
        ours = rope.pairing if rope else "halves"  # the rotation's, for a mistake of its table
        pairs, other = _PAIRINGS[ours], next(p for k, p in _PAIRINGS.items() if k != ours)
        said = {"C": C, "hs": hs, "nh": n_head, "right": hs**-0.5, "value": value}
        return self.label.format(**said, pairs=pairs, other=other)


# The group of a deviation that changes this field of ``Steps`` (else the field's name): the
# mask is two fields, which of the mask deviations change only one of.
_GROUPS = {"blocked": "mask", "masking": "mask", "time_axis": "axis", "softmax_dim": "softmax",
           "rotated": "targets", "rope_table": "table", "kv_order": "order"}  # fmt: skip


def way(label: str, **change: Any) -> Deviation:
    """A catalogue entry's way: ``label`` may hold ``{C}``, ``{hs}``, ``{nh}``, ``{right}``
    (hs**-0.5), ``{value}`` (the way's scale) and ``{pairs}``, ``{other}`` (the rotation's pairing
    and the other one, each in words and with its table; ``Deviation.describe`` fills them in)."""
    field = next(iter(change))
    return Deviation("", _GROUPS.get(field, field), label, tuple(change.items()))


def parallel(x: Tensor, attn: SubLayer, mlp: SubLayer, ln1: SubLayer, ln2: SubLayer) -> Tensor:
    """GPT-J's and PaLM's wiring (a ``Steps.wiring``): both branches read the stream x."""
    return x + attn(ln1(x)) + mlp(ln2(x))


def run_steps(
    parts: Parts,
    x: Tensor,
    n_head: int,
    activation: Callable[[Tensor], Tensor] | None,
    steps: Steps = CORRECT,
    rope: Rope | None = None,
    qk_norm: tuple[Tensor, Tensor] | None = None,
    positions: Tensor | None = None,
) -> Tensor:
    """x (B, T, C) -> (B, T, C); ``activation`` None: ``fc1`` is the whole hidden function (a
    gate included). A query row the mask blocks entirely comes out NaN."""
    one = parts.parallel and parts.ln2 is None  # GPT-J's one norm, read by both branches
    ln1, ln2 = steps.norms(parts.ln1, parts.ln1 if one else parts.ln2)
    if ln1 is None or ln2 is None:
        raise MissingPart("these steps need a norm per branch; the block has only one")

    def attn(h: Tensor) -> Tensor:
        if steps.time_axis == 0:
            h = h.transpose(0, 1)  # (T, B, C) read as a batch of T sequences of length B
        q, k, v = parts.qkv(h)  # (B, T, D), (B, T, Dkv), (B, T, Dkv)
        out = parts.proj(attention(q, k, v, n_head, rope, steps, qk_norm, positions, parts.C))
        return out.transpose(0, 1) if steps.time_axis == 0 else out  # (B, T, C)

    def mlp(h: Tensor) -> Tensor:
        hidden = parts.fc1(h)  # (B, T, C) -> (B, T, H)
        return parts.fc2(hidden if activation is None else activation(hidden))  # -> (B, T, C)

    wiring = parallel if parts.parallel and steps.wiring is CORRECT.wiring else steps.wiring
    return wiring(x, attn, mlp, ln1, ln2)


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    n_head: int,
    rope: Rope | None,
    steps: Steps,
    qk_norm: tuple[Tensor, Tensor] | None = None,
    positions: Tensor | None = None,
    C: int | None = None,
) -> Tensor:
    """q (B, T, D), k and v (B, T, Dkv) -> (B, T, D); ``qk_norm``: the gains of q's and k's
    RMSNorm over hs; ``C``: the channels a scale mistake may use, by default D."""
    hs = q.shape[-1] // n_head
    n_kv = k.shape[-1] // hs
    T = q.shape[1]
    q, k, v = (  # (B, h, T, hs)
        steps.split(t, h, n) for t, h, n in ((q, n_head, "q"), (k, n_kv, "k"), (v, n_kv, "v"))
    )
    if qk_norm is not None:
        q, k = rms(q, qk_norm[0], 1e-6), rms(k, qk_norm[1], 1e-6)
    if rope is not None:
        if steps.rope_table != "fits":  # the table of the other pairing (``rope_pairing``)
            rope = replace(rope, table="adjacent" if rope.pairing == "halves" else "halves")
        q = rope.apply(q, positions)
        k = rope.apply(k, positions) if "k" in steps.rotated else k
        v = rope.apply(v, positions) if "v" in steps.rotated else v
    k, v = (repeat_heads(t, n_head // n_kv, steps.kv_order) for t in (k, v))  # (B, nh, T, hs)
    scores = (q @ k.transpose(-2, -1)) * steps.scale(C or n_head * hs, hs)  # (B, nh, T, T)
    wei = steps.masking(scores, steps.blocked(T, q.device), steps.softmax_dim)
    return steps.merge(wei @ v)  # (B, nh, T, hs) -> (B, T, D)
