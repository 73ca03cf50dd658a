"""Where and in what precision to run: device names, dtype names, autocast, CPU threads, memory."""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from .blocks.config import check_positive_int
from .errors import UserTypeError, UserValueError

__all__ = ["AUTOCAST_DTYPES", "DEVICE_TYPES", "DTYPES", "autocast_context", "available_memory"]
__all__ += ["busy_cores", "choose_threads", "cpu_threads", "cpu_ticks", "native_bfloat16"]
__all__ += ["resolve_device", "resolve_dtype", "set_threads"]

AUTOCAST_DTYPES = ("float32", "bfloat16", "float16")  # what training runs in
DTYPES: dict[str, torch.dtype] = {n: getattr(torch, n) for n in (*AUTOCAST_DTYPES, "float64")}


def native_bfloat16(device: str | torch.device) -> bool:
    """Whether ``device`` multiplies bfloat16 matrices in hardware (AVX-512 BF16 or AMX, an
    Ampere or newer GPU): 1018 GFLOP/s against float32's 216 on this project's 2-core EPYC."""
    device = torch.device(device)
    if device.type == "cuda":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    if device.type == "cpu":
        probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # torch.cpu, >= 2.1
        return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in probes)
    return False


def resolve_dtype(name: str, device: str | torch.device) -> str:
    """``"auto"``: bfloat16 where ``device`` has ``native_bfloat16``, else float32; any other
    name as it is."""
    return name if name != "auto" else "bfloat16" if native_bfloat16(device) else "float32"


def autocast_context(device: torch.device, dtype: str) -> contextlib.AbstractContextManager[Any]:
    """The autocast context for ``dtype`` on ``device`` (float32: none, so the default path runs
    exactly the model's own math), refusing one the device's autocast does not support."""
    if dtype == "float32":
        return contextlib.nullcontext()
    if dtype not in AUTOCAST_DTYPES:
        raise UserValueError(f"autocast dtype must be one of {AUTOCAST_DTYPES}, got {dtype!r}")
    problem = ""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            ctx = torch.autocast(device_type=device.type, dtype=DTYPES[dtype])
        except RuntimeError as e:  # an unknown device type; bfloat16 on an older GPU
            problem = str(e)
    # Some unsupported combinations only warn and disable autocast; make them errors too.
    problem = problem or (str(caught[0].message) if caught else "")
    if problem:
        raise UserValueError(
            f"dtype={dtype} is not supported on device {device.type!r} "
            f"({problem.splitlines()[0]}); use --dtype float32"
        )
    return ctx


DEVICE_TYPES = ("cpu", "cuda", "mps")  # where gptblock runs; "meta" has shapes but no data


def resolve_device(name: str) -> str:
    """``"auto"`` becomes ``"cuda"`` when a GPU is usable, else ``"cpu"``; others are checked.

    Example:
        >>> resolve_device("cpu")
        'cpu'
        >>> resolve_device("gpu")
        Traceback (most recent call last):
        ...
        gptblock.errors.UserValueError: unknown device 'gpu'; expected cpu, cuda, cuda:N, mps or auto
    """
    if not isinstance(name, str):
        raise UserTypeError(f"device must be a string such as 'cpu' or 'cuda', got {name!r:.40}")
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserValueError(
            f"unknown device {name!r}; expected cpu, cuda, cuda:N, mps or auto"
        ) from None
    if device.type not in DEVICE_TYPES:
        raise UserValueError(
            f"device {name!r} cannot run gptblock (a {device.type!r} tensor holds no data "
            f"to compute with, or gptblock does not support it); expected cpu, cuda, cuda:N, "
            f"mps or auto"
        )
    if device.type in ("cpu", "mps") and device.index not in (None, 0):
        # PyTorch ignores the index of a CPU: cpu:1 would silently run on the one CPU device.
        raise UserValueError(
            f"device {name!r}: PyTorch has one {device.type} device; use {device.type}"
        )
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserValueError(
            f"device {name!r} asked for, but this PyTorch sees no CUDA GPU; use cpu"
        )
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise UserValueError(
            f"device {name!r} asked for, but this machine has {torch.cuda.device_count()} "
            f"CUDA GPU(s): cuda:0 to cuda:{torch.cuda.device_count() - 1}"
        )
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise UserValueError(f"device {name!r} asked for, but MPS is not available here; use cpu")
    return name


THREADS_PER_CORE = 4  # the most CPU threads set_threads allows per core


def set_threads(n: int) -> None:
    """``torch.set_num_threads(n)`` for an int in [1, 4 per CPU core] (100,000 crash OpenMP).

    Example:
        >>> set_threads(0)
        Traceback (most recent call last):
        ...
        gptblock.errors.UserValueError: threads must be a positive int, got 0
    """
    check_positive_int("threads", n)
    most = THREADS_PER_CORE * (os.cpu_count() or 1)
    if n > most:
        raise UserValueError(
            f"threads must be at most {most} ({THREADS_PER_CORE} per CPU core of this "
            f"machine's {os.cpu_count() or 1}), got {n}"
        )
    torch.set_num_threads(n)


PROBE_SECONDS = 0.1  # how long choose_threads watches the machine: 10 clock ticks per CPU


def cpu_ticks() -> tuple[float, float, float] | None:
    """(wall seconds, busy CPU-seconds of the machine, of this process); None off Linux."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    own = os.times()
    busy = (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # not idle, iowait
    return time.perf_counter(), busy, own.user + own.system


def busy_cores(seconds: float = PROBE_SECONDS) -> float | None:
    """How many CPUs other processes keep busy now, watched for ``seconds``; None without /proc."""
    start = cpu_ticks()
    time.sleep(seconds)
    end = cpu_ticks()
    if start is None or end is None:
        return None
    wall, busy, own = (b - a for a, b in zip(start, end, strict=True))
    return max(0.0, (busy - own) / wall)


def choose_threads(threads: int | None = None) -> int:
    """Set and return torch's CPU threads: ``threads`` if given, else the free cores (at most
    torch's choice, at least one; ``OMP_NUM_THREADS`` kept where set). OpenMP threads spin
    waiting for each other, so one whose core another process holds stalls the rest: with one
    busy neighbour on 2 cores, generation took 4.8x its quiet time on both threads, 1.5x on one.
    Rejected: the load average, a minute behind."""
    if threads is not None:
        set_threads(threads)
        return threads
    if "OMP_NUM_THREADS" in os.environ:
        return torch.get_num_threads()
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    most = min(torch.get_num_threads(), cpus or 1)
    busy = busy_cores()
    free = most if busy is None else min(most, (cpus or 1) - round(busy))
    torch.set_num_threads(max(1, free))
    return max(1, free)


@contextlib.contextmanager
def cpu_threads(threads: int | None = None) -> Iterator[int]:
    """``choose_threads(threads)`` inside the block; torch's previous count restored after."""
    before = torch.get_num_threads()
    try:
        yield choose_threads(threads)
    finally:
        torch.set_num_threads(before)


def available_memory(device: str | torch.device = "cpu") -> int | None:
    """Bytes the machine can still allocate on ``device`` (on the CPU ``MemAvailable`` within a
    cgroup's limit), or None where that is unknown."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])  # (free, total)
    if device.type != "cpu":
        return None
    found = [m for m in (_meminfo_available(), _cgroup_room()) if m is not None]
    return min(found) if found else None


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # the kernel says kB and means KiB
    except (OSError, ValueError, IndexError):
        pass
    try:  # other POSIX systems: free pages, without the reclaimable cache (an underestimate)
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _cgroup_room() -> int | None:
    # cgroup v2: a container's limit, which MemAvailable (the whole machine's) does not see.
    root = Path("/sys/fs/cgroup")
    try:
        limit = (root / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(0, int(limit) - int((root / "memory.current").read_text()))
    except (OSError, ValueError):
        return None
