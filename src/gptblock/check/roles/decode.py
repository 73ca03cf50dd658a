"""What the process running the block sends of a forward pass, read back as data.

``loop.record`` encodes every operator's arguments as JSON (``loop.encode``); ``decode`` turns
one back into what the operator takes, a reference to a node into a ``Ref``, and ``operator``
finds an operator by its qualified name in torch's own registry: never anything the block
defined, and never code the message carries. Anything else is a ``TraceError``.

Shapes: none.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Opaque", "Ref", "TraceError", "decode", "ints", "operator"]


class TraceError(Exception):
    """The forward pass cannot be recorded or re-run as recorded; the message says why."""


@dataclass(frozen=True)
class Ref:
    """A node in an operator's recorded arguments."""

    node: int


class Opaque:
    """An argument recorded without its value (a generator, say): an operator that takes one
    cannot be re-executed."""

    def __init__(self, kind: str) -> None:
        self.kind = kind


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ENUMS = {"dtype": torch.dtype, "memory_format": torch.memory_format, "layout": torch.layout}


def operator(name: object) -> Any:
    """torch's own operator named ``namespace::name.overload``: found in torch's registry,
    never anything the block defined in the checker's process."""
    if not isinstance(name, str) or "::" not in name:
        raise TraceError(f"an operator named {str(name)[:80]!r}")
    ns, _, rest = name.partition("::")
    op, _, overload = rest.rpartition(".")
    if not all(_NAME.fullmatch(n) for n in (ns, op, overload)):
        raise TraceError(f"an operator named {name[:80]!r}")
    try:
        func = getattr(getattr(getattr(torch.ops, ns), op), overload)
    except (AttributeError, RuntimeError):
        raise TraceError(f"an operator the checker does not have: {name[:80]}") from None
    if not isinstance(func, torch._ops.OpOverload):
        raise TraceError(f"an operator named {name[:80]!r}")
    return func


def decode(a: object, nodes: int, device: torch.device | None = None) -> object:
    """A recorded argument (``loop.encode``'s JSON) back as the operator takes it."""
    if a is None or isinstance(a, (bool, int, float, str)):
        return a
    if isinstance(a, list):
        return [decode(b, nodes, device) for b in a]
    if not isinstance(a, dict) or len(a) != 1:
        raise TraceError("an operator's argument of no known form")
    ((key, value),) = a.items()
    if key == "r" and isinstance(value, int) and 0 <= value < nodes:
        return Ref(value)
    if key == "tuple" and isinstance(value, list):
        return tuple(decode(b, nodes, device) for b in value)
    if key == "dict" and isinstance(value, dict):
        return {str(k): decode(v, nodes, device) for k, v in value.items()}
    if key == "complex" and isinstance(value, list) and len(value) == 2:
        return complex(float(value[0]), float(value[1]))
    if key == "device" and isinstance(value, str):
        try:
            return device if device is not None else torch.device(value)
        except RuntimeError:
            raise TraceError(f"a device {value[:40]!r}") from None
    if key in _ENUMS and isinstance(value, str) and _NAME.fullmatch(value):
        found = getattr(torch, value, None)
        if isinstance(found, _ENUMS[key]):
            return found
    if key == "opaque":
        return Opaque(str(value)[:40])
    raise TraceError("an operator's argument of no known form")


def ints(value: object) -> list[int]:
    if not isinstance(value, list) or not all(type(n) is int for n in value):
        raise TraceError("a list of nodes that is not one")
    return value
