"""One forward pass recorded operator by operator (``record``, read back by ``from_plain`` with
torch's own operators only), re-run with nodes replaced (``rerun``) or as a function
(``replay``). docs/checker.md, "The roles, from the dataflow".
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch
import torch.nn as nn
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..mistakes.report import CAUGHT
from ..serve import loop
from ..serve.loop import LEAF, NoDropout

__all__ = ["LEAF", "Op", "Trace", "TraceError", "from_plain", "record", "replay", "rerun"]

Tensor = torch.Tensor
_RNG = threading.Lock()  # the seeded RNG is the process's: one replay at a time (grade's threads)


class TraceError(Exception):
    """The forward pass cannot be recorded or re-run as recorded; the message says why."""


@dataclass(frozen=True)
class Ref:  # a node in an operator's recorded arguments
    node: int
    opaque: str = ""  # an argument recorded without its value (a generator): not re-executable


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
VIEWS = frozenset([  # operators whose output shares its input's memory: an in-place write shows
    "view", "_unsafe_view", "alias", "slice", "select", "narrow", "transpose", "t", "permute",
    "unsqueeze", "squeeze", "expand", "as_strided", "diagonal", "unfold", "detach", "view_as_real",
    "view_as_complex", "split", "unbind",
])  # fmt: skip


def _operator(name: object) -> Any:
    """torch's own ``namespace::name.overload``, never anything the block defined."""
    ns, _, rest = str(name).partition("::")
    op, _, overload = rest.rpartition(".")
    named = isinstance(name, str) and all(_NAME.fullmatch(n) for n in (ns, op, overload))
    try:
        func = getattr(getattr(getattr(torch.ops, ns), op), overload) if named else None
    except (AttributeError, RuntimeError):
        raise TraceError(f"an operator the checker does not have: {str(name)[:80]}") from None
    _need(isinstance(func, torch._ops.OpOverload), f"an operator named {str(name)[:80]!r}")
    return func


def _node(nodes: int, a: dict[str, Any]) -> object:  # ``loop.decode``'s forms of a trace's own
    ref = a.get("r")
    if len(a) == 1 and isinstance(ref, int) and 0 <= ref < nodes:
        return Ref(ref)
    _need(len(a) == 1 and "opaque" in a, "an operator's argument of no known form")
    return Ref(-1, str(a["opaque"])[:40])


def _ints(value: object) -> list[int]:
    ints = isinstance(value, list) and all(type(n) is int for n in value)
    _need(ints, "a list of nodes that is not one")
    return cast(list[int], value)


@dataclass
class Node:
    op: int  # the operator that made it, or ``INPUT``, ``LEAF``
    value: Tensor  # a detached copy, as it was made
    data: bool  # whether it depends on the block's input (else static: weights, constants)
    name: str = ""  # a parameter's or buffer's name in the block

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape)


@dataclass
class Op:
    index: int
    func: Any  # torch._ops.OpOverload
    args: tuple[Any, ...]  # tensors replaced by Ref
    kwargs: dict[str, Any]
    inputs: list[int]  # node ids of its tensor arguments, in order
    outputs: list[int]  # node ids of the tensors it returned, in order

    @property
    def name(self) -> str:  # without namespace and overload: ``mm``, ``_softmax``
        return str(self.func._opname)

    @property
    def base(self) -> str:  # ``mul`` for the in-place ``mul_``
        name = self.name
        return name[:-1] if name.endswith("_") and not name.endswith("__") else name

    @functools.cached_property
    def _flat(self) -> tuple[list[Any], Any]:  # flattened once: a search reruns it 1000s of times
        return tree_flatten((self.args, self.kwargs))

    def scalars(self) -> list[float]:
        flat = self._flat[0]
        return [float(a) for a in flat if isinstance(a, (int, float)) and not isinstance(a, bool)]

    def call(self, value: Callable[[object], object]) -> tuple[list[Tensor], list[Tensor]]:
        leaves = [value(a) for a in self._flat[0]]
        args, kwargs = tree_unflatten(leaves, self._flat[1])
        out = self.func(*args, **kwargs)
        made = [out] if isinstance(out, Tensor) else tree_flatten(out)[0]
        tensors = [a for a in leaves if isinstance(a, Tensor)]
        return [t for t in made if isinstance(t, Tensor)], tensors


@dataclass
class Trace:
    ops: list[Op]
    nodes: list[Node]
    input: int  # the node of the block's input
    output: int  # the node of the block's output
    # module calls: (name, first op, end op (exclusive), input nodes, output nodes)
    calls: list[tuple[str, int, int, list[int], list[int]]] = field(default_factory=list)
    parameters: dict[str, tuple[int, ...]] = field(default_factory=dict)  # shapes, read or not
    modules: list[str] = field(default_factory=list)  # the block's modules' names ("": itself)

    def consumers(self, node: int) -> list[Op]:
        return [op for op in self.ops if node in op.inputs]

    def producer(self, node: int) -> Op | None:
        """The operator that made ``node``; of a tensor made without input data that input data
        was then written into once (a KV cache's buffer), that write."""
        if node in self.written:
            writes = self.written[node]
            return writes[0] if len(writes) == 1 else None
        index = self.nodes[node].op
        return self.ops[index] if index >= 0 else None

    @functools.cached_property
    def written(self) -> dict[int, list[Op]]:
        """The tensors made without input data that input data was written into through a view
        (``serve.loop`` marks them data), with those writes."""
        found: dict[int, list[Op]] = {}
        for op in self._writes:
            path = [op.inputs[0]]  # to the base through its views; the farthest marked data
            while (i := self.nodes[path[-1]].op) >= 0 and self.ops[i].name in VIEWS:
                path.append(self.ops[i].inputs[0])  # (zeros().detach(): the detached one)
            at = next((n for n in reversed(path) if self.nodes[n].data), path[-1])
            i = self.nodes[at].op
            static = i < 0 or not any(self.nodes[n].data for n in self.ops[i].inputs)
            if at != op.inputs[0] and self.nodes[at].data and static:
                found.setdefault(at, []).append(op)
        return found

    def between(self, source: int, target: int) -> list[Op]:
        start = self.nodes[source].op  # nothing made before the source can depend on it
        made = {self.nodes[n].op for n in self.ancestors(target)}
        return [self.ops[i] for i in sorted(made) if i > start]

    def ancestors(self, node: int) -> set[int]:
        """The nodes ``node`` is made from, with the writes into their views before they are read
        (``out = empty_like(x); out[..., 0::2] = ...``) and what those read."""
        seen, written = self._behind({node}), True
        while written:
            written = False
            for op in self._writes:
                at = op.inputs[0]  # the tensor written, through its views to their base
                while at not in seen and (view := self.producer(at)) and view.name in VIEWS:
                    at = view.inputs[0]
                fresh = at in seen and at != op.inputs[0] and op.outputs[0] not in seen
                # read (other than through a view) after it was written through one
                reads = (o.index for o in self.consumers(at) if o.name not in VIEWS)
                if fresh and op.index < min(reads, default=len(self.ops)):
                    seen |= self._behind({*op.inputs, *op.outputs})
                    written = True
        return seen

    @functools.cached_property
    def _writes(self) -> list[Op]:  # the in-place operators (most blocks have none)
        return [op for op in self.ops if op.name != op.base and op.inputs and op.outputs]

    def _behind(self, nodes: set[int]) -> set[int]:
        seen, todo = set(nodes), list(nodes)
        while todo:
            op = self.producer(todo.pop())
            for n in op.inputs if op else ():
                if n not in seen:
                    seen.add(n)
                    todo.append(n)
        return seen


def _need(ok: object, what: str) -> None:
    if not ok:
        raise TraceError(what)


def from_plain(
    meta: dict[str, Any], tensors: Mapping[str, Tensor], device: torch.device | None = None
) -> Trace:
    _need("error" not in meta, f"the block raised {str(meta.get('error'))[:400]} while traced")
    try:
        complex_nodes = set(_ints(meta.get("complex", [])))
        nodes: list[Node] = []
        for i, row in enumerate(meta["nodes"]):
            ok = isinstance(row, list) and len(row) == 3 and type(row[0]) is int
            _need(ok, "a node that is not one")
            value = tensors.get(f"n{i}")
            if not isinstance(value, Tensor):
                raise TraceError(f"node {i} without its value")
            value = torch.view_as_complex(value.contiguous()) if i in complex_nodes else value
            value = value.to(device) if device is not None else value
            nodes.append(Node(row[0], value, row[1] is True, str(row[2])[:300]))
        n = len(nodes)
        ops: list[Op] = []
        for index, o in enumerate(meta["ops"]):
            args, kwargs = o["args"], o["kwargs"]
            ok = isinstance(args, list) and isinstance(kwargs, dict)
            _need(ok, "an operator's arguments that are not a list and a dict")
            inputs, outputs = _ints(o["inputs"]), _ints(o["outputs"])
            made = all(0 <= i < n and nodes[i].op == index for i in outputs)
            _need(made and all(0 <= i < n for i in inputs), "an operator's nodes that do not exist")
            args = loop.decode({"tuple": args}, functools.partial(_node, n), device)
            kwargs = loop.decode({"dict": kwargs}, functools.partial(_node, n), device)
            ops.append(Op(index, _operator(o["func"]), args, kwargs, inputs, outputs))
        _need(all(-2 <= node.op < len(ops) for node in nodes), "a node made by no operator")
        calls = []
        for name, first, end, ins, outs in meta["calls"]:
            if end == -1:
                continue  # a module whose call raised inside the block (which caught it)
            ok = type(first) is int and type(end) is int and 0 <= first <= end <= len(ops)
            _need(ok, "a module call that is not one")
            ok = all(0 <= i < n for i in _ints(ins) + _ints(outs))
            _need(ok, "a module call on nodes that do not exist")
            calls.append((str(name)[:300], first, end, ins, outs))
        x, y = meta["input"], meta["output"]
        _need(y is not None, "the block returned no tensor made in its forward pass")
        ok = type(x) is int and type(y) is int and 0 <= x < n and 0 <= y < n
        _need(ok, "an input or output node that does not exist")
        parameters = {str(k): tuple(_ints(v)) for k, v in dict(meta.get("parameters", {})).items()}
        modules = [str(m) for m in meta.get("modules", [])]
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise TraceError(f"a trace that is not one ({type(e).__name__})") from None
    return Trace(ops, nodes, x, y, calls, parameters, modules)


def record(module: nn.Module, x: Tensor, *, no_dropout: bool = False) -> Trace:
    """With ``no_dropout`` (or inside ``NoDropout``) dropout is recorded as the identity."""
    modes = _get_current_dispatch_mode_stack()
    no_dropout = no_dropout or any(isinstance(m, NoDropout) for m in modes)
    return from_plain(*loop.record(module, x, no_dropout=no_dropout))


def rerun(
    trace: Trace, put: Mapping[int, Tensor], get: Sequence[int], ops: Sequence[Op] | None = None
) -> dict[int, Tensor]:
    """The values of ``get``, replayed (``ops``: as far as needed) with ``put``'s nodes replaced."""
    wanted = set(get)
    if ops is None:
        ops = trace.ops[: max((trace.nodes[n].op for n in wanted), default=-1) + 1]
    env: dict[int, Tensor] = {}

    def value(a: object) -> object:
        if not isinstance(a, Ref):
            return a
        if a.opaque:
            raise TraceError(f"an operator that takes a {a.opaque} cannot be replayed")
        if a.node not in env:  # a leaf (or the input): a copy, which in-place operators may change
            given = put.get(a.node)
            env[a.node] = (given if given is not None else trace.nodes[a.node].value).clone()
        return env[a.node]

    got: dict[int, Tensor] = {}
    # the writes into a tensor given whole (``out[b, :, s] = y`` before ``proj(out)``): not run
    given = {w.index for base, ws in trace.written.items() if base in put for w in ws}
    try:
        x = trace.nodes[trace.input].value  # what the block made without a dtype: in x's, as traced
        dtype = loop.default_dtype(x.dtype if x.is_floating_point() else torch.float32)
        with _RNG, loop.fixed_seed(torch.device("cpu")), torch.no_grad(), dtype:  # CPU's restored
            for op in ops:  # each wanted node as read (not through a view), else as last
                for n in (
                    wanted.intersection(op.inputs) - got.keys() if op.name not in VIEWS else ()
                ):
                    got[n] = cast(Tensor, value(Ref(n))).detach().clone()
                if op.index in given:
                    env.update(dict.fromkeys(op.outputs, cast(Tensor, value(Ref(op.inputs[0])))))
                    continue
                made, flat_in = op.call(value)
                _need(len(made) == len(op.outputs), f"{op.name} made other tensors when replayed")
                for t, node in zip(made, op.outputs, strict=True):
                    env[node] = _put(t, put[node], flat_in) if node in put else t
    except TraceError:
        raise
    except CAUGHT as e:
        raise TraceError(f"the replay raised {type(e).__name__}: {e}"[:300]) from e
    last = {n: got[n] if n in got else cast(Tensor, value(Ref(n))).detach().clone() for n in wanted}
    # a node given is what was given, not what an in-place operator made of it later through a
    # view (the heads' output, no projection, then ``y += x``: s87)
    return {**last, **{n: put[n].detach().clone() for n in wanted if n in put}}


def _put(made: Tensor, new: Tensor, inputs: list[Tensor]) -> Tensor:  # as ``made`` was made
    if any(made is a for a in inputs):
        return made.copy_(new)
    if 0 in made.stride():  # an expanded view: a fresh contiguous value
        return new.clone()
    strided = torch.empty_strided(new.shape, made.stride(), dtype=new.dtype, device=new.device)
    return strided.copy_(new)


def replay(trace: Trace, source: int, target: int) -> Callable[[Tensor], Tensor]:
    """A TraceError where ``target`` also reads input data not from ``source``."""
    # a tensor input data was written into (a KV cache's buffer) is replayed from its value
    # before: the write is replayed into it
    inside = {source, *trace.written}
    chosen: list[Op] = []
    for op in trace.between(source, target):
        if any(n in inside for n in op.inputs):
            chosen.append(op)
            inside.update(op.outputs)
        elif any(trace.nodes[n].data for n in op.inputs):
            raise TraceError("the part reads input data from elsewhere")
    if target not in inside:
        raise TraceError("the target does not depend on the source")
    return lambda h: rerun(trace, {source: h}, [target], chosen)[target]
