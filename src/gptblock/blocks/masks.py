"""Attention masks, in one convention: a bool tensor where ``True`` means *blocked*.

That is ``nn.MultiheadAttention``'s convention (and the second lesson's: "True means may not
attend"). ``F.scaled_dot_product_attention`` uses the opposite one (``True`` = *allowed*), so the
blocks that call SDPA negate the mask at that boundary and nowhere else.

A query row in which every key is blocked has no distribution to softmax over. gptblock gives
it all-zero attention weights (so the heads' output for that row is zero and the attention
sub-layer returns only the output projection's bias), never NaN. This is what PyTorch's SDPA
does on CPU; ``nn.MultiheadAttention`` returns NaN there, which ``TransformerBlock`` corrects.
The rule has one home here: ``split_dead_rows`` finds such rows and unblocks them, so that no
softmax (ours, ``nn.MultiheadAttention``'s or an SDPA backend's) sees an all ``-inf`` row, and the
block then zeroes what those rows produce; ``masked_softmax`` does both for explicit weights.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from ..errors import UserTypeError, UserValueError


def causal_mask(T: int, device: torch.device | str | None = None) -> torch.Tensor:
    """The causal mask for a sequence of length ``T``: ``True`` above the diagonal.

    ``True`` means "may not attend" (``nn.MultiheadAttention``'s convention): position t may
    attend to positions <= t only. ``F.scaled_dot_product_attention`` reads a bool mask the other
    way round (``True`` = may attend), so pass ``~causal_mask(T)`` there, or ``is_causal=True``.

    Args:
        T: sequence length, >= 1.
        device: where to create the mask.

    Shape:
        (T, T), dtype ``torch.bool``.

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
    B: int,
    T: int,
    attn_mask: torch.Tensor | None,
    key_padding_mask: torch.Tensor | None,
    device: torch.device,
) -> torch.Tensor:
    """Combine the causal mask with the optional extra masks into one bool mask.

    Args:
        B, T: batch size and sequence length of the input.
        attn_mask: optional bool (T, T) or (B, T, T); ``True`` = query row may not attend to key
            column.
        key_padding_mask: optional bool (B, T); ``True`` = this key is padding, nobody attends
            to it.
        device: the input's device.

    Returns:
        bool (B, T, T), ``True`` = blocked. Rows may be entirely blocked.

    Raises:
        TypeError: a mask is not a bool tensor (an integer or float mask is ambiguous: PyTorch
            reads a float mask as additive scores, not as blocked/allowed).
        ValueError: a mask has the wrong shape.
    """
    blocked = causal_mask(T, device=device).expand(B, T, T)  # (B, T, T)
    if attn_mask is not None:
        _check_bool("attn_mask", attn_mask, f"(T, T) = ({T}, {T}) or (B, T, T) = ({B}, {T}, {T})")
        if tuple(attn_mask.shape) not in ((T, T), (B, T, T)):
            raise UserValueError(
                f"attn_mask must have shape (T, T) = ({T}, {T}) or (B, T, T) = ({B}, {T}, {T}), "
                f"got {tuple(attn_mask.shape)}"
            )
        blocked = blocked | attn_mask.to(device)  # (B, T, T), broadcasting a (T, T) mask
    if key_padding_mask is not None:
        _check_bool("key_padding_mask", key_padding_mask, f"(B, T) = ({B}, {T})")
        if tuple(key_padding_mask.shape) != (B, T):
            raise UserValueError(
                f"key_padding_mask must have shape (B, T) = ({B}, {T}), "
                f"got {tuple(key_padding_mask.shape)}"
            )
        blocked = blocked | key_padding_mask.to(device)[:, None, :]  # (B, 1, T) over query rows
    return blocked


def split_dead_rows(blocked: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Split a blocked mask into (the mask with its dead rows unblocked, the dead rows).

    A *dead* query row is one in which every key is blocked. Attention on the returned mask is
    finite everywhere (a dead row attends to every key instead of to none); the caller then
    replaces what the dead rows produce by what zero attention weights give. Unblocking the rows,
    rather than masking the NaNs afterwards, keeps NaN out of the backward pass too: a NaN
    computed and then discarded by ``torch.where`` still poisons its gradient.

    Args:
        blocked: bool, ``True`` = blocked, as ``blocked_positions`` returns it.

    Shape:
        blocked (..., T, T) -> live (..., T, T), dead (..., T).

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


def masked_softmax(scores: torch.Tensor, blocked: torch.Tensor) -> torch.Tensor:
    """Attention weights from scores: softmax over the keys a query may attend to, 0 elsewhere.

    A dead query row (every key blocked) gets all-zero weights, not NaN.

    Args:
        scores: pre-softmax attention scores, q @ k^T already scaled.
        blocked: bool, ``True`` = blocked, one mask for every head.

    Shape:
        scores (B, nh, T, T), blocked (B, T, T) -> weights (B, nh, T, T).

    Example:
        >>> blocked = torch.tensor([[[False, True], [True, True]]])
        >>> masked_softmax(torch.zeros(1, 1, 2, 2), blocked)
        tensor([[[[1., 0.],
                  [0., 0.]]]])
    """
    live, dead = split_dead_rows(blocked[:, None])  # (B, 1, T, T), (B, 1, T): for every head
    weights = F.softmax(scores.masked_fill(live, float("-inf")), dim=-1)  # (B, nh, T, T)
    return weights.masked_fill(dead[..., None], 0.0)  # (B, nh, T, T)


def _check_bool(name: str, mask: object, shape: str) -> None:
    if not isinstance(mask, torch.Tensor):
        raise UserTypeError(
            f"{name} must be a torch.bool tensor of shape {shape}, got {type(mask).__name__}"
        )
    if mask.dtype != torch.bool:
        raise UserTypeError(
            f"{name} must be a torch.bool tensor of shape {shape} (True = blocked), "
            f"got dtype {mask.dtype}"
        )
