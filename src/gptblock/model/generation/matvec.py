"""Products with a weight for one position at a time: generation's matrix-vector products.

A generation step multiplies one position's vector by every weight matrix of the model, so it
reads every weight from memory once per token and does two multiply-adds per weight: memory
bound, not compute bound. ``F.linear`` on a single row runs on one core whatever the thread
count and, for ``nn.Linear``'s (out, in) layout, reads memory in a poor order: on this project's
2-core CPU, with the weights out of cache (a (1536, 384) matrix among 24), it took 139 us. Laid out
once as ``parts`` blocks of (in, out / parts) and multiplied by ``torch.bmm``, which gives each
thread its own blocks, the same product took 44-48 us (``benchmarks/vs_hf.py`` measures what this
does to a whole generation). The result is the same product, summed in another order: equal to
float32 rounding.

Shapes: B rows (the batch, one position each), I = in_features, O = out_features, k parts.
"""

from __future__ import annotations

import torch

__all__ = ["RowLinear"]


class RowLinear:
    """``F.linear(x, weight, bias)`` for a few rows, with ``weight`` re-laid out once.

    The layout is a copy, made at construction: a ``RowLinear`` does not follow later changes
    to ``weight`` (generation makes new ones per call). ``weight`` and ``bias`` stay readable in
    ``nn.Linear``'s layout (a ``gptblock.blocks.parts.Linear``).

    Args:
        weight: (O, I), ``nn.Linear``'s layout.
        bias: (O,) or None.
        parts: how many blocks the outputs are cut into (default: twice the torch thread
            count, so each thread reads its own parts of the weight: on 2 cores, 4 parts took
            1.35 ms per token of a 6-layer 384-wide GPT, 2 parts 1.55, 8 parts 1.62); lowered
            until it divides O.

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
