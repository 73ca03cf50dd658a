"""Causal attention's CPU routes at the shapes gptblock trains at: SDPA's flash and math kernels
and the explicit products (``gptblock.blocks.attention.product_attention``).

    python benchmarks/attention_kernels.py

Times causal attention on (B, nh, T, hs) by each route (SDPA's kernels forced by
``torch.nn.attention.sdpa_kernel``), in float32 and bfloat16: the median of 10 calls after 3
untimed ones, "train" a forward and backward, "infer" a forward under ``torch.no_grad``.
``gptblock.blocks.attention.causal_attention`` takes the products where this shows them the
fastest (training in reduced precision, T <= 256) and leaves the rest to SDPA's own choice.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from gptblock.blocks.attention import product_attention

SHAPES = [(128, 4, 32, 32), (64, 4, 64, 32), (32, 4, 128, 32), (16, 4, 256, 32), (8, 6, 256, 64)]

Route = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def sdpa(backend: SDPBackend) -> Route:
    def route(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    return route


ROUTES: dict[str, Route] = {
    "flash": sdpa(SDPBackend.FLASH_ATTENTION),
    "math": sdpa(SDPBackend.MATH),
    "products": product_attention,
}


def timed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, route: Route, train: bool) -> float:
    def call() -> None:
        if train:
            route(q, k, v).sum().backward()
        else:
            with torch.no_grad():
                route(q, k, v)

    for _ in range(3):
        call()
    times = []
    for _ in range(10):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    torch.set_num_threads(2)
    names = " ".join(f"{name + ' ms':>11}" for name in ROUTES)
    print(f"{'(B, nh, T, hs)':>20} {'dtype':>9} {'pass':>6} {names}  fastest")
    for shape in SHAPES:
        for dtype in (torch.float32, torch.bfloat16):
            q, k, v = (torch.randn(*shape, dtype=dtype, requires_grad=True) for _ in range(3))
            for train in (True, False):
                ms = {name: timed(q, k, v, route, train) for name, route in ROUTES.items()}
                cells = " ".join(f"{t:11.2f}" for t in ms.values())
                fastest = min(ms, key=ms.__getitem__)
                kind = "train" if train else "infer"
                print(f"{shape!s:>20} {str(dtype)[6:]:>9} {kind:>6} {cells}  {fastest}")


if __name__ == "__main__":
    main()
