"""``gptblock info``: versions, threads and devices, for bug reports and benchmark context."""

from __future__ import annotations

import argparse
import platform

import numpy as np
import torch

from .. import __version__
from .formatting import add_command


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    add_command(sub, "info", run, argparse.HelpFormatter)


def run(args: argparse.Namespace) -> int:
    cuda = torch.cuda.is_available()
    rows = [
        ("gptblock", __version__),
        ("python", platform.python_version()),
        ("torch", torch.__version__),
        ("numpy", np.__version__),
        ("cpu threads", str(torch.get_num_threads())),
        ("cpu capability", torch.backends.cpu.get_cpu_capability()),
        ("cuda", torch.cuda.get_device_name(0) if cuda else "not available"),
    ]
    for name, value in rows:
        print(f"{name:<15} {value}")
    return 0
