"""Reduced-precision weights for generation: bfloat16, or int8 with a scale per output row.

A step at batch 1 reads every weight once per token, so its time is the weights' bytes. Each
form is a ``Linear`` used in place of the model's own; activations stay float32. What each
costs in loss: ``benchmarks/generation_precision.py``.

Shapes: N rows, I = in_features, O = out_features.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from ...errors import UserValueError

__all__ = ["REDUCED", "WEIGHTS", "BFloat16Linear", "Int8Linear", "check_weights"]

WEIGHTS = ("float32", "bfloat16", "int8")  # what generation's weights can be

# At most this many rows go through the int8 kernel; more are dequantised (see above). A
# generation step has one row per sequence of the batch.
INT8_KERNEL_MAX_ROWS = 16
# The kernel reads in_features in blocks of 16: in torch 2.13 on this project's CPU, 8 gave
# infinities and 4, 12, 20 and 24 crashed the process; every multiple of 16 up to 1584 agreed
# with the float32 product. Other widths take the dequantised path.
INT8_KERNEL_IN_MULTIPLE = 16


def check_weights(weights: object, device: torch.device, dtype: torch.dtype) -> str:
    """``weights`` (None: "float32") if generation can use it for a model on ``device`` with
    parameters of ``dtype``, else a ``UserValueError``."""
    if weights is None:
        return "float32"
    if weights not in WEIGHTS:
        raise UserValueError(f"weights must be one of {', '.join(WEIGHTS)}, got {weights!r:.40}")
    if weights != "float32" and dtype != torch.float32:
        raise UserValueError(
            f"weights={weights!r} reduces a float32 model's weights; this model's are {dtype} "
            f"(model.float() first, or weights='float32' to use them as they are)"
        )
    if weights == "int8" and device.type != "cpu":
        raise UserValueError(
            f"weights='int8' runs on the CPU only (torch's int8 weight-only kernel), the model "
            f"is on {device}"
        )
    return str(weights)


class BFloat16Linear:
    """``F.linear`` with the weight rounded to bfloat16: float32 in, float32 out.

    Args:
        weight: (O, I), float32; bias: (O,) or None, kept in float32.

    Shape:
        ``linear(x)``: (..., I) -> (..., O).

    Example:
        >>> w, x = torch.randn(6, 4), torch.randn(3, 4)
        >>> y = BFloat16Linear(w, None)(x)
        >>> y.dtype, bool(torch.allclose(y, x @ w.T, rtol=0.05, atol=0.05))
        (torch.float32, True)
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.low = weight.detach().to(torch.bfloat16)  # (O, I)
        self.bias = None if bias is None else bias.detach()  # (O,)

    @property
    def weight(self) -> torch.Tensor:
        """The weight generation multiplies by, in float32: (O, I)."""
        return self.low.float()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x.to(torch.bfloat16), self.low).to(x.dtype)  # (..., I) -> (..., O)
        return y if self.bias is None else y + self.bias


class Int8Linear:
    """``F.linear`` with the weight quantised to int8, one float scale per output row. A few rows
    (a step) go through ``torch._weight_int8pack_mm``, whose fast kernel takes bfloat16 inputs
    (float32 ones took 20x longer here); many rows (a prompt), where it is slower, dequantise.

    Args:
        weight: (O, I), float32; bias: (O,) or None, kept in float32.

    Shape:
        ``linear(x)``: (..., I) -> (..., O).

    Example:
        >>> w, x = torch.randn(6, 4), torch.randn(3, 4)
        >>> linear = Int8Linear(w, None)
        >>> linear.q.dtype, bool((linear.weight - w).abs().max() <= linear.scales.max() / 2 * 1.01)
        (torch.int8, True)
        >>> bool(torch.allclose(linear(x), x @ w.T, rtol=0.05, atol=0.05))
        True
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        w = weight.detach().float()  # (O, I)
        # A zero row keeps scale 1 rather than dividing by 0. The scale is bfloat16, as the
        # kernel takes it, and the integers are rounded against that scale.
        top = w.abs().amax(dim=1)  # (O,)
        scales = torch.where(top > 0, top / 127, torch.ones_like(top)).to(torch.bfloat16)  # (O,)
        self.scales = scales
        self.q = torch.round(w / scales.float()[:, None]).clamp(-127, 127).to(torch.int8)  # (O, I)
        self.bias = None if bias is None else bias.detach()  # (O,)

    @property
    def weight(self) -> torch.Tensor:
        """The weight generation multiplies by, in float32 (exact): (O, I)."""
        return self.q.float() * self.scales.float()[:, None]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        O, I = self.q.shape
        rows = x.reshape(-1, I).to(torch.bfloat16)  # (N, I)
        if rows.shape[0] <= INT8_KERNEL_MAX_ROWS and I % INT8_KERNEL_IN_MULTIPLE == 0:
            y = torch._weight_int8pack_mm(rows, self.q, self.scales)  # (N, O) bfloat16
        else:
            y = F.linear(rows.float(), self.weight).to(torch.bfloat16)  # (N, O)
        y = y.to(x.dtype).reshape(*x.shape[:-1], O)  # (..., O)
        return y if self.bias is None else y + self.bias


# The form of each reduced ``weights``: ``REDUCED[weights](weight, bias)``.
REDUCED: dict[str, type[BFloat16Linear | Int8Linear]] = {"bfloat16": BFloat16Linear}
REDUCED["int8"] = Int8Linear
