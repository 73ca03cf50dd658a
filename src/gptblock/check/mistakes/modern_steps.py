"""The modern block's steps in torch, each replaceable: RMSNorm, rotary positions, grouped heads.

What ``steps`` is for the lessons' block, this is for the parts the modern block swaps in
(``gptblock.reference.modern`` is their NumPy oracle; ``tests/test_check_modern.py`` holds the
two equal): ``rms`` with ``NORM_FORMS``' mistaken forms, ``Rope.apply``, ``repeat_heads`` and
the attention core between them, ``attention``, which takes the lessons' ``Steps`` for the
steps the two blocks share and reads their modern fields (``rotated``, ``kv_order``,
``rope_table``: the modern mistakes are ordinary deviations). ``run_modern`` is the whole block:
the lessons' ``Parts`` and ``Steps`` with those options (``fc1`` the MLP's hidden function, the
parallel residual a ``wiring``).

Shapes: B batch, T time, C channels, D = nh * hs, Dkv = nkv * hs, nh query heads, nkv key/value
heads, hs head size, r rotated channels of each head.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .steps import CORRECT, MissingPart, Parts, Steps, SubLayer

__all__ = [
    "NORM_FORMS", "ORDERS", "Rope", "attention", "parallel", "repeat_heads", "rms", "run_modern",
]  # fmt: skip

Tensor = torch.Tensor

NORM_FORMS = {
    "rms": "x / sqrt(mean(x^2) + eps)",
    "eps_outside": "x / (sqrt(mean(x^2)) + eps)",
    "square_of_mean": "x / sqrt(mean(x)^2 + eps)",
    "mean": "x / sqrt(mean(x) + eps)",
    "time": "x / sqrt(mean(x^2, dim=1) + eps), over the time axis",
    "batch": "x / sqrt(mean(x^2, dim=0) + eps), over the batch axis",
}
"""RMSNorm (``rms``, Zhang & Sennrich 2019: eps inside the root, the mean of squares over the
channels) and the forms of it learners write instead."""


def rms(x: Tensor, weight: Tensor | float, eps: float, form: str = "rms") -> Tensor:
    """RMSNorm of ``x`` (B, T, C) over its channels, or one of ``NORM_FORMS``' mistaken forms.

    Example:
        >>> x = torch.tensor([[[3.0, 4.0]]], dtype=torch.float64)
        >>> rms(x, 1.0, 0.0)  # sqrt((9 + 16) / 2) = 3.5355
        tensor([[[0.8485, 1.1314]]], dtype=torch.float64)
    """
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
    """Rotary positions (RoFormer, Su et al. 2021) as a block computes them, right or wrong.

    Channel pair ``(a_i, b_i)`` of each head's first ``dim`` channels is rotated by the angle
    ``sign * t * theta ** (-2i / dim)`` at position t. ``pairing`` says which channels pair:
    ``"halves"``, (i, i + dim/2) as Hugging Face's Llama (``rotate_half``); ``"adjacent"``,
    (2i, 2i + 1) as RoFormer and Meta's Llama (complex numbers of adjacent pairs). ``table`` is
    how the block laid out its cos/sin table: ``cat((freqs, freqs))`` fits the halves,
    ``repeat_interleave(freqs, 2)`` the adjacent pairs; a table that does not fit its pairing
    rotates each pair by two different angles (the catalogue's ``rope_pairing``). ``sign`` -1 is
    nanochat's direction (the same model with the second channel of each pair negated).

    Example:
        >>> rope = Rope(10000.0, 4, "halves", "halves", 1.0)
        >>> x = torch.ones(1, 1, 3, 4, dtype=torch.float64)     # (B, nh, T, hs)
        >>> torch.equal(rope.apply(x)[..., 0, :], x[..., 0, :])  # position 0: no rotation
        True
    """

    theta: float
    dim: int  # r: the rotated channels of each head
    pairing: str  # "halves" or "adjacent"
    table: str  # the layout of the cos/sin table: "halves" (cat) or "adjacent" (interleave)
    sign: float  # 1.0, or -1.0: rotated by minus the angle

    def describe(self, hs: int) -> str:
        """'rope (halves (i, i + r/2), theta 10000)' for a block of head size ``hs``."""
        pairs = "halves (i, i + r/2)" if self.pairing == "halves" else "adjacent pairs (2i, 2i+1)"
        rest = f", rotary_dim {self.dim} of {hs}" if self.dim < hs else ""
        turn = ", rotated by minus the angle (as nanochat)" if self.sign < 0 else ""
        return f"rope ({pairs}, theta {self.theta:g}{rest}{turn})"

    def apply(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        """``x`` (B, heads, T, hs) rotated position by position: at ``positions`` (T,), by
        default 0 ... T-1 (a cached step is at its offset in the sequence)."""
        T, r = x.shape[-2], self.dim
        inv = self.theta ** (-torch.arange(0, r, 2, dtype=torch.float64, device=x.device) / r)
        at = torch.arange(T, device=x.device) if positions is None else positions
        angles = at.to(device=x.device, dtype=torch.float64)[:, None] * inv  # (T, r/2)
        if self.table == "halves":
            angles = torch.cat((angles, angles), dim=-1)  # (T, r): angle i at i and i + r/2
        else:
            angles = torch.repeat_interleave(angles, 2, dim=-1)  # (T, r): angle i at 2i, 2i+1
        cos, sin = angles.cos().to(x.dtype), (self.sign * angles).sin().to(x.dtype)
        part, rest = x[..., :r], x[..., r:]
        if self.pairing == "halves":
            a, b = part[..., : r // 2], part[..., r // 2 :]
            turned = torch.cat((-b, a), dim=-1)  # (..., r): rotate_half
        else:
            a, b = part[..., 0::2], part[..., 1::2]
            turned = torch.stack((-b, a), dim=-1).flatten(-2)  # (..., r): (-b_i, a_i) per pair
        return torch.cat((part * cos + turned * sin, rest), dim=-1)


ORDERS = ("interleave", "tile")
"""How key/value head j serves the query heads: ``interleave``, heads j*g ... (j+1)*g - 1
(``repeat_interleave(g, dim=1)``, Hugging Face's ``repeat_kv``, Meta's; right); ``tile``, heads
j, j + nkv, j + 2 nkv ... (``repeat(1, g, 1, 1)``: the catalogue's ``gqa_order``)."""


def repeat_heads(t: Tensor, groups: int, order: str = "interleave") -> Tensor:
    """(B, nkv, T, hs) -> (B, nkv * groups, T, hs), each key/value head repeated for its group.

    Example:
        >>> t = torch.arange(2.0).reshape(1, 2, 1, 1)
        >>> repeat_heads(t, 2).flatten().tolist(), repeat_heads(t, 2, "tile").flatten().tolist()
        ([0.0, 0.0, 1.0, 1.0], [0.0, 1.0, 0.0, 1.0])
    """
    if groups == 1:
        return t
    if order == "tile":
        return t.repeat(1, groups, 1, 1)
    return t.repeat_interleave(groups, dim=1)


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    n_head: int,
    rope: Rope | None,
    steps: Steps,
    qk_norm: tuple[Tensor, Tensor] | None = None,
    positions: Tensor | None = None,
) -> Tensor:
    """The attention core of the modern block from q (B, T, D), k and v (B, T, Dkv): heads split,
    each head's q and k normalised (``qk_norm``: the gains of q's and k's RMSNorm over hs, eps
    1e-6), rotated (at ``positions`` (T,), by default 0 ... T-1), key/value heads repeated,
    scores scaled, masked, softmax, heads merged; each step as ``steps`` says (the rotated
    tensors, the key/value heads' order and the rotary table are the modern block's).

    Shape:
        q (B, T, D), k and v (B, T, Dkv) -> (B, T, D).
    """
    hs = q.shape[-1] // n_head
    n_kv = k.shape[-1] // hs
    T = q.shape[1]
    q, k, v = steps.split(q, n_head), steps.split(k, n_kv), steps.split(v, n_kv)  # (B, h, T, hs)
    if qk_norm is not None:
        q, k = rms(q, qk_norm[0], 1e-6), rms(k, qk_norm[1], 1e-6)
    if rope is not None:
        if steps.rope_table != "fits":  # the table of the other pairing (``rope_pairing``)
            rope = replace(rope, table="adjacent" if rope.pairing == "halves" else "halves")
        q = rope.apply(q, positions)
        k = rope.apply(k, positions) if "k" in steps.rotated else k
        v = rope.apply(v, positions) if "v" in steps.rotated else v
    groups = n_head // n_kv
    k, v = repeat_heads(k, groups, steps.kv_order), repeat_heads(v, groups, steps.kv_order)
    scores = (q @ k.transpose(-2, -1)) * steps.scale(n_head * hs, hs)  # (B, nh, T, T)
    wei = steps.masking(scores, steps.blocked(T, q.device), steps.softmax_dim)
    return steps.merge(wei @ v)  # (B, nh, T, hs) -> (B, T, D)


def parallel(x: Tensor, attn: SubLayer, mlp: SubLayer, ln1: SubLayer, ln2: SubLayer) -> Tensor:
    """GPT-J's and PaLM's wiring (a ``Steps.wiring``): both branches read the stream x."""
    return x + attn(ln1(x)) + mlp(ln2(x))


def run_modern(
    parts: Parts,
    x: Tensor,
    n_head: int,
    steps: Steps = CORRECT,
    rope: Rope | None = None,
    qk_norm: tuple[Tensor, Tensor] | None = None,
    positions: Tensor | None = None,
) -> Tensor:
    """The modern block on ``x`` (B, T, C): ``run_steps``' block with the modern options, its
    attention ``attention`` (``parts.qkv`` giving k and v of nkv heads), its MLP ``fc2(fc1(h))``
    (``fc1``: the hidden function, activation or gate included), wired by ``steps.wiring``.

    Raises:
        MissingPart: ``parts`` has one norm.
    """
    if parts.ln1 is None or parts.ln2 is None:
        raise MissingPart("the modern block needs a norm per branch")

    def attn(h: Tensor) -> Tensor:
        q, k, v = parts.qkv(h)  # (B, T, D), (B, T, Dkv), (B, T, Dkv)
        return parts.proj(attention(q, k, v, n_head, rope, steps, qk_norm, positions))

    def mlp(h: Tensor) -> Tensor:
        return parts.fc2(parts.fc1(h))  # (B, T, C) -> (B, T, H) -> (B, T, C)

    return steps.wiring(x, attn, mlp, parts.ln1, parts.ln2)
