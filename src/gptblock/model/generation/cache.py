"""The KV cache: a block's keys and values so far, so a generation step processes one token.

Shapes: B batch, nh heads, hs head size, T new positions.
"""

from __future__ import annotations

import torch

from ...blocks.config import check_positive_int
from ...errors import UserTypeError, UserValueError

__all__ = ["KVCache"]


class KVCache:
    """The keys and values one block has computed so far, preallocated to ``max_len`` positions
    (rather than ``torch.cat`` per step, so a step's cost does not grow with the tokens before).
    A block's forward takes it as ``kv_cache``; its input then holds only the new positions.

    Args:
        batch_size, n_heads, head_size: B, nh, hs.
        max_len: the most positions the cache holds (the model's block_size).
        dtype, device: those of the block's activations.

    Shape:
        ``k``, ``v``: (B, nh, max_len, hs); positions ``[0, length)`` are filled.

    Example:
        >>> from gptblock import FusedBlock
        >>> cache = KVCache(1, 2, max_len=8, head_size=4)
        >>> block = FusedBlock(8, 2).eval()
        >>> _ = block(torch.randn(1, 3, 8), kv_cache=cache)   # prefill 3 positions
        >>> _ = block(torch.randn(1, 1, 8), kv_cache=cache)   # one more
        >>> cache.length
        4
    """

    def __init__(
        self, batch_size: int, n_heads: int, max_len: int, head_size: int, *,
        dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
    ) -> None:  # fmt: skip
        sizes = {"batch_size": batch_size, "n_heads": n_heads, "max_len": max_len}
        for name, value in (sizes | {"head_size": head_size}).items():
            check_positive_int(name, value)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise UserTypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
        shape = (batch_size, n_heads, max_len, head_size)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store (B, nh, T_new, hs) keys and values; return all keys and values so far."""
        start, stop = self.length, self.length + k.shape[2]
        if stop > self.max_len:
            raise UserValueError(
                f"KV cache holds {self.max_len} positions; {start} are filled and "
                f"{k.shape[2]} more do not fit (crop the context or rebuild the cache)"
            )
        if k.shape[:2] != self.k.shape[:2] or k.shape[3] != self.k.shape[3]:
            raise UserValueError(
                f"KV cache expects (B, nh, T, hs) = ({self.k.shape[0]}, {self.k.shape[1]}, T, "
                f"{self.k.shape[3]}), got {tuple(k.shape)}"
            )
        self.k[:, :, start:stop] = k
        self.v[:, :, start:stop] = v
        self.length = stop
        return self.k[:, :, :stop], self.v[:, :, :stop]  # (B, nh, stop, hs) each
