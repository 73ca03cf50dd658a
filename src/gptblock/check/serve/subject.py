"""The checker's own copy of a block (``Subject``), and the one way every check calls it: input
and output copied (a block may change its input in place), every call but the determinism
probe's re-seeded (dropout left on in eval gets one mask). docs/checker.md, "On a copy"."""

from __future__ import annotations

import contextlib
import copy
import types
import warnings
from collections.abc import Mapping
from contextlib import AbstractContextManager as ContextManager
from contextlib import nullcontext
from dataclasses import dataclass, fields, is_dataclass, replace
from typing import Any, Protocol

import torch
import torch.nn as nn

from . import loop
from .loop import CAUGHT, NoDropout, UserValueError, default_dtype, fixed_seed, one_line, setting

__all__ = ["Grads", "Probed", "Subject", "cut_graphs", "first_tensor", "items_of", "one_thread"]

Tensor = torch.Tensor


@dataclass(frozen=True)
class Grads:
    """Each trainable parameter's gradient (None: unreached), or the in-place change that
    stopped the backward pass (``failed``: ``"forward"`` or ``"backward"``, and why)."""

    names: list[str]
    grads: list[Tensor | None]
    failed: str = ""
    message: str = ""
    input: Tensor | None = None  # the input's gradient, when asked for
    kept: str = ""  # the block's tensors whose graph a second call's backward pass ran through


def one_thread() -> ContextManager[None]:
    """One intra-op thread inside: on tiny tensors extra threads only add synchronisation."""
    return setting(torch.get_num_threads, torch.set_num_threads, 1)


class Probed(Protocol):
    """What the probes ask: a ``Subject``, or a ``worker.Remote`` (whose answers are claims)."""

    C: int
    T: int
    longest: int  # its block_size, or 0
    dtype: torch.dtype
    device: torch.device
    generator: torch.Generator
    tol: float  # "did not move", times the output's scale: round-off in ``dtype``

    def __call__(self, x: Tensor, *, seeded: bool = True, train: bool = False) -> Tensor: ...
    def own_rng(self) -> ContextManager[None]: ...
    def grads(self, x: Tensor, weights: Tensor, *, inputs: bool = False) -> Grads: ...

    def input(self, *shape: int, scale: float = 1.0) -> Tensor:
        """Standard normal values of ``shape`` times ``scale``, from the checker's own seed."""
        x = torch.randn(*shape, generator=self.generator, dtype=torch.float64) * scale
        return x.to(device=self.device, dtype=self.dtype)

    def moved(self, y: Tensor, y2: Tensor) -> Tensor:
        """Where ``y2`` differs from ``y`` by more than round-off (NaN == NaN counts as equal)."""
        scale = 1.0 + float(y.abs().nan_to_num(0.0, 0.0, 0.0).max())
        return ~((y == y2) | (y.isnan() & y2.isnan()) | ((y - y2).abs() <= self.tol * scale))


class Subject(Probed):
    """An eval-mode copy of the user's block (never changed) in float64, else float32."""

    def __init__(self, module: nn.Module, C: int, T: int, longest: int = 0) -> None:
        self.C, self.T, self.longest = C, T, longest
        self.float32: nn.Module | None = None  # of a float64 copy: for float32 inputs
        self.bfloat16: nn.Module | None = None  # and bfloat16 inputs (``probes.elsewhere``)
        self.device = next((p.device for p in module.parameters()), torch.device("cpu"))
        if self.device.type == "meta":
            raise UserValueError(
                f"{type(module).__name__}'s parameters are on the meta device (shapes without "
                "values): build it on a real device to check it"
            )
        self.generator = torch.Generator().manual_seed(0)
        self.note = ""
        self.no_dropout = False  # every call with dropout switched off (loop.NoDropout)
        self.failure: BaseException | None = None  # the first call's, in both dtypes
        self.unpacked = ""  # how the output is taken from a tuple the block returns
        self._key: Any = None  # and which item of it
        self.aside: set[str] = set()  # parameters only its other items reach: not checked
        failure: BaseException | None = None
        called: list[str] = []  # the original's modules a copy calls (none, for a true copy)
        for dtype in (torch.float64, torch.float32):
            self.dtype, self.module = dtype, _copy(module, dtype)  # (copied without the hooks)
            hooks = [
                m.register_forward_pre_hook(lambda *_, n=name: called.append(n or "root"))
                for name, m in module.named_modules()
                if not isinstance(m, loop.SCRIPTED)
            ]
            try:
                self(self.input(T, T, C))
                break
            except CAUGHT as e:
                failure = failure or e
            finally:
                for h in hooks:
                    h.remove()
                if called:
                    raise UserValueError(
                        f"the checker's copy of {type(module).__name__} still calls the "
                        f"original's {', '.join(called[:3])}: keep the modules a "
                        "function uses reachable as attributes, not only in its closure"
                    )
        else:
            self.dtype, self.module = torch.float64, _copy(module, torch.float64)
            self.failure = failure
        self.fell_back = "" if self.dtype == torch.float64 else one_line(failure)  # float64's
        if self.dtype != torch.float64:
            self.note = f"the block fails in float64 ({self.fell_back}); checked in float32"
        else:  # made now, from the user's block: a copy that ran may hold tensors with a graph
            self.float32 = _copy(module, torch.float32)
            with contextlib.suppress(UserValueError):  # (then bfloat16 is not probed)
                self.bfloat16 = _copy(module, torch.bfloat16)
            for other in (self.float32, self.bfloat16):
                if self.unpacked and other is not None:
                    _take(other, self._key)
        if self.unpacked:
            self.note = "; ".join(n for n in (self.note, self.unpacked) if n)
        self.tol = 1e-10 if self.dtype == torch.float64 else 1e-5

    def __call__(
        self, x: Tensor, *, seeded: bool = True, train: bool = False, grad: bool = False
    ) -> Tensor:
        """``train``: in train mode with every dropout an identity."""
        module = self.module_in(x.dtype)
        off = NoDropout() if self.no_dropout or train else nullcontext()
        seed = fixed_seed(self.device) if seeded else nullcontext()
        if train:  # (only then: ``train()`` may be the block's own)
            module.train()
        try:
            with off, seed, default_dtype(x.dtype), torch.set_grad_enabled(grad):
                y = module(x.clone())
        finally:
            if train:
                module.eval()
        if not isinstance(y, Tensor) and not self.unpacked:  # a tuple, list or dict: the
            found = first_tensor(y, tuple(x.shape))  # (B, T, C) tensor taken, from now on
            if found is not None and found[1]:
                self._key, self.aside = found[0], _aside(self.module, x, found[0])
                _take(self.module, self._key)
                self.unpacked = (f"the block returns a {type(y).__name__}: its {found[1]}, "
                                 "the (B, T, C) tensor, is taken as its output")  # fmt: skip
                if self.aside:
                    names = ", ".join(sorted(self.aside)[:4]) + ", ..." * (len(self.aside) > 4)
                    self.unpacked += f" ({names}: only its other items read them, not checked)"
                y = _item(y, self._key)
        if not isinstance(y, Tensor):
            what = type(y).__name__
            if isinstance(y, (tuple, list)) and y and isinstance(y[0], Tensor):
                what += f" (of {len(y)}, the first a tensor of shape {tuple(y[0].shape)})"
            raise TypeError(f"the block returned a {what}, expected a (B, T, C) tensor")
        return y.clone() if y.requires_grad else y.detach().clone()

    def module_in(self, dtype: torch.dtype) -> nn.Module:
        """``module``, or a float32 (bfloat16) copy of the user's block given its values as they
        are now."""
        if dtype == self.dtype:
            return self.module
        other = {torch.float32: self.float32, torch.bfloat16: self.bfloat16}.get(dtype)
        if other is None:
            raise TypeError(f"the block is checked in {self.dtype} only, not {dtype}")
        own = dict(self.module.named_parameters())
        with torch.no_grad():
            for name, p in other.named_parameters():
                p.copy_(own[name])
        return other

    def own_rng(self) -> ContextManager[None]:
        return torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else [])

    def grads(self, x: Tensor, weights: Tensor, *, inputs: bool = False) -> Grads:
        """The gradients of ``sum(y * weights)``; an in-place change autograd needed:
        ``failed``. A graph the call leaves in the block's tensors is cut, as a call under
        torch.no_grad leaves them; ``kept`` names them where a second call's backward pass runs
        through it (a KV cache written in place)."""
        module = self.module_in(x.dtype)
        cut_graphs(module)  # what an earlier call left (the trace's)
        got = self._grads(x, weights, inputs)
        if not got.failed and (held := cut_graphs(module, keep=True)):  # a second call
            again = self._grads(x[:1], weights[:1], inputs)  # (one sequence is enough)
            if again.failed and "a second time" in again.message:
                got = replace(got, kept=", ".join(held[:3]) + ", ..." * (len(held) > 3))
        cut_graphs(module)
        return got

    def _grads(self, x: Tensor, weights: Tensor, inputs: bool) -> Grads:
        own = self.module_in(x.dtype).named_parameters()
        params = [(n, p) for n, p in own if p.requires_grad and n not in self.aside]
        names = [n for n, _ in params]
        if not params and not inputs:
            return Grads([], [])  # (nothing to train: an input changed in place harms nothing)
        # the input needs its gradient, as an embedding's output does: a saved input changed in
        # place (``x += attn(ln(x))`` behind a norm that saves only what it computes) fails then
        x, stage = x.detach().requires_grad_(True), "forward"
        try:  # (in the forward pass: a view autograd needs, changed in place: only with grad)
            with torch.enable_grad():
                y = self(x, grad=True)
                loss = (torch.where(torch.isfinite(y), y, 0.0) * weights).sum()
                if not loss.requires_grad:  # the output depends on no parameter nor input
                    return Grads(names, [None] * len(params))
                stage, wrt = "backward", [p for _, p in params] + [x]
                grads: list[Tensor | None] = list(torch.autograd.grad(loss, wrt, allow_unused=True))
        except RuntimeError as e:  # or a graph kept from the last call (a cache's buffer)
            said = str(e).replace("in-place", "inplace").replace(" in place", " inplace")
            if "inplace" not in said and "a second time" not in said:
                raise
            return Grads(names, [], stage, one_line(e))
        return Grads(names, grads[: len(params)], input=grads[-1] if inputs else None)


def cut_graphs(module: nn.Module, *, keep: bool = False) -> list[str]:
    """The names of the tensors ``module`` holds (buffers, plain attributes) that carry an
    autograd graph (a KV cache written in place with grad on), each detached unless ``keep``."""
    names = []
    for prefix, m in module.named_modules():
        for held in (m._buffers, vars(m)):
            for name, t in list(held.items()):
                if isinstance(t, Tensor) and t.grad_fn is not None:
                    if not keep:
                        held[name] = t.detach()
                    names.append(f"{prefix}.{name}".lstrip("."))
    return names


def _copy(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    """``copy.deepcopy`` keeps a function stored on a module by reference (minGPT's ``self.mlpf
    = lambda x: m.c_proj(...)``): such closures are rebuilt around the copies (``memo``)."""
    memo: dict[int, Any] = {}
    try:
        copied = copy.deepcopy(module, memo)
        for m in copied.modules():
            for name, f in list(vars(m).items()):
                if isinstance(f, types.FunctionType) and f.__closure__:
                    cells = tuple(_cell(c, memo) for c in f.__closure__)
                    g = types.FunctionType(
                        f.__code__, f.__globals__, f.__name__, f.__defaults__, cells
                    )
                    g.__kwdefaults__ = f.__kwdefaults__
                    setattr(m, name, g)
        # .to(float64) would cast a complex buffer (Meta Llama's freqs_cis) to real, dropping its
        # imaginary part: such buffers become the complex dtype of the checker's precision.
        complex_buffers = [(m, n, b) for m in copied.modules() for n, b in m._buffers.items()
                           if b is not None and b.is_complex()]  # fmt: skip
        with warnings.catch_warnings():  # "casting complex values to real": put right below
            warnings.simplefilter("ignore", UserWarning)
            copied = copied.to(dtype).eval()
        wide = torch.complex128 if dtype == torch.float64 else torch.complex64
        for m, n, b in complex_buffers:
            m._buffers[n] = b.to(wide)
        return copied
    except CAUGHT as e:
        raise UserValueError(
            f"cannot copy {type(module).__name__} to check it (copy.deepcopy, .to({dtype})): "
            f"{one_line(e)}"
        ) from e


def _cell(cell: types.CellType, memo: dict[int, Any]) -> types.CellType:  # of the copy's values
    try:
        value = cell.cell_contents
    except ValueError:  # an empty cell
        return cell
    return types.CellType(memo.get(id(value), value))


def first_tensor(y: object, shape: tuple[int, ...]) -> tuple[Any, str] | None:
    """The key of the first ``shape`` tensor in a tuple, list or dict, and that key in words."""
    if isinstance(y, Tensor):
        return None, ""
    for key, value in items_of(y):
        if isinstance(value, Tensor) and tuple(value.shape) == tuple(shape):
            return key, f"{key!r}" if isinstance(key, str) else f"element {key}"
    return None


def items_of(y: object) -> list[tuple[Any, Any]]:  # of a tuple, list, dict or dataclass (s103)
    if is_dataclass(y) and not isinstance(y, type):
        return [(f.name, getattr(y, f.name)) for f in fields(y)]
    if isinstance(y, Mapping):
        return list(y.items())
    return list(enumerate(y)) if isinstance(y, (tuple, list)) else []


def _item(y: Any, key: Any) -> Any:
    return getattr(y, key) if is_dataclass(y) else y[key]


def _aside(module: nn.Module, x: Tensor, key: Any) -> set[str]:
    """The parameters that only the items besides ``key`` of what ``module`` returns reach (an
    auxiliary head's: a halting probability, a router's loss), by their gradients."""
    params = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    try:
        with torch.enable_grad():
            out = module(x.clone())
            items = items_of(out)
            mine, others = (_reached([v for k, v in items if (k == key) == m], params) for m in (True, False))  # fmt: skip
    except CAUGHT:  # then every parameter is checked, as the output's
        return set()
    return others - mine


def _reached(ys: list[Any], params: list[tuple[str, nn.Parameter]]) -> set[str]:
    ys = [y for y in ys if isinstance(y, Tensor) and y.requires_grad and y.is_floating_point()]
    if not ys or not params:
        return set()
    loss = torch.stack([torch.where(torch.isfinite(y), y, 0.0).sum().double() for y in ys]).sum()
    found = torch.autograd.grad(loss, [p for _, p in params], allow_unused=True, retain_graph=True)
    return {n for (n, _), g in zip(params, found, strict=True) if g is not None}


def _take(module: nn.Module, key: Any) -> None:  # its forward returns the ``key`` item
    forward = type(module).forward
    module.forward = types.MethodType(lambda m, *a, **k: _item(forward(m, *a, **k), key), module)
