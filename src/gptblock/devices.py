"""Where and in what precision to run: device names, dtype names and autocast.

One table of dtype names (``DTYPES``) serves every command: training runs in the
``AUTOCAST_DTYPES`` (float32 means no autocast at all), the benchmark in any of them.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import torch

from .errors import UserValueError

__all__ = ["AUTOCAST_DTYPES", "DTYPES", "autocast_context", "resolve_device"]

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}
AUTOCAST_DTYPES = ("float32", "bfloat16", "float16")  # what training runs in


def autocast_context(device: torch.device, dtype: str) -> contextlib.AbstractContextManager[Any]:
    """The autocast context for ``dtype`` on ``device``; a no-op for float32.

    Raises:
        UserValueError: ``dtype`` is not one of ``AUTOCAST_DTYPES``, or the device's autocast
            does not support it.
    """
    # float32 means no autocast at all, so the default path runs exactly the model's own math.
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
    if caught and not problem:
        problem = str(caught[0].message)
    if problem:
        first_line = problem.splitlines()[0]
        raise UserValueError(
            f"dtype={dtype} is not supported on device {device.type!r} ({first_line}); "
            f"use --dtype float32"
        )
    return ctx


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
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserValueError(
            f"unknown device {name!r}; expected cpu, cuda, cuda:N, mps or auto"
        ) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserValueError(
            f"device {name!r} asked for, but this PyTorch sees no CUDA GPU; use cpu"
        )
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise UserValueError(f"device {name!r} asked for, but MPS is not available here; use cpu")
    return name
