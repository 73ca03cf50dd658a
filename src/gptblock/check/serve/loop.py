"""What every file where the block runs shares (``CAUGHT``, ``one_line``, ``UserValueError``),
the messages between the checker and the block's process (``send``, ``Reader``: a JSON line, then
its ``"bytes"`` of tensors, safetensors; nothing is pickled: reading a message runs no code it
carries), and ``record``: ``module(x)`` as ATen operators in JSON,
which the checker (``roles.trace``) replays. docs/checker.md, "The roles, from the dataflow"."""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import select
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager as ContextManager
from functools import partial
from typing import Any, TypeVar

import torch
import torch.nn as nn
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

try:
    from ...errors import UserValueError
except ImportError:  # copied outside gptblock (the runner's process): the checker maps it back

    class UserValueError(ValueError):  # type: ignore[no-redef]
        """A block that cannot be built or checked as it is; the message says why."""


__all__ = [
    "CAUGHT", "INPUT", "LEAF", "MAX_HEADER", "MAX_TENSORS", "SCRIPTED", "Message", "NoDropout",
    "Reader", "UserValueError", "decode", "default_dtype", "encode", "fixed_seed", "one_line",
    "record", "send", "setting", "signature",
]  # fmt: skip

# What the user's code may raise without stopping the check: any error, and sys.exit();
# KeyboardInterrupt still stops it.
CAUGHT = (Exception, SystemExit)

Tensor = torch.Tensor
Message = tuple[dict[str, Any], dict[str, Tensor]]  # a JSON object and tensors
INPUT = -1  # a node's op: the block's input
LEAF = -2  # a node's op: a parameter, buffer or constant tensor made before the forward pass
MAX_HEADER = 1 << 20  # bytes: a longer JSON line is not a message of ours
MAX_TENSORS = 1 << 31  # bytes of tensors in one message (a 768-wide block's weights: ~60 MB)
_T = TypeVar("_T")
SCRIPTED = torch.jit.ScriptModule  # takes no module hooks (its operators still show: s100)
_ENUMS = {"dtype": torch.dtype, "memory_format": torch.memory_format, "layout": torch.layout}


def one_line(e: BaseException | None) -> str:
    """'TypeError: first line of the message', for a one-line report."""
    if e is None:
        return "unknown error"
    if isinstance(e, SystemExit):
        return f"SystemExit: {e.code} (sys.exit({e.code!r}) was called)"
    lines = str(e).strip().splitlines()
    first = lines[0].rstrip(".") if lines else ""
    first = first if len(first) <= 300 else first[:300] + "..."  # a message may be megabytes
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


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


class _Mode(TorchDispatchMode):  # type: ignore[no-untyped-call]
    # without torch._dynamo's wrapper, which imports torch._dynamo (5 s) on first use
    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False


def encode(a: object, other: Callable[[object], object] | None = None) -> object:
    """An argument as JSON; else ``other(a)`` (a tensor's node), else opaque: not replayed."""
    if a is None or isinstance(a, (bool, int, float, str)):
        return a
    if isinstance(a, (tuple, list)):
        items = [encode(b, other) for b in a]
        return items if isinstance(a, list) else {"tuple": items}
    if isinstance(a, dict) and all(isinstance(k, str) for k in a):
        return {"dict": {k: encode(v, other) for k, v in a.items()}}
    if isinstance(a, complex):
        return {"complex": [a.real, a.imag]}
    if isinstance(a, torch.device):
        return {"device": str(a)}
    for key, kind in _ENUMS.items():
        if isinstance(a, kind):
            return {key: str(a).removeprefix("torch.")}
    return {"opaque": type(a).__name__} if other is None else other(a)


def decode(a: Any, other: Callable[[dict[str, Any]], Any], device: object = None) -> Any:
    """``encode``'s JSON made again, checked for form: ``other(a)`` for the caller's forms."""
    if isinstance(a, list):
        return [decode(b, other, device) for b in a]
    if not isinstance(a, dict):
        return a
    key, value = next(iter(a.items())) if len(a) == 1 else (None, None)
    if key == "tuple" and isinstance(value, list):
        return tuple(decode(b, other, device) for b in value)
    if key == "dict" and isinstance(value, dict):
        return {str(k): decode(v, other, device) for k, v in value.items()}
    if key == "complex" and isinstance(value, list) and len(value) == 2:
        return complex(float(value[0]), float(value[1]))
    if key == "device" and isinstance(value, str):
        with contextlib.suppress(RuntimeError):  # not a device: ``other``'s to refuse
            return device if device is not None else torch.device(value)
    found = getattr(torch, value, None) if key in _ENUMS and isinstance(value, str) else None
    return found if key in _ENUMS and isinstance(found, _ENUMS[key]) else other(a)


class _Recorder(_Mode):  # type: ignore[no-untyped-call]
    def __init__(self, module: nn.Module, x: Tensor) -> None:
        super().__init__()
        own = [*module.named_parameters(), *module.named_buffers()]
        self.known = {id(t): (t, n) for n, t in own}
        self.ops: list[dict[str, Any]] = []
        self.nodes: list[list[Any]] = []  # [op, data, name]
        self.values: list[Tensor] = []
        self.latest: dict[int, tuple[Tensor, int, object]] = {}  # id -> (tensor, node, stamp)
        self.stack: list[str] = [""]
        self.calls: list[list[Any]] = []  # [module, first op, end op, in nodes, out nodes]
        self.input = self.node_of(x, INPUT, data=True)
        parts = [(n, m) for n, m in module.named_modules() if not isinstance(m, SCRIPTED)][1:]
        self.handles = [m.register_forward_pre_hook(partial(self.pre, n)) for n, m in parts]
        self.handles += [m.register_forward_hook(partial(self.post, n)) for n, m in parts]

    def pre(self, name: str, m: nn.Module, args: Any) -> None:
        self.stack.append(name)
        self.calls.append([name, len(self.ops), -1, self.known_nodes(args), []])

    def post(self, name: str, m: nn.Module, args: Any, out: Any) -> None:
        self.stack.pop()
        call = next(c for c in reversed(self.calls) if c[0] == name and c[2] == -1)
        call[2], call[4] = len(self.ops), self.known_nodes(tree_flatten(out)[0])

    def known_nodes(self, values: Iterable[object]) -> list[int]:  # (``latest`` keeps them alive)
        return [self.latest[id(t)][1] for t in values if id(t) in self.latest]

    def new(self, t: Tensor, op: int, data: bool, name: str = "") -> int:
        self.nodes.append([op, data, name])
        self.values.append(t.detach().clone())
        self.latest[id(t)] = (t, len(self.nodes) - 1, _stamp(t))
        return len(self.nodes) - 1

    def node_of(self, t: Tensor, op: int = LEAF, data: bool = False) -> int:
        hit = self.latest.get(id(t))
        if hit is not None and hit[0] is t and hit[2] == _stamp(t):
            return hit[1]  # (a module's .to() swaps a parameter's data: then it is new)
        return self.new(t, op, data, self.known.get(id(t), (t, ""))[1])

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        inputs: list[int] = []

        def ref(a: object) -> object:
            if isinstance(a, Tensor):
                inputs.append(self.node_of(a))
                return {"r": inputs[-1]}
            return {"opaque": type(a).__name__}

        said = [encode(a, ref) for a in args], {k: encode(v, ref) for k, v in kwargs.items()}
        out = func(*args, **kwargs)
        index = len(self.ops)
        data = any(self.nodes[n][1] for n in inputs)
        outputs = [self.new(t, index, data) for t in tree_flatten(out)[0] if isinstance(t, Tensor)]
        written = args[0] if args and isinstance(args[0], Tensor) else None
        if data and written is not None and written._base is not None and func._schema.is_mutable:
            # input data written into a view of a tensor made before (a KV cache's buffer): what
            # is read from that tensor now holds it (``roles.trace.replay`` replays the write)
            hit = self.latest.get(id(written._base))
            if hit is not None and hit[0] is written._base:
                self.nodes[hit[1]][1] = True
        name = f"{func._schema.name}.{func._overloadname}"
        self.ops.append({"func": name, "args": said[0], "kwargs": said[1], "inputs": inputs,
                         "outputs": outputs, "module": self.stack[-1]})  # fmt: skip
        return out


def _stamp(t: Tensor) -> tuple[object, ...]:  # what it holds now: a changed tensor is a new node
    try:
        return (t.dtype, tuple(t.shape), t.data_ptr())  # (not _version: bumped after us)
    except RuntimeError:  # a tensor without storage
        return (t.dtype, tuple(t.shape))


@contextlib.contextmanager
def fixed_seed(device: torch.device | None = None) -> Iterator[None]:
    """Seed 0 inside; on a CPU ``device`` without CUDA only the CPU's generator (200x cheaper)."""
    cuda = device is not None and device.type == "cuda"
    with torch.random.fork_rng(devices=[device] if cuda else []):
        if device is not None and device.type == "cpu" and not torch.cuda.is_available():
            torch.default_generator.manual_seed(0)
        else:
            torch.manual_seed(0)
        yield


@contextlib.contextmanager
def setting(get: Callable[[], _T], put: Callable[[_T], object], value: _T) -> Iterator[None]:
    """A torch setting ``put`` to ``value`` inside, what ``get`` said before restored after."""
    before = get()
    put(value)
    try:
        yield
    finally:
        put(before)


def default_dtype(dtype: torch.dtype) -> ContextManager[None]:
    """``dtype`` the default inside: what the block makes without a dtype (a mask from
    ``torch.full``) is in its copy's dtype, as it would be run so; PyTorch's CPU attention
    can compute a float32 mask with float64 q, k, v wrongly (4-D, from T = 16; 2.13, 2.14)."""
    return setting(torch.get_default_dtype, torch.set_default_dtype, dtype)


class NoDropout(_Mode):  # type: ignore[no-untyped-call]
    """Every dropout an identity, however it is called (``bernoulli(p)``, whose mask is then
    divided by ``p``, fills with ``p``): for a probability the checker cannot reach."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = func._opname
        if name in ("bernoulli_", "bernoulli") and len(args) > 1 and isinstance(args[1], float):
            return args[0].fill_(args[1]) if name == "bernoulli_" else torch.full_like(*args[:2])
        if name == "native_dropout":
            return args[0].clone(), torch.ones_like(args[0], dtype=torch.bool)
        return func(*args, **(kwargs or {}))


def _first(out: object) -> object:  # of (output, cache or attention weights): the output
    return out[0] if isinstance(out, (tuple, list)) and out and isinstance(out[0], Tensor) else out


def signature(f: object) -> dict[str, inspect.Parameter]:
    """``f``'s parameters by name; none where Python cannot tell them."""
    try:
        return dict(inspect.signature(f).parameters)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return {}


def record(module: nn.Module, x: Tensor, *, no_dropout: bool = False) -> Message:
    """``module(x)`` run once, recorded as plain data (``roles.trace.from_plain`` reads it): node
    i's value is ``tensors[f"n{i}"]``; ``error`` when it raised with and without grad mode."""
    error = ""
    for grad in (True, False):  # without grad for a block that fails with it (an in-place view)
        rec = _Recorder(module, x)
        try:
            # inside the recorder: the ``fill_`` that replaced ``bernoulli_`` is recorded
            off = NoDropout() if no_dropout else contextlib.nullcontext()
            with (
                rec,
                off,
                fixed_seed(x.device),
                default_dtype(x.dtype),
                torch.set_grad_enabled(grad),
            ):
                out = _first(module(x))
        except Exception as e:  # the block's own error ends the trace, not the check
            error = error or type(e).__name__
            continue
        finally:
            for h in rec.handles:
                h.remove()
        made = isinstance(out, Tensor) and id(out) in rec.latest
        real = [torch.view_as_real(v.resolve_conj()) if v.is_complex() else v for v in rec.values]
        meta = {"ops": rec.ops, "nodes": rec.nodes, "input": rec.input, "calls": rec.calls,
                "output": rec.latest[id(out)][1] if made else None, "grad": grad,
                "parameters": {n: list(p.shape) for n, p in module.named_parameters()},
                "modules": [n for n, _ in module.named_modules()],
                "complex": [i for i, v in enumerate(rec.values) if v.is_complex()]}  # fmt: skip
        return meta, {f"n{i}": v for i, v in enumerate(real)}
    return {"error": error}, {}
