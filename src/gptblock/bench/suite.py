"""``gptblock bench``: the matmul peak, then every form of the block, in one process.

One process, so the peak and the blocks share the machine's state. The forms are timed
round-robin (one call of each per round), so a change in load hits all alike; a training step is
a forward and a backward without the optimizer. The peak is measured before and after, keeping
the higher (a lower one would flatter the blocks). What each column means: the command's
epilog (``gptblock bench --help``); how each is measured: ``gptblock.bench.measure``.

Shapes: B batch, T time, C = d_model channels, nh = n_heads heads.
"""

from __future__ import annotations

import os
import platform
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
from tqdm import tqdm

from .. import __version__
from ..blocks.config import BlockConfig, check_heads, check_positive_int
from ..blocks.convert import FORMS, convert
from ..blocks.fused import FusedBlock
from ..blocks.masks import causal_mask
from ..devices import DTYPES
from ..errors import UserValueError
from ..model.footprint import check_available
from .measure import block_flops, cpu_ticks, matmul_peak, others_busy, profile_call, timed

__all__ = [
    "BenchConfig",
    "BenchResult",
    "MatmulPeak",
    "Measurement",
    "device_unavailable",
    "memory_needed",
    "run_benchmark",
]

# Each of convert.FORMS, as the table names it.
FORM_LABELS = dict(
    zip(
        FORMS,
        ("lesson.Block", "TransformerBlock", "FusedBlock", "nn.TransformerEncoderLayer"),
        strict=True,
    )
)
# Not a form: the block's own matmuls (q/k/v, output projection, MLP; in training also their
# input- and weight-gradient matmuls) on inputs of the same shapes, with no attention, LayerNorm,
# activation or residual add. Its "% peak" (model FLOPs over its time) is the ceiling no form
# can pass unless everything but those matmuls were free.
MATMULS = "matmuls"
ROWS = {**FORM_LABELS, MATMULS: "matmuls alone (ceiling)"}
MODES = ("inference", "training")
# For a smoke test of the whole pipeline in seconds: `gptblock bench --quick`.
QUICK = dict(
    d_model=32,
    n_heads=2,
    seq_len=16,
    batch=2,
    sweep=(8, 32),
    warmup=1,
    repeats=2,
    peak_sizes=(128, 256),
)


@dataclass(frozen=True)
class BenchConfig:
    """What ``run_benchmark`` measures; each sweep T runs at batch ``batch * seq_len // T``."""

    d_model: int = 384  # C
    n_heads: int = 6  # nh
    seq_len: int = 256  # T of the main shape
    batch: int = 8  # B of the main shape
    sweep: tuple[int, ...] = (64, 128, 256, 512, 1024)  # further T, at constant tokens per call
    activation: str = "gelu"  # all forms but the lesson's (ReLU)
    device: str = "cpu"
    dtype: str = "float32"
    warmup: int = 2  # untimed calls before each measurement
    repeats: int = 7  # timed calls; the median is reported
    peak_sizes: tuple[int, ...] = ()  # N of the (N, N) @ (N, N) peak matmuls; () = by device

    def __post_init__(self) -> None:
        for name in ("d_model", "n_heads", "seq_len", "batch", "repeats"):
            check_positive_int(name, getattr(self, name))
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise UserValueError(f"warmup must be an int >= 0, got {self.warmup!r}")
        for T in (*self.sweep, *self.peak_sizes):
            check_positive_int("sweep and peak sizes", T)
        if self.dtype not in DTYPES:
            raise UserValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        # Validates the rest without allocating a block (an absurd d_model would fail there).
        check_heads(self.d_model, self.n_heads)  # named as this config's fields
        BlockConfig(self.d_model, self.n_heads, activation=self.activation)

    def shapes(self) -> list[tuple[int, int]]:
        tokens = self.batch * self.seq_len
        shapes = [(self.batch, self.seq_len)]
        shapes += [(max(1, tokens // T), T) for T in self.sweep]
        return list(dict.fromkeys(shapes))  # the main shape may be in the sweep too

    def matmul_sizes(self) -> tuple[int, ...]:
        if self.peak_sizes:
            return self.peak_sizes
        return (4096, 8192, 16384) if self.device.startswith("cuda") else (1024, 2048, 4096)


@dataclass(frozen=True)
class MatmulPeak:
    """The practical peak: the best median FLOP/s over the square matmul sizes tried."""

    flops_per_s: float  # the peak
    size: int  # the N that reached it
    by_size: dict[int, float]  # N -> median FLOP/s, best of the runs before and after


@dataclass(frozen=True)
class Measurement:
    """One form, one mode, one shape."""

    form: str  # convert's name (lesson, mha, fused, encoder_layer), or matmuls
    mode: str  # inference or training
    batch: int  # B
    seq_len: int  # T
    ms: float  # median milliseconds per call
    ms_samples: list[float]  # every timed call
    tokens_per_s: float  # B * T / median seconds
    flops: float  # model FLOPs per call (see the module docstring)
    pct_of_peak: float  # flops / median seconds / peak FLOP/s, in percent
    speedup_vs_encoder_layer: float  # encoder layer's median ms / this form's
    peak_memory_bytes: int | None  # most tensor memory during one call above its start
    attention: str  # the attention kernel the profiler saw


@dataclass
class BenchResult:
    """Everything ``run_benchmark`` measured, plus the machine it ran on."""

    config: BenchConfig
    peak: MatmulPeak
    measurements: list[Measurement]
    environment: dict[str, Any] = field(default_factory=dict)


def memory_needed(config: BenchConfig) -> int:
    """Bytes the benchmark's largest moment needs, estimated before anything is allocated: the
    forms' weights and gradients (and the lesson's masks), plus the larger of the peak matmuls'
    operands and a training step's activations (as ``gptblock.model.footprint`` counts them).

    Example:
        >>> memory_needed(BenchConfig(**QUICK)) < 2**30
        True
    """
    b = DTYPES[config.dtype].itemsize
    C, nh, T_max = config.d_model, config.n_heads, max(T for _, T in config.shapes())
    weights = 4 * 2 * (12 * C * C + 13 * C) * b + nh * T_max * T_max * b
    steps = max((17 * B * T * C + 3 * B * nh * T * T) * b for B, T in config.shapes())
    matmuls = 3 * max(config.matmul_sizes()) ** 2 * b
    return weights + max(steps, matmuls)


def device_unavailable(device: str) -> str | None:
    """Why ``device`` cannot run the benchmark here, or None if it can."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        return f"device {device!r} requested but CUDA is not available on this machine"
    if not device.startswith(("cpu", "cuda")):
        return f"device must be 'cpu' or 'cuda[:N]', got {device!r}"
    return None


def _make_forms(config: BenchConfig, block_size: int) -> dict[str, nn.Module]:
    torch.manual_seed(0)
    base = FusedBlock(config.d_model, config.n_heads, activation=config.activation)
    relu = FusedBlock(config.d_model, config.n_heads, activation="relu")
    forms = {
        "lesson": convert(relu, "lesson", block_size=block_size),
        "mha": convert(base, "mha"),
        "fused": base,
        "encoder_layer": convert(base, "encoder_layer"),
    }
    dtype, device = DTYPES[config.dtype], torch.device(config.device)
    return {name: m.to(device=device, dtype=dtype) for name, m in forms.items()}


Call = tuple[Callable[[], object], Callable[[], None]]  # (the call to time, its untimed reset)


def _call(name: str, module: nn.Module, mode: str, x: torch.Tensor, mask: torch.Tensor) -> Call:
    module.train(mode == "training")

    def forward(x: torch.Tensor) -> torch.Tensor:
        if name == "encoder_layer":  # the causal mask is the caller's job here, built once
            return module(x, src_mask=mask, is_causal=True)
        return module(x)

    if mode == "inference":

        def infer() -> object:
            with torch.no_grad():
                return forward(x)

        return infer, lambda: None
    xg = x.detach().requires_grad_(True)  # the input a stack of blocks would hand on
    grad = torch.randn_like(x)  # (B, T, C), what the next layer would send back

    def step() -> object:
        torch.autograd.backward(forward(xg), grad)
        return None

    def reset() -> None:
        module.zero_grad(set_to_none=True)
        xg.grad = None

    return step, reset


def _matmuls_call(config: BenchConfig, x: torch.Tensor, mode: str) -> Call:
    B, T, C = x.shape
    g = torch.Generator(device=x.device).manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=g, device=x.device).to(x.dtype)

    layers = [(C, 3 * C), (C, C), (C, 4 * C), (4 * C, C)]  # (in, out): qkv, out_proj, MLP
    tensors = [(randn(B * T, i), randn(o, i), randn(B * T, o)) for i, o in layers]

    def run() -> object:
        for a, w, grad in tensors:
            a @ w.t()  # (BT, in) @ (in, out): the forward
            if mode == "training":
                grad @ w  # (BT, out) @ (out, in): the input's gradient
                grad.t() @ a  # (out, BT) @ (BT, in): the weight's gradient
        return None

    return run, lambda: None


def _environment(config: BenchConfig) -> dict[str, Any]:
    device = torch.device(config.device)
    return {
        "gptblock": __version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
    }


def run_benchmark(config: BenchConfig, progress: bool = True) -> BenchResult:
    """Measure the matmul peak and every form on every shape of ``config``.

    Example:
        >>> cfg = BenchConfig(d_model=16, n_heads=2, seq_len=8, batch=2, sweep=(),
        ...                   warmup=0, repeats=1, peak_sizes=(64,))
        >>> result = run_benchmark(cfg, progress=False)
        >>> sorted({m.form for m in result.measurements})
        ['encoder_layer', 'fused', 'lesson', 'matmuls', 'mha']
    """
    if (why := device_unavailable(config.device)) is not None:
        raise UserValueError(why)
    check_available(
        memory_needed(config),
        config.device,
        "the benchmark",
        "lower --batch, --seq-len, --d-model, --sweep or --peak-sizes",
    )
    device, dtype = torch.device(config.device), DTYPES[config.dtype]
    shapes = config.shapes()
    sizes = config.matmul_sizes()
    calls_per_shape = len(MODES) * len(ROWS) * (config.warmup + config.repeats + 1)
    total = len(shapes) * calls_per_shape + 2 * len(sizes)
    env = _environment(config) | {"load_before": os.getloadavg()}
    ticks = cpu_ticks()
    with tqdm(total=total, desc="gptblock bench", disable=not progress, leave=False) as bar:
        bar.set_postfix_str("matmul peak")
        before = matmul_peak(sizes, device, dtype, config.warmup, config.repeats)
        bar.update(len(sizes))
        forms = _make_forms(config, block_size=max(T for _, T in shapes))
        rows = []
        for B, T in shapes:
            x = torch.randn(B, T, config.d_model, device=device, dtype=dtype)
            for mode in MODES:
                bar.set_postfix_str(f"T={T} B={B} {mode}")
                mask = causal_mask(T, device=device)
                calls = {name: _call(name, m, mode, x, mask) for name, m in forms.items()}
                calls[MATMULS] = _matmuls_call(config, x, mode)
                samples: dict[str, list[float]] = {name: [] for name in calls}
                for r in range(config.warmup + config.repeats):  # round-robin over the forms
                    for name, (fn, reset) in calls.items():
                        reset()
                        t = timed(fn, device)
                        if r >= config.warmup:
                            samples[name].append(t)
                        bar.update()
                memory = {}
                for name, (fn, reset) in calls.items():
                    reset()
                    memory[name] = profile_call(fn, device)
                    bar.update()
                flops = block_flops(config.d_model, T, B * T, training=mode == "training")
                rows.append((B, T, mode, flops, samples, memory))
        bar.set_postfix_str("matmul peak again")
        after = matmul_peak(sizes, device, dtype, config.warmup, config.repeats)
        bar.update(len(sizes))
    by_size = {N: max(before[N], after[N]) for N in sizes}
    best = max(by_size, key=lambda N: by_size[N])
    peak = MatmulPeak(by_size[best], best, by_size)
    env["load_after"] = os.getloadavg()
    env["others_cpu_share"] = others_busy(ticks)
    measurements = []
    for B, T, mode, flops, samples, memory in rows:
        median = {name: statistics.median(s) for name, s in samples.items()}
        for name in ROWS:
            m = median[name]
            measurements.append(
                Measurement(
                    form=name,
                    mode=mode,
                    batch=B,
                    seq_len=T,
                    ms=m * 1e3,
                    ms_samples=[s * 1e3 for s in samples[name]],
                    tokens_per_s=B * T / m,
                    flops=flops,
                    pct_of_peak=100 * flops / m / peak.flops_per_s,
                    speedup_vs_encoder_layer=median["encoder_layer"] / m,
                    peak_memory_bytes=memory[name][0],
                    attention=memory[name][1],
                )
            )
    return BenchResult(config, peak, measurements, env)
