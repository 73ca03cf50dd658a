"""Products with a weight for one position at a time: generation's matrix-vector products.

``F.linear`` on one row runs on one core and reads ``nn.Linear``'s (out, in) layout in a poor
order: 139 us for a (1536, 384) matrix on this project's 2-core CPU. Laid out once as blocks of
(in, out / parts) for ``torch.bmm``, which gives each thread its own, it took 44-48 us.

Shapes: B rows (the batch, one position each), I = in_features, O = out_features, k parts.
"""

from __future__ import annotations

import torch

__all__ = ["RowLinear"]


class RowLinear:
    """``F.linear(x, weight, bias)`` for a few rows, with ``weight`` re-laid out once (a copy,
    which does not follow later changes to ``weight``).

    Args:
        weight: (O, I), ``nn.Linear``'s layout; bias: (O,) or None.
        parts: blocks of outputs, lowered until it divides O (default: twice the threads; on 2
            cores 4 took 1.35 ms per token of a 6-layer 384-wide GPT, 2 took 1.55, 8 1.62).

    Shape:
        ``linear(x)``: x (B, 1, I) -> (B, 1, O).

    Example:
        >>> w, b, x = torch.randn(6, 4), torch.randn(6), torch.randn(3, 1, 4)
        >>> torch.allclose(RowLinear(w, b, parts=2)(x), torch.nn.functional.linear(x, w, b), atol=1e-6)
        True
    """

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None, parts: int | None = None
    ) -> None:
        O, I = weight.shape
        k = max(1, parts if parts is not None else 2 * torch.get_num_threads())
        while O % k:
            k -= 1
        self.k, self.I, self.O = k, I, O
        self.weight = weight.detach()  # (O, I)
        self.bias = bias.detach() if bias is not None else None  # (O,)
        # (O, I) -> (k, O/k, I) -> (k, I, O/k): each part's columns contiguous for its thread
        self.parts = self.weight.reshape(k, O // k, I).transpose(1, 2).contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        B = x.shape[0]
        rows = x.reshape(1, B, self.I).expand(self.k, B, self.I)  # (k, B, I), no copy
        y = torch.bmm(rows, self.parts)  # (k, B, I) @ (k, I, O/k) -> (k, B, O/k)
        y = y.transpose(0, 1).reshape(B, 1, self.O)  # (B, k, O/k) -> (B, 1, O)
        return y if self.bias is None else y + self.bias
