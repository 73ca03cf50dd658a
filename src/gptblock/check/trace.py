"""One forward pass of a block recorded operator by operator, and re-run with tensors replaced.

``record(module, x)`` runs the block once under a ``TorchDispatchMode`` and returns a ``Trace``:
every ATen operator the forward pass ran (``Op``), every tensor value it made or read
(``Node``: the block's input, a parameter or buffer, or an operator's output), which values
depend on the input (``data``) and which only on weights and constants (static), and which of
the block's modules was running. This works on any code, whatever modules, functions, einsums or
raw parameters it uses (``torch.fx`` needs code it can trace symbolically; this needs only that
the block runs). ``rerun`` runs it again with chosen values replaced (an intervention, as in
activation patching): ``gptblock.check.dataflow`` reads a weight by replacing a sub-layer's input
with basis vectors. ``replay`` re-executes the operators between two nodes as a function.

Grad mode is on while recording, so that ``nn.MultiheadAttention`` takes its decomposed path
(its fused fast path is one opaque operator); the block's RNG is re-seeded before every run.

Shapes: B batch, T time, C channels.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from .report import CAUGHT

__all__ = ["NoDropout", "Node", "Op", "Trace", "TraceError", "record", "replay", "rerun"]

Tensor = torch.Tensor
INPUT = -1  # Node.op of the block's input
LEAF = -2  # Node.op of a parameter, buffer or constant tensor made before the forward pass


class TraceError(Exception):
    """The forward pass cannot be recorded or re-run as recorded; the message says why."""


@dataclass
class Node:
    """One tensor value of the forward pass.

    Args:
        id: its index in ``Trace.nodes``.
        op: the index of the operator that made it (``INPUT``, ``LEAF``).
        value: a detached copy of the value as it was made.
        data: whether it depends on the block's input (else it is static: weights, constants).
        name: a parameter's or buffer's name in the block.
    """

    id: int
    op: int
    value: Tensor
    data: bool
    name: str = ""

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape)


@dataclass(frozen=True)
class _Ref:
    """A node in an operator's recorded arguments."""

    node: int


@dataclass
class Op:
    """One ATen operator call: what it is, what it read and made, inside which module."""

    index: int
    func: Any  # torch._ops.OpOverload
    args: tuple[Any, ...]  # tensors replaced by _Ref
    kwargs: dict[str, Any]
    inputs: list[int]  # node ids of its tensor arguments, in order
    outputs: list[int]  # node ids of the tensors it returned, in order
    module: str  # the innermost module of the block running when it was called

    @property
    def name(self) -> str:
        """The operator's name without namespace and overload: ``mm``, ``_softmax``."""
        return str(self.func._opname)

    @property
    def base(self) -> str:
        """The name without an in-place operator's trailing underscore: ``mul`` for ``mul_``."""
        return (
            self.name[:-1]
            if self.name.endswith("_") and not self.name.endswith("__")
            else self.name
        )

    def scalars(self) -> list[float]:
        """The plain numbers among its arguments."""
        flat, _ = tree_flatten((self.args, self.kwargs))
        return [float(a) for a in flat if isinstance(a, (int, float)) and not isinstance(a, bool)]


@dataclass
class Trace:
    """A recorded forward pass: its operators, nodes, and the nodes' consumers."""

    ops: list[Op]
    nodes: list[Node]
    input: int  # the node of the block's input
    output: int  # the node of the block's output
    calls: list[tuple[str, int, int, list[int], list[int]]] = field(default_factory=list)
    """Module calls: (name, first op, end op (exclusive), input nodes, output nodes)."""
    grad: bool = True  # whether it ran with grad mode on (off only for a block that fails so)

    def consumers(self, node: int) -> list[Op]:
        """The operators that read ``node``, in order."""
        return [op for op in self.ops if node in op.inputs]

    def producer(self, node: int) -> Op | None:
        index = self.nodes[node].op
        return self.ops[index] if index >= 0 else None

    def ancestors(self, node: int) -> set[int]:
        """Every node ``node`` was computed from, itself included."""
        seen, todo = {node}, [node]
        while todo:
            op = self.producer(todo.pop())
            for n in op.inputs if op else ():
                if n not in seen:
                    seen.add(n)
                    todo.append(n)
        return seen


class _Mode(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """A dispatch mode that leaves ``__torch_dispatch__`` as it is.

    By default PyTorch wraps it in ``torch._dynamo``'s ``disable`` so that ``torch.compile``
    skips it, which imports ``torch._dynamo`` on the first call: 5 s on a busy 2-core machine,
    most of a check. Nothing here is compiled, so the wrapper (the documented switch below) is
    left off.
    """

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False


class _Recorder(_Mode):
    def __init__(self, known: Mapping[int, tuple[Tensor, str]], x: Tensor) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.ops: list[Op] = []
        self.nodes: list[Node] = []
        self.latest: dict[int, tuple[Tensor, int]] = {}  # id(tensor) -> (tensor, node)
        self.stamp: dict[int, tuple[object, ...]] = {}  # id(tensor) -> what it held then
        self.known = known
        self.stack: list[str] = [""]
        self.input = self.node_of(x, INPUT, data=True)

    def new(self, t: Tensor, op: int, data: bool, name: str = "") -> int:
        self.nodes.append(Node(len(self.nodes), op, t.detach().clone(), data, name))
        self.latest[id(t)] = (t, len(self.nodes) - 1)
        self.stamp[id(t)] = _stamp(t)
        return len(self.nodes) - 1

    def node_of(self, t: Tensor, op: int = LEAF, data: bool = False) -> int:
        hit = self.latest.get(id(t))
        if hit is not None and hit[0] is t and self.stamp[id(t)] == _stamp(t):
            return hit[1]  # (a module's .to() swaps a parameter's data: then it is new)
        known = self.known.get(id(t))
        return self.new(t, op, data, known[1] if known else "")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        inputs: list[int] = []

        def ref(a: object) -> object:
            if isinstance(a, Tensor):
                inputs.append(self.node_of(a))
                return _Ref(inputs[-1])
            return a

        rargs, rkwargs = tree_map(ref, (args, kwargs))
        out = func(*args, **kwargs)
        index = len(self.ops)
        data = any(self.nodes[n].data for n in inputs)
        outputs = [self.new(t, index, data) for t in tree_flatten(out)[0] if isinstance(t, Tensor)]
        self.ops.append(Op(index, func, rargs, rkwargs, inputs, outputs, self.stack[-1]))
        return out


def _stamp(t: Tensor) -> tuple[object, ...]:
    try:
        return (t.dtype, tuple(t.shape), t.data_ptr())  # (not _version: bumped after us)
    except RuntimeError:  # a tensor without storage
        return (t.dtype, tuple(t.shape))


def _hooks(module: nn.Module, rec: _Recorder, calls: list[Any]) -> list[Any]:
    handles = []
    for name, m in module.named_modules():
        if not name:
            continue

        def pre(m: nn.Module, args: Any, name: str = name) -> None:
            rec.stack.append(name)
            ins = [
                rec.latest[id(a)][1] for a in args if isinstance(a, Tensor) and id(a) in rec.latest
            ]
            calls.append([name, len(rec.ops), -1, ins, []])

        def post(m: nn.Module, args: Any, out: Any, name: str = name) -> None:
            rec.stack.pop()
            call = next(c for c in reversed(calls) if c[0] == name and c[2] == -1)
            call[2] = len(rec.ops)
            flat = [t for t in tree_flatten(out)[0] if isinstance(t, Tensor)]
            call[4] = [rec.latest[id(t)][1] for t in flat if id(t) in rec.latest]

        handles.append(m.register_forward_pre_hook(pre))
        handles.append(m.register_forward_hook(post))
    return handles


def _known(module: nn.Module) -> dict[int, tuple[Tensor, str]]:
    named = [*module.named_parameters(), *module.named_buffers()]
    return {id(t): (t, name) for name, t in named}


def _call(module: nn.Module, x: Tensor, grad: bool) -> object:
    with torch.random.fork_rng(devices=[]), torch.set_grad_enabled(grad):
        torch.manual_seed(0)
        return module(x)


def record(module: nn.Module, x: Tensor) -> Trace:
    """Run ``module(x)`` once and record every operator.

    Raises:
        TraceError: the block raised, or returned no tensor.

    Example:
        >>> import torch.nn as nn
        >>> trace = record(nn.Linear(4, 4).double(), torch.zeros(2, 3, 4, dtype=torch.float64))
        >>> [op.name for op in trace.ops]
        ['view', 't', 'addmm', 'view']
    """
    failure: BaseException | None = None
    for grad in (True, False):  # without grad for a block that fails with it (an in-place view)
        rec = _Recorder(_known(module), x)
        calls: list[Any] = []
        handles = _hooks(module, rec, calls)
        try:
            with rec:
                out = _call(module, x, grad)
        except CAUGHT as e:  # the block's own error ends the trace, not the check
            failure = failure or e
            continue
        finally:
            for h in handles:
                h.remove()
        if not isinstance(out, Tensor) or id(out) not in rec.latest:
            raise TraceError("the block returned no tensor made in its forward pass")
        output = rec.latest[id(out)][1]
        return Trace(rec.ops, rec.nodes, rec.input, output, [tuple(c) for c in calls], grad)
    raise TraceError(f"the block raised {type(failure).__name__} while traced") from failure


class _Patcher(_Mode):
    """Replaces the values of some nodes and copies the values of others, op by op.

    Operators are matched with the recorded ones by their order among those that read the input
    (data): a block may build its constants differently on a second call (a cached mask)."""

    def __init__(
        self, trace: Trace, put: Mapping[int, Tensor], get: Sequence[int], x: Tensor
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.trace, self.put, self.get = trace, put, set(get)
        self.data_ops = [op for op in trace.ops if any(trace.nodes[n].data for n in op.inputs)]
        self.index = 0
        self.got: dict[int, Tensor] = {}
        self.data: dict[int, Tensor] = {id(x): x}  # id -> tensor (kept alive): the data tensors

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        flat_in = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, Tensor)]
        if not any(self.data.get(id(a)) is a for a in flat_in):
            return out  # a constant or a weight: not matched
        if self.index >= len(self.data_ops) or self.data_ops[self.index].func != func:
            raise TraceError("the block ran other operators the second time (data-dependent code)")
        op = self.data_ops[self.index]
        self.index += 1
        flat, spec = tree_flatten(out)
        tensors = [i for i, t in enumerate(flat) if isinstance(t, Tensor)]
        for i, node in zip(tensors, op.outputs, strict=True):
            if node in self.put:
                new = self.put[node]
                if any(flat[i] is a for a in flat_in):
                    flat[i].copy_(new)  # an in-place operator: its output is its input
                elif 0 in flat[i].stride():  # an expanded view: a fresh contiguous value
                    flat[i] = new.clone()
                else:  # the same strides, so that the block's .view() calls still work
                    flat[i] = torch.empty_strided(
                        new.shape, flat[i].stride(), dtype=new.dtype, device=new.device
                    ).copy_(new)
            if node in self.get:
                self.got[node] = flat[i].detach().clone()
            self.data[id(flat[i])] = flat[i]
        return spec.unflatten(flat) if any(n in self.put for n in op.outputs) else out


def rerun(
    module: nn.Module, trace: Trace, put: Mapping[int, Tensor], get: Sequence[int]
) -> dict[int, Tensor]:
    """Run the block again on the traced input with the nodes in ``put`` replaced by those
    values (each of the node's shape); the values of the nodes in ``get``.

    Raises:
        TraceError: the block ran other operators than recorded, or raised.
    """
    x = put.get(trace.input, trace.nodes[trace.input].value).clone()
    patcher = _Patcher(trace, put, get, x)
    try:
        with patcher:
            _call(module, x, trace.grad)
    except TraceError:
        raise
    except CAUGHT as e:
        raise TraceError(f"the block raised {type(e).__name__} when re-run") from e
    got = dict(patcher.got)
    if trace.input in get:
        got[trace.input] = x
    missing = [n for n in get if n not in got]
    if missing:
        raise TraceError(f"the re-run did not reach nodes {missing}")
    return got


def replay(trace: Trace, source: int, target: int) -> Callable[[Tensor], Tensor]:
    """The operators that compute ``target`` from ``source`` (and static values), as a function
    of a tensor of ``source``'s shape.

    Raises:
        TraceError: ``target`` also depends on input data that does not come from ``source``.
    """
    between = trace.ancestors(target)
    start = trace.nodes[source].op  # nothing made before the source can depend on it
    ops = sorted({trace.nodes[n].op for n in between if trace.nodes[n].op > start})
    inside: set[int] = {source}
    chosen = []
    for index in ops:
        op = trace.ops[index]
        if not any(n in inside for n in op.inputs):
            if any(trace.nodes[n].data for n in op.inputs):
                raise TraceError("the part reads input data from elsewhere")
            continue  # a static value: recorded
        chosen.append(op)
        inside.update(op.outputs)
    if target not in inside:
        raise TraceError("the target does not depend on the source")

    def run(h: Tensor) -> Tensor:
        env = {source: h}

        def value(a: object) -> object:
            if isinstance(a, _Ref):
                return env.get(a.node, trace.nodes[a.node].value)
            return a

        for op in chosen:
            args, kwargs = tree_map(value, (op.args, op.kwargs))
            out = op.func(*args, **kwargs)
            tensors = [t for t in tree_flatten(out)[0] if isinstance(t, Tensor)]
            env.update(zip(op.outputs, tensors, strict=True))
        return env[target]

    return run


class NoDropout(_Mode):
    """Every dropout an identity, however the code calls it: ``bernoulli_(p)``, the keep-mask
    dropout draws and then divides by ``p``, fills with ``p`` (so the mask is exactly 1), and
    ``native_dropout`` returns its input. For a block that keeps dropout on in eval mode through
    a probability the checker cannot reach (a module-level ``F.dropout(x, p)``)."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = func._opname
        if name == "bernoulli_" and len(args) > 1 and isinstance(args[1], float):
            return args[0].fill_(args[1])
        if name == "bernoulli" and len(args) > 1 and isinstance(args[1], float):
            return torch.full_like(args[0], args[1])
        if name == "native_dropout":
            return args[0].clone(), torch.ones_like(args[0], dtype=torch.bool)
        return func(*args, **(kwargs or {}))
