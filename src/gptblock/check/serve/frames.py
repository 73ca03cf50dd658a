"""The messages between the checker and the block's process: a JSON line, then its ``"bytes"``
of tensors (safetensors). Nothing is pickled: reading a message runs no code it carries."""

from __future__ import annotations

import json
import os
import select
import time
from typing import Any

import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from .loop import Message

__all__ = ["MAX_HEADER", "MAX_TENSORS", "Message", "Reader", "send"]

MAX_HEADER = 1 << 20  # bytes: a longer JSON line is not a message of ours
MAX_TENSORS = 1 << 31  # bytes of tensors in one message (a 768-wide block's weights: ~60 MB)


def send(fd: int, header: dict[str, Any], tensors: dict[str, torch.Tensor] | None = None) -> None:
    blob = b""
    if tensors:
        blob = save_tensors({k: v.detach().cpu().contiguous() for k, v in tensors.items()})
    view = memoryview((json.dumps({**header, "bytes": len(blob)}) + "\n").encode() + blob)
    while view:
        view = view[os.write(fd, view) :]


class Reader:
    """Messages from a pipe, each within a deadline."""

    def __init__(self, fd: int) -> None:
        self.fd, self.buffer = fd, bytearray()

    def _fill(self, deadline: float | None, size: int | None) -> None:  # size None: a line
        while b"\n" not in self.buffer if size is None else len(self.buffer) < size:
            if size is None and len(self.buffer) > MAX_HEADER:
                raise ValueError(f"a line of over {MAX_HEADER} bytes")
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not select.select([self.fd], [], [], remaining)[0]:
                    raise TimeoutError
            chunk = os.read(self.fd, 1 << 20)
            if not chunk:
                raise EOFError
            self.buffer += chunk

    def next(self, deadline: float | None = None) -> Message:
        """The next message; else TimeoutError past ``deadline``, EOFError, or ValueError."""
        self._fill(deadline, None)
        end = self.buffer.index(b"\n")
        header = json.loads(bytes(self.buffer[:end]))
        if not isinstance(header, dict):
            raise ValueError("a message that is not a JSON object")
        size = header.get("bytes", 0)
        if not isinstance(size, int) or not 0 <= size <= MAX_TENSORS:
            raise ValueError(f"a message of {size!r} bytes of tensors")
        del self.buffer[: end + 1]
        self._fill(deadline, size)
        blob = bytes(self.buffer[:size])
        del self.buffer[:size]
        try:
            return header, load_tensors(blob) if size else {}
        except Exception as e:  # safetensors' own errors are of several kinds
            raise ValueError(f"tensors that do not load: {e}") from e
