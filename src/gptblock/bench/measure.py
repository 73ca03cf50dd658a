"""How ``gptblock bench`` measures, knowing nothing of block forms: time (the device
synchronised), the matmul peak, model FLOPs, peak memory, the attention kernel, machine load.

Peak memory on the CPU sums ``torch.profiler``'s allocation and free events in time order
(process RSS was rejected: glibc keeps freed memory, so RSS shows only the first call's growth).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator

import torch
from torch.profiler import ProfilerActivity, profile

from ..devices import cpu_ticks

__all__ = [
    "KERNELS",
    "block_flops",
    "cpu_ticks",
    "matmul_peak",
    "others_busy",
    "profile_call",
    "timed",
]

KERNELS = {  # profiler op name fragment -> how the table names the attention it ran
    "_transformer_encoder_layer_fwd": "encoder fast path",
    "flash_attention": "sdpa flash",
    "efficient_attention": "sdpa efficient",
    "cudnn_attention": "sdpa cudnn",
    "attention_math": "sdpa math",
    "aten::_masked_softmax": "masked softmax (T x T)",
    "aten::_softmax": "softmax (T x T)",
}


def block_flops(d_model: int, seq_len: int, tokens: int, training: bool) -> float:
    """Model FLOPs of one call on ``tokens`` tokens of length-``seq_len`` sequences: nanoGPT's
    estimate_mfu for one layer, causal attention at half the T x T.

    Example:
        >>> block_flops(384, 256, 2048, training=False) / 1e9  # the default inference shape
        7.670857728
    """
    C, T = d_model, seq_len
    n_params = 12 * C * C + 13 * C
    per_token = 6 * n_params + 6 * C * T if training else 2 * n_params + 2 * C * T
    return float(per_token * tokens)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device) -> float:
    """Wall-clock seconds of ``fn()``, the device synchronised before and after.

    Example:
        >>> timed(lambda: sum(range(10)), torch.device("cpu")) < 1.0
        True
    """
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def matmul_peak(
    sizes: tuple[int, ...], device: torch.device, dtype: torch.dtype, warmup: int, repeats: int
) -> dict[int, float]:
    """Median FLOP/s of (N, N) @ (N, N) for each N in ``sizes``, after ``warmup`` untimed ones.

    Example:
        >>> rates = matmul_peak((64,), torch.device("cpu"), torch.float32, warmup=1, repeats=3)
        >>> list(rates), rates[64] > 0
        ([64], True)
    """
    rates = {}
    for N in sizes:
        a = torch.randn(N, N, device=device, dtype=dtype)
        b = torch.randn(N, N, device=device, dtype=dtype)
        for _ in range(warmup):
            a @ b
        times = [timed(lambda: a @ b, device) for _ in range(repeats)]  # noqa: B023
        rates[N] = 2 * N**3 / statistics.median(times)
    return rates


@contextlib.contextmanager
def _kineto_quiet() -> Iterator[None]:
    """fd 2 to /dev/null during a ``profile()``: libkineto writes "USDT: profiler_start/stop"
    there whatever KINETO_LOG_LEVEL says. Python warnings are kept and re-issued after."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with warnings.catch_warnings(record=True) as caught, open(os.devnull, "w") as null:
            warnings.simplefilter("always")
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    for w in caught:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def profile_call(fn: Callable[[], object], device: torch.device) -> tuple[int | None, str]:
    """(peak memory in bytes above the start, the attention kernel) of one call of ``fn``.

    Example:
        >>> from gptblock import FusedBlock
        >>> block, x = FusedBlock(16, 2).eval(), torch.randn(2, 5, 16)
        >>> memory, kernel = profile_call(lambda: block(x), torch.device("cpu"))
        >>> memory > 0, kernel
        (True, 'sdpa flash')
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device)
    with (
        _kineto_quiet(),
        profile(activities=[ProfilerActivity.CPU], profile_memory=device.type == "cpu") as prof,
    ):
        fn()
        _sync(device)
    names = {e.name for e in prof.events()}
    seen = [label for frag, label in KERNELS.items() if any(frag in n for n in names)]
    kernel = seen[0] if seen else "none"
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) - start, kernel
    # Every allocation and free the profiler saw, in time order; the running sum's maximum.
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    running = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        running += e.nbytes()
        peak = max(peak, running)
    return peak, kernel


def others_busy(start: tuple[float, float, float] | None) -> float | None:
    """The share of all CPUs that other processes kept busy since ``start`` (a ``cpu_ticks()``).

    Example:
        >>> share = others_busy(cpu_ticks())
        >>> share is None or 0.0 <= share
        True
    """
    end = cpu_ticks()
    if start is None or end is None:
        return None
    wall = (end[0] - start[0]) * (os.cpu_count() or 1)
    return max(0.0, (end[1] - start[1]) - (end[2] - start[2])) / wall
