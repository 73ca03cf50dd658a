"""Rotary position embeddings (RoPE, Su et al. 2021, "RoFormer"), as a function and a module.

Each pair of a query's or key's channels is rotated by ``pos * theta ** (-2i / rotary_dim)``,
so a query-key product depends on their distance only. A checkpoint pairs the channels as
``"adjacent"`` (2i, 2i + 1: the paper, Meta's Llama) or ``"halves"`` (i, i + r/2: Hugging
Face's ``rotate_half``, GPT-NeoX), the same model after a permutation of the q/k rows
(``pairing_permutation``). Only the first ``rotary_dim`` channels rotate (GPT-NeoX, GPT-J).

Shapes: T positions, hs head size, r = rotary_dim (even, <= hs).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..errors import UserTypeError, UserValueError

PAIRINGS = ("halves", "adjacent")


def check_rotary(head_size: int, rotary_dim: int | None, theta: float, pairing: str) -> int:
    """The number of rotated channels r (``rotary_dim``, None: ``head_size``), refusing an odd
    or too large r, a theta that is not > 0, or an unknown pairing.

    Example:
        >>> check_rotary(8, None, 10000.0, "halves")
        8
        >>> check_rotary(8, 3, 10000.0, "halves")
        Traceback (most recent call last):
        ...
        gptblock.errors.UserValueError: rotary_dim must be an even int in [0, 8] (the head size), got 3
    """
    r = head_size if rotary_dim is None else rotary_dim
    if isinstance(r, bool) or not isinstance(r, int) or r < 0 or r > head_size or r % 2:
        raise UserValueError(
            f"rotary_dim must be an even int in [0, {head_size}] (the head size), got {r!r}"
        )
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
        raise UserValueError(f"rope_theta must be a positive float, got {theta!r}")
    if pairing not in PAIRINGS:
        raise UserValueError(f"rope_pairing must be one of {PAIRINGS}, got {pairing!r}")
    return r


def apply_rotary(
    x: torch.Tensor,
    positions: torch.Tensor,
    theta: float = 10000.0,
    *,
    rotary_dim: int | None = None,
    pairing: str = "halves",
) -> torch.Tensor:
    """``x`` (..., T, hs) with its first ``rotary_dim`` channels rotated by the angles of each
    row's token position, ``positions`` (T,) or (B, T) ints for x (B, nh, T, hs); ``theta``,
    ``rotary_dim`` and ``pairing`` as ``Rotary``'s.

    Example:
        >>> q = torch.tensor([[1.0, 0.0]])  # one position, hs = 2
        >>> apply_rotary(q, torch.tensor([1]), theta=10000.0)  # rotated by 1 radian
        tensor([[0.5403, 0.8415]])
        >>> torch.equal(apply_rotary(q, torch.tensor([0])), q)  # position 0: unchanged
        True
    """
    if not isinstance(x, torch.Tensor) or not isinstance(positions, torch.Tensor):
        raise UserTypeError("apply_rotary takes tensors x (..., T, hs) and positions (T,)")
    hs = x.shape[-1]
    r = check_rotary(hs, rotary_dim, theta, pairing)
    if positions.dim() not in (1, 2) or positions.shape[-1] != x.shape[-2]:
        raise UserValueError(
            f"positions must be (T,) or (B, T) with T={x.shape[-2]} (x's second-to-last "
            f"dimension), got shape {tuple(positions.shape)}"
        )
    if r == 0:
        return x
    cos, sin = cos_sin(positions, r, theta, x.dtype)  # (T, r/2) or (B, T, r/2)
    if positions.dim() == 2:
        cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, r/2): shared by the heads
    x1, x2 = pair_views(x, r, pairing)  # (..., T, r/2) each
    if pairing == "halves":
        out = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)  # (..., T, r)
    else:
        pairs = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)  # (..., T, r/2, 2)
        out = pairs.flatten(-2)  # (..., T, r), interleaved back
    return out if r == hs else torch.cat((out, x[..., r:]), dim=-1)  # (..., T, hs)


def cos_sin(
    positions: torch.Tensor, r: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the angles ``pos * theta ** (-2i / r)``, i < r/2: (.., T, r/2) each, in
    float64 (a float32 angle at position 4096 is off by ~1e-4 rad) cast to ``dtype``."""
    i = torch.arange(0, r, 2, dtype=torch.float64, device=positions.device)  # (r/2,)
    inv_freq = float(theta) ** (-i / r)  # (r/2,)
    angles = positions.to(torch.float64)[..., None] * inv_freq  # (T, r/2) or (B, T, r/2)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def pair_views(t: torch.Tensor, r: int, pairing: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The first and the second channel of each rotated pair of ``t``, as views (..., r/2).

    Example:
        >>> [v.tolist() for v in pair_views(torch.arange(6.0), 4, "adjacent")]
        [[0.0, 2.0], [1.0, 3.0]]
    """
    if pairing == "halves":
        return t[..., : r // 2], t[..., r // 2 : r]
    return t[..., 0:r:2], t[..., 1:r:2]  # adjacent: (2i, 2i + 1)


def pairing_permutation(head_size: int, rotary_dim: int | None = None) -> torch.Tensor:
    """The order of a head's channels that turns the ``"adjacent"`` pairing into ``"halves"``:
    ``apply_rotary(x[..., perm], pos)`` is ``apply_rotary(x, pos, pairing="adjacent")[..., perm]``.

    Example:
        >>> pairing_permutation(6)
        tensor([0, 2, 4, 1, 3, 5])
    """
    r = check_rotary(head_size, rotary_dim, 10000.0, "halves")
    rotated = torch.cat((torch.arange(0, r, 2), torch.arange(1, r, 2)))  # evens, then odds
    return torch.cat((rotated, torch.arange(r, head_size)))


class Rotary(nn.Module):
    """``apply_rotary`` with its settings fixed: a module with no parameters and no state.

    Args:
        head_size: hs.
        rotary_dim: r, the leading channels rotated (even); None: all of them.
        theta: the angles' base (10000 in RoFormer and Llama 2).
        pairing: ``"halves"`` (i, i + r/2) or ``"adjacent"`` (2i, 2i + 1).

    Shape:
        x (..., T, hs), positions (T,) or (B, T) -> (..., T, hs).

    Example:
        >>> rope = Rotary(8)
        >>> q = torch.randn(1, 2, 5, 8)  # (B, nh, T, hs)
        >>> torch.equal(rope(q, torch.arange(5)), apply_rotary(q, torch.arange(5)))
        True
        >>> rope.state_dict()
        OrderedDict()
    """

    def __init__(
        self,
        head_size: int,
        rotary_dim: int | None = None,
        theta: float = 10000.0,
        pairing: str = "halves",
    ) -> None:
        super().__init__()
        self.head_size = head_size
        self.rotary_dim = check_rotary(head_size, rotary_dim, theta, pairing)
        self.theta = float(theta)
        self.pairing = pairing

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return apply_rotary(
            x, positions, self.theta, rotary_dim=self.rotary_dim, pairing=self.pairing
        )

    def extra_repr(self) -> str:
        return (
            f"{self.head_size}, rotary_dim={self.rotary_dim}, theta={self.theta}, "
            f"pairing={self.pairing!r}"
        )
