"""The checks on what a GPT is handed: token ids and targets, each refused with a ``UserError``
naming the value, where PyTorch's own messages (an index error in an embedding) name neither.

Shapes: B batch, T time, V = vocab_size.
"""

from __future__ import annotations

import torch

from ..errors import UserTypeError, UserValueError

__all__ = ["check_ids", "check_range"]


def check_ids(idx: object, name: str, device: torch.device) -> tuple[int, int]:
    """(B, T) of a 2-D tensor of token ids on ``device``: int64 or int32 (``F.embedding``'s), or
    for ``targets`` int64 (``F.cross_entropy``'s); a clear error for anything else.

    Example:
        >>> check_ids(torch.zeros(2, 3, dtype=torch.long), "idx", torch.device("cpu"))
        (2, 3)
    """
    dtypes = (torch.long,) if name == "targets" else (torch.long, torch.int32)
    if not isinstance(idx, torch.Tensor) or idx.dtype not in dtypes:
        got = idx.dtype if isinstance(idx, torch.Tensor) else type(idx).__name__
        allowed = " or ".join(str(d) for d in dtypes)
        raise UserTypeError(
            f"{name} must be a (B, T) tensor of token ids of dtype {allowed}, got {got} "
            f"(convert with .long())"
        )
    if idx.dim() != 2 or idx.numel() == 0:
        raise UserValueError(
            f"{name} must be a non-empty (B, T) tensor of token ids, got shape {tuple(idx.shape)}"
        )
    if idx.device != device:
        raise UserValueError(f"{name} is on {idx.device} but the model is on {device}; move one of them")  # fmt: skip
    return idx.shape[0], idx.shape[1]


def check_range(idx: torch.Tensor, name: str, V: int, allow_ignore: bool = False) -> None:
    """Refuse ids outside [0, V) (-1 allowed for ignored targets): a read on the host."""
    lo, hi = int(idx.min()), int(idx.max())
    if hi >= V or lo < (-1 if allow_ignore else 0):
        bad = lo if lo < 0 else hi
        raise UserValueError(f"{name} contains token id {bad}, outside the vocabulary [0, {V})")
    if allow_ignore and hi == -1:  # the mean over no targets is 0 / 0
        raise UserValueError(
            f"every entry of {name} is -1 (ignored): there is no target to compute a loss "
            f"over; pass targets=None for the logits alone"
        )
