"""SDPA's CPU kernels, flash against math, forward + backward, at the shapes gptblock trains at.

    python benchmarks/attention_kernels.py

Times causal ``F.scaled_dot_product_attention`` on (B, nh, T, hs) with each kernel forced by
``torch.nn.attention.sdpa_kernel``, in float32 and bfloat16: the median of 10 forward + backward
calls after 3 untimed ones. ``gptblock.blocks.attention.causal_attention`` uses the math kernel where this
shows it faster (reduced precision, T <= 128).
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = [(128, 4, 32, 32), (64, 4, 64, 32), (32, 4, 128, 32), (16, 4, 256, 32), (8, 6, 256, 64)]


def timed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: SDPBackend) -> float:
    with sdpa_kernel(backend):
        for _ in range(3):
            F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
        times = []
        for _ in range(10):
            start = time.perf_counter()
            F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    torch.set_num_threads(2)
    print(f"{'(B, nh, T, hs)':>20} {'dtype':>9} {'flash ms':>9} {'math ms':>8} {'math faster':>12}")
    for shape in SHAPES:
        for dtype in (torch.float32, torch.bfloat16):
            q, k, v = (torch.randn(*shape, dtype=dtype, requires_grad=True) for _ in range(3))
            flash = timed(q, k, v, SDPBackend.FLASH_ATTENTION)
            math = timed(q, k, v, SDPBackend.MATH)
            print(
                f"{shape!s:>20} {str(dtype)[6:]:>9} {flash:9.2f} {math:8.2f} {flash / math:11.2f}x"
            )


if __name__ == "__main__":
    main()
