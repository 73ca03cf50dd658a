"""Attention masks, in one convention: a bool tensor where ``True`` means *blocked*.

That is ``nn.MultiheadAttention``'s (and the second lesson's); SDPA's is the opposite, so the
blocks that call it negate the mask there and nowhere else. A query row with every key blocked
gets all-zero attention weights, never NaN (as SDPA on CPU; ``nn.MultiheadAttention`` gives NaN,
which ``TransformerBlock`` corrects): ``split_dead_rows`` unblocks such rows, so that no softmax
sees an all ``-inf`` row, and the block then zeroes what they produce.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

from ..errors import UserTypeError, UserValueError


def causal_mask(T: int, device: torch.device | str | None = None) -> Tensor:
    """The causal mask for a sequence of length ``T``: ``True`` ("may not attend") above the
    diagonal: (T, T) ``torch.bool`` on ``device``. ``F.scaled_dot_product_attention`` reads a
    bool mask the other way round: pass it ``~causal_mask(T)``, or ``is_causal=True``.

    Example:
        >>> causal_mask(3)
        tensor([[False,  True,  True],
                [False, False,  True],
                [False, False, False]])
    """
    if isinstance(T, bool) or not isinstance(T, int) or T < 1:
        raise UserValueError(f"T must be a positive int, got {T!r}")
    return torch.triu(torch.ones(T, T, dtype=torch.bool, device=device), diagonal=1)


def blocked_positions(
    B: int, T: int, attn_mask: Tensor | None, key_padding_mask: Tensor | None, device: torch.device
) -> Tensor:
    """The causal mask OR-ed with the optional ``attn_mask`` (T, T) or (B, T, T) and
    ``key_padding_mask`` (B, T) (``True`` = a padding key): bool (B, T, T), ``True`` = blocked.
    A mask must be a bool tensor: PyTorch reads a float mask as additive scores."""
    blocked = causal_mask(T, device=device).expand(B, T, T)  # (B, T, T)
    if attn_mask is not None:
        shape = f"(T, T) = ({T}, {T}) or (B, T, T) = ({B}, {T}, {T})"
        _check_mask("attn_mask", attn_mask, shape, ((T, T), (B, T, T)))
        blocked = blocked | attn_mask.to(device)  # (B, T, T), broadcasting a (T, T) mask
    if key_padding_mask is not None:
        _check_mask("key_padding_mask", key_padding_mask, f"(B, T) = ({B}, {T})", ((B, T),))
        blocked = blocked | key_padding_mask.to(device)[:, None, :]  # (B, 1, T) over query rows
    return blocked


def split_dead_rows(blocked: Tensor) -> tuple[Tensor, Tensor]:
    """Split ``blocked`` (..., T, T) into the mask with its dead rows (every key blocked)
    unblocked and the dead rows (..., T). Unblocking them, rather than masking the NaNs
    afterwards, keeps NaN out of the backward pass too: a NaN computed and then discarded by
    ``torch.where`` still poisons its gradient.

    Example:
        >>> blocked = torch.tensor([[[False, True], [True, True]]])  # row 1 has no key left
        >>> live, dead = split_dead_rows(blocked)
        >>> live
        tensor([[[False,  True],
                 [False, False]]])
        >>> dead
        tensor([[False,  True]])
    """
    dead = blocked.all(dim=-1)  # (..., T): query rows with no key left to attend to
    return blocked & ~dead[..., None], dead  # (..., T, T), (..., T)


def masked_softmax(scores: Tensor, blocked: Tensor) -> Tensor:
    """Softmax of ``scores`` (B, nh, T, T) over the keys not ``blocked`` (B, T, T, one mask for
    every head), 0 elsewhere; a dead row is all zeros.

    Example:
        >>> blocked = torch.tensor([[[False, True], [True, True]]])
        >>> masked_softmax(torch.zeros(1, 1, 2, 2), blocked)
        tensor([[[[1., 0.],
                  [0., 0.]]]])
    """
    live, dead = split_dead_rows(blocked[:, None])  # (B, 1, T, T), (B, 1, T): for every head
    weights = F.softmax(scores.masked_fill(live, float("-inf")), dim=-1)  # (B, nh, T, T)
    return weights.masked_fill(dead[..., None], 0.0)  # (B, nh, T, T)


def _check_mask(name: str, mask: object, shape: str, shapes: tuple[tuple[int, ...], ...]) -> None:
    if not isinstance(mask, Tensor):
        raise UserTypeError(
            f"{name} must be a torch.bool tensor of shape {shape}, got {type(mask).__name__}"
        )
    if mask.dtype != torch.bool:
        raise UserTypeError(
            f"{name} must be a torch.bool tensor of shape {shape} (True = blocked), "
            f"got dtype {mask.dtype}"
        )
    if tuple(mask.shape) not in shapes:
        raise UserValueError(f"{name} must have shape {shape}, got {tuple(mask.shape)}")
