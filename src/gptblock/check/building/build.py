"""Building the block to check (``build_at``) at the file's sizes or others, and telling its
width C (``width``) and longest sequence (``max_length``)."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from typing import Any, cast

import torch
import torch.nn as nn

from ...errors import UserError, UserTypeError, UserValueError
from ..mistakes.report import CAUGHT, one_line
from ..serve.calls import forward_arguments, learner_line, size_error
from ..serve.loop import fixed_seed, signature
from ..serve.subject import first_tensor
from .arguments import COMMON_ARGUMENTS, arg_line, complete, fill_common_arguments, fit_arguments
from .configs import config_fields, number, parameters
from .sizes import KINDS, file_sizes, kind_of, names, patch_globals, plan, settings, size_sets

__all__ = ["Built", "build_at", "check_sizes", "max_length", "width"]

LARGEST = 8192  # widths and lengths the checker builds: its mistakes show at any size (32 here)


@dataclasses.dataclass
class Built:
    """A block built at one set of sizes."""

    module: nn.Module
    description: str  # what the report calls it, ``Block(n_embd=64, n_head=4)``
    label: str = ""  # its sizes, ``n_embd=64, n_head=4, block_size=32`` (module settings too)
    notes: list[str] = dataclasses.field(default_factory=list)  # the sizes' origins
    undo: Callable[[], None] = lambda: None  # restores the module settings changed to build it
    settings: dict[str, object] = dataclasses.field(default_factory=dict)  # those, as set
    args: dict[str, object] = dataclasses.field(default_factory=dict)
    width: int | None = None  # the width it was built at, when the checker chose it


def build_at(target: object, kwargs: Mapping[str, object], other: bool = False) -> Built | None:
    """The block built at the file's sizes, or with ``other`` at another set (``sizes.plan``;
    None when there is none); the module's settings stay changed until ``undo``."""
    if isinstance(target, nn.Module):
        if kwargs:
            raise UserTypeError(
                f"constructor arguments {sorted(kwargs)} given, but the target is already a "
                f"module ({type(target).__name__}); pass its class instead"
            )
        return None if other else Built(target, type(target).__name__)
    if not callable(target):
        raise UserTypeError(
            f"target must be an nn.Module or a class / factory building one, got {target!r}"
        )
    kwargs, fitted = fit_arguments(target, kwargs)  # d_model=32 given to a block's n_embd
    sizes, origins, chosen = file_sizes(target, kwargs)
    values = names(sizes)
    sized = [  # a size argument without a default, or with a number: None may mean "none"
        n for n, p in signature(target).items()
        if p.default is p.empty or isinstance(p.default, int) or n in COMMON_ARGUMENTS
    ]  # fmt: skip
    filled = fill_common_arguments(
        target, {**{n: values[n] for n in sized if n in values}, **kwargs}
    )
    file, numbers, _ = settings(target, kwargs)  # ``Block(num_embeddings)`` as its script calls it
    same = {p.name: numbers[p.name] for p in parameters(target)
            if p.default is p.empty and p.name not in filled and p.name in numbers}  # fmt: skip
    filled.update(same)
    said = ", ".join(f"{n}={v}" for n, v in same.items())
    origins += [f"built with {said} from {file}'s module settings of the same names"] * bool(same)
    check_sizes(filled, kwargs, {*names({k: 0 for k in chosen}), *same} - set(kwargs))
    args = complete(target, filled, kwargs, values)
    shown = {n: v for n, v in filled.items() if n in values}
    shown.update({n: values[n] for n in numbers if n in values})
    plain = (type(None), int, float, str, bool)
    config = next(
        (v for n, v in args.items() if n not in filled and not isinstance(v, plain)), None
    )
    shown.update({n: v for n in values if (v := getattr(config, n, None)) is not None})
    built = _made(target, args, values, lambda: _hint(target, kwargs))
    first = (next((n for n in k.names if n in shown), None) for k in KINDS.values())
    built.label = ", ".join(f"{n}={shown[n]!r}" for n in first if n is not None) or "its own sizes"
    built.notes, built.width = fitted + origins + built.notes, sizes.get("width")
    # a flag left at its default may choose the branch diagnosed (DETR's normalize_before=False)
    flags = [f"{n}={p.default}" for n, p in signature(target).items()
             if isinstance(p.default, bool) and n not in args]  # fmt: skip
    built.notes += [f"built with its flags' defaults: {', '.join(flags)}"] * bool(flags)
    built = _smaller(target, built, kwargs)
    if not other:
        return built
    try:  # read while the module settings are those of the build (a width made smaller)
        found = plan(target, built.args, width(built.module, kwargs))
    except CAUGHT as e:  # a config that cannot be copied or rejects the other values
        raise UserValueError(f"cannot set other sizes: {one_line(e)}") from e
    finally:
        built.undo()
    if found is None:
        return None  # nothing the checker sets: the same block again
    built = _made(target, found.args, found.settings)
    built.description = f"{getattr(target, '__qualname__', repr(target))} at {found.label}"
    built.label, built.notes, built.width = found.label, [], found.width  # measured again
    return built


def _smaller(target: Callable[..., Any], built: Built, kwargs: Mapping[str, object]) -> Built:
    """``built`` made smaller by value (``sizes.plan``) if over ``LARGEST_IMPLIED`` and not set
    by --arg; at the file's sizes where the smaller block does not take its width."""
    keep = {v for n, x in kwargs.items() if (v := number(x)) and kind_of(n) != "other"}
    large = sum(p.numel() for p in built.module.parameters()) > 1 << 20  # else its C by name
    try:  # (its forward is called here only if large: a block may break the checker's protocol)
        C = width(built.module, kwargs) if large else built.width
        if C is None or (found := plan(target, built.args, C, keep)) is None:
            return built
        small = _made(target, found.args, found.settings)
    except (*CAUGHT, UserError) as e:
        built.notes.append(f"checked at the file's sizes: made smaller, {one_line(e)}")
        return built
    if not _accepts(small.module, found.width, 2):
        small.undo()
        built.notes.append(f"checked at the file's sizes: at {found.label} it takes another width")
        return built
    undo = contextlib.ExitStack()  # the smaller block's module settings undone, then the file's
    undo.callback(built.undo)
    undo.callback(small.undo)
    small.undo = undo.close
    small.settings = {**built.settings, **small.settings}  # both, for the runner's build
    small.label, small.width = found.label, found.width
    small.notes = [*built.notes, f"made smaller for the check: {found.label} (--arg sets them)"]
    return small


def _shown(value: object) -> str:  # a config of the file's own plain class: its fields
    fields = config_fields(value) if type(value).__repr__ is object.__repr__ else None
    said = ", ".join(f"{k}={v!r}" for k, v in (fields or {}).items())
    return repr(value) if fields is None else f"{type(value).__name__}({said})"


def _made(
    target: Callable[..., Any], args: Mapping[str, object], sizes: Mapping[str, object],
    hint: Callable[[], str] = lambda: "",
) -> Built:  # fmt: skip
    """``target(**args)`` under seed 0 and the module settings ``sizes`` (notes: its forward's
    arguments); a failure says ``hint`` if the sizes are to blame."""
    name = getattr(target, "__qualname__", repr(target))
    description = f"{name}({', '.join(f'{k}={_shown(v)}' for k, v in args.items())})"
    set_, undo = patch_globals(target, sizes)
    try:
        with fixed_seed():
            try:
                module = target(**args)
            except CAUGHT as e:
                more = hint() if size_error(e) else ""
                at = learner_line(e, target)
                raise UserValueError(f"cannot build {description}: {one_line(e)}{at}{more}") from e
        if not isinstance(module, nn.Module):
            kind = type(module).__name__
            raise UserTypeError(f"{description} returned a {kind}, expected an nn.Module")
        return Built(module, description, "", forward_arguments(module), undo, set_, dict(args))
    except BaseException:
        undo()
        raise


def _hint(target: Callable[..., Any], given: Mapping[str, object]) -> str:
    for found in size_sets(file_sizes(target, given)[0], hints=True):
        values = names(found)
        line = {n: values[n] for n in signature(target) if n in values}
        if not line:
            return ""
        try:
            _made(target, fill_common_arguments(target, {**given, **line}), values).undo()
        except UserError:
            continue
        return f"; it builds with {arg_line(line)}"
    return ""


def check_sizes(
    args: Mapping[str, object], given: Mapping[str, object], file: Collection[str] = ()
) -> None:
    """Refuse sizes no block can be built with: not a whole number in 1..``LARGEST``, or a head
    count that does not divide the width or is not divided by the key/value head count, unless
    the ``file`` chose both (its block's own call tells what that does)."""

    def shown(name: str) -> str:
        if name in given:
            return f"--arg {name}={args[name]!r}"
        whose = "the file's" if name in file else "the checker's default"
        return f"{name}={args[name]!r} ({whose}; --arg {name}=N changes it)"

    sizes: dict[str, int] = {}
    for name in (n for k in KINDS.values() for n in k.names if n in args):
        size = number(value := args[name])
        if size is None or size > LARGEST:
            literal = isinstance(value, str) and any(c in value for c in "*+-/")  # 10**6
            hint = " (VALUE is read as a Python literal: write 1000000, not 10**6)" * literal
            raise UserValueError(
                f"{shown(name)}: expected a whole number from 1 to {LARGEST}{hint}; the "
                "checker's mistakes show at any size (32 channels, 4 heads are plenty)"
            )
        sizes[name] = size
    first = {kind: next((n for n in k.names if n in sizes), "") for kind, k in KINDS.items()}
    wide, heads, kv = first["width"], first["heads"], first["kv_heads"]
    mine = {wide, heads} - set(file)  # (the file's own: its call tells)
    if wide and heads and not first["head_size"] and sizes[wide] % sizes[heads] and mine:
        C = sizes[wide]
        divisors = ", ".join(str(d) for d in range(1, C + 1) if C % d == 0)
        raise UserValueError(
            f"{shown(heads)}: {wide}={C} is not divisible by {heads}={sizes[heads]} (each "
            f"head gets {wide} / {heads} channels); give one of {divisors}"
        )
    if kv and heads and sizes[heads] % sizes[kv]:
        raise UserValueError(
            f"{shown(kv)}: {heads}={sizes[heads]} is not divisible by {kv}={sizes[kv]} (each "
            "key/value head serves n_head / n_kv_head query heads)"
        )


def width(module: nn.Module, kwargs: Mapping[str, object], T: int = 2) -> int:
    """C: the first candidate (an argument, an attribute, a layer's width, its parameters'
    sizes) for which the block maps (2, T, C) to (2, T, C), else the width most of its layers
    take (a block that fails at its own width: its error is what to report)."""
    said, layers = _said(module, kwargs, KINDS["width"].names), list[int]()
    for m in module.modules():
        if isinstance(m, (nn.LayerNorm, nn.RMSNorm)) and m.normalized_shape:
            layers.append(int(m.normalized_shape[-1]))
        elif isinstance(m, nn.Linear):
            layers.append(int(m.in_features))
        elif isinstance(m, nn.MultiheadAttention):
            layers.append(int(m.embed_dim))
    sizes = Counter(n for p in module.parameters() for n in p.shape if n > 1)  # the most first
    candidates = [*dict.fromkeys(said + layers + sorted(sizes, key=lambda n: (-sizes[n], n)))]
    if not candidates:
        raise UserValueError(
            f"cannot tell the width C of {type(module).__name__}: it has no parameters and no "
            "n_embd / d_model / embed_dim argument or attribute; pass --arg n_embd=C"
        )
    fits = (c for c in candidates if len(candidates) == 1 or _accepts(module, c, T))
    most = Counter(layers).most_common(1)  # not a submodule's attribute (a rotary's d_model)
    return next(fits, candidates[0] if kwargs.keys() & set(KINDS["width"].names) or not most
                else most[0][0])  # fmt: skip


def _accepts(module: nn.Module, C: int, T: int) -> bool:
    try:
        copied = copy.deepcopy(module).eval()
        first = next(copied.parameters(), None)
        dtype = first.dtype if first is not None and first.is_floating_point() else None
        device = first.device if first is not None else None
        g = torch.Generator().manual_seed(0)
        x = torch.randn(2, T, C, generator=g, dtype=dtype).to(device)
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            y = copied(x)
    except CAUGHT:
        return False
    return first_tensor(y, (2, T, C)) is not None


def max_length(
    module: nn.Module, kwargs: Mapping[str, object], default: int, target: object
) -> int:
    """The longest sequence the block accepts, by its arguments (given, or its constructor's
    defaults: a rotary table of ``block_size`` rows, s99), a causal-mask buffer or the module
    settings of ``target``'s file (``BLOCK_SIZE = 128``, a mask made in forward)."""
    try:
        factory = callable(target) and not isinstance(target, nn.Module)  # a class or function
        defaults = {p.name: p.default for p in parameters(cast(Any, target))} if factory else {}
    except (TypeError, ValueError):  # no signature to read
        defaults = {}
    said = _said(module, {**defaults, **kwargs}, KINDS["length"].names)
    masks = [
        int(b.shape[-1])
        for b in module.buffers()
        if b.dim() >= 2 and b.shape[-1] == b.shape[-2] >= 1
    ]
    named = settings(target)[1].items()  # (none for a block given as a module)
    masks += [v for n, v in named if n.lower() in KINDS["length"].names]  # the block's own first
    return next(iter(said + masks), default)


def _said(module: nn.Module, kwargs: Mapping[str, object], names: tuple[str, ...]) -> list[int]:
    """The sizes called ``names`` in the arguments, then each module's (or its ``config``'s)
    attributes (``dim`` only as an argument: ``nn.Softmax`` has one)."""
    found = [v for n in names if (v := number(kwargs.get(n)))]
    for m in module.modules():
        config = getattr(m, "config", None)
        for n in (n for n in names if n != "dim"):
            own = getattr(m, n, None)
            if v := number(getattr(config, n, None) if own is None else own):
                found.append(v)
    return found
