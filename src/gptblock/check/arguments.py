"""Constructor arguments a block needs beyond the common ones: a config object, or the exact
``--arg`` line that builds it.

``complete(factory, args)`` looks at what ``factory`` requires but ``args`` (the caller's
arguments plus ``build.COMMON_ARGUMENTS``) lacks:

* one argument named like a config (``config``, ``cfg``, ``args``, ``hparams``...): it is built
  from the arguments given, as the annotated class (a dataclass gets the fields it has) or as a
  ``types.SimpleNamespace``; an attribute the block then reads but nobody gave is an error that
  names it, with a value that builds it;
* anything else: an error with the exact ``--arg NAME=VALUE ...`` line that builds the block,
  its values guessed from the names (a width 32, a head count 4, a length 16, an index 0...) and
  tried, or, when no guess builds it, the names to give.

Nothing is guessed silently: a value the caller did not give is never used for a check.

``forward_arguments`` does the same for what the block's ``forward`` needs besides its input.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn as nn

from ..errors import UserValueError
from .report import CAUGHT
from .sizes import CONFIG_NAMES, config_class

__all__ = ["CONFIG_DEFAULTS", "complete", "forward_arguments", "guess"]

CONFIG_DEFAULTS: dict[str, object] = {"bias": True}
"""A config's fields that are not sizes but that most configs have (nanoGPT's ``bias``)."""
_GUESSES = (
    (("embd", "d_model", "dim", "hidden", "width", "embed", "channels"), 32),
    (("head",), 4),
    (("block", "ctx", "len", "seq", "position", "context", "window"), 16),
    (("drop",), 0.0),
    (("eps",), 1e-5),
    (("bias",), True),
    (("idx", "index", "layer_id", "_id"), 0),
    (("layer",), 1),
    (("vocab",), 64),
    (("mult", "ratio", "factor", "expansion"), 4),
)


def guess(name: str) -> object:
    """A small value for a constructor argument, from its name.

    Example:
        >>> guess("n_layer"), guess("layer_idx"), guess("n_kv_heads"), guess("max_seq_len")
        (1, 0, 4, 16)
    """
    lower = name.lower()
    return next((v for words, v in _GUESSES if any(w in lower for w in words)), 1)


def _signature(factory: Callable[..., Any]) -> list[inspect.Parameter]:
    try:
        return list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):
        return []


def _required(factory: Callable[..., Any]) -> list[inspect.Parameter]:
    params = _signature(factory)
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p for p in params if p.kind in kinds and p.default is inspect.Parameter.empty]


def _line(values: Mapping[str, object]) -> str:
    return " ".join(f"--arg {k}={v!r}" for k, v in values.items())


def _builds(factory: Callable[..., Any], args: Mapping[str, object]) -> bool:
    with torch.random.fork_rng(devices=[]):
        try:
            factory(**args)
        except CAUGHT:
            return False
    return True


def _index(name: str) -> int | None:
    """The value of an argument that says which layer the block is (``layer_idx`` 0,
    ``layer_number`` 1), None for any other name.

    Example:
        >>> _index("layer_idx"), _index("layer_number"), _index("n_layer")
        (0, 1, None)
    """
    lower = name.lower()
    if lower in ("idx", "index", "i"):
        return 0
    words = lower.split("_")
    if len(words) < 2 or not ({"layer", "block", "depth"} & set(words[:-1])):
        return None
    return {"idx": 0, "index": 0, "id": 0, "i": 0, "number": 1, "no": 1, "num": 1}.get(words[-1])


def complete(
    factory: Callable[..., Any],
    args: dict[str, object],
    given: Mapping[str, object],
    defaults: Mapping[str, object],
    sizes: Mapping[str, object] | None = None,
) -> dict[str, object]:
    """``args`` with a config object built where ``factory`` takes one, and a layer index
    (``layer_idx`` 0) where it takes one nobody gave.

    Args:
        factory: the block's class or factory.
        args: the arguments it will be called with (given ones and common ones).
        given: the arguments the caller gave (``--arg``).
        defaults: the common arguments' values, also a config's.
        sizes: every size name with the value it is built at (``sizes.names``): a config
            dataclass's fields of those names get them.

    Raises:
        UserValueError: ``factory`` needs arguments nobody gave; the message has the ``--arg``
            line that builds it, or the names to give.
    """
    name = getattr(factory, "__qualname__", repr(factory))
    args = dict(args)
    missing = [p for p in _required(factory) if p.name not in args]
    for p in missing:
        index = _index(p.name)
        if index is not None:
            args[p.name] = index
    missing = [p for p in missing if p.name not in args]
    if not missing:
        return args
    configs = [p for p in missing if p.name.lower() in CONFIG_NAMES or _config_class(factory, p)]
    if len(configs) == 1 and len(missing) == 1:
        values = {**defaults, **given}
        return _with_config(factory, name, missing[0], args, values, given, sizes or {})
    values = {p.name: guess(p.name) for p in missing}
    if _builds(factory, {**args, **values}):
        raise UserValueError(
            f"cannot build {name}: it needs {', '.join(values)}, which --arg does not give; "
            f"this builds it: {_line(values)}"
        )
    raise UserValueError(
        f"cannot build {name}: it needs {', '.join(values)}; give each with --arg NAME=VALUE"
    )


def _config_class(factory: Callable[..., Any], param: inspect.Parameter) -> type | None:
    """The class ``param`` is annotated with when it is a config: a dataclass or a class of
    the block's own file (not ``int``, ``torch.Tensor``...)."""
    cls = config_class(factory, param)
    if cls is None or (cls.__module__ != getattr(factory, "__module__", None)
                       and not dataclasses.is_dataclass(cls)):  # fmt: skip
        return None
    return cls


def _maker(
    factory: Callable[..., Any],
    name: str,
    param: inspect.Parameter,
    given: Mapping[str, object],
    sizes: Mapping[str, object],
) -> Callable[[dict[str, object]], object]:
    """How to make the config from values: its dataclass (the fields it has; a required field
    nobody gave is refused with the line that gives it), its own class called with them as
    keywords, else a namespace."""
    cls = _config_class(factory, param)
    if cls is not None and dataclasses.is_dataclass(cls):
        fields = dataclasses.fields(cls)
        known = {f.name for f in fields}
        unknown = sorted(set(given) - known)
        if unknown:
            raise UserValueError(
                f"{name} takes a {cls.__name__} config, which has no field {', '.join(unknown)}"
            )
        empty = dataclasses.MISSING
        required = [f.name for f in fields if f.default is empty and f.default_factory is empty]

        def make(v: dict[str, object]) -> object:
            v = {**v, **{k: x for k, x in sizes.items() if k in known and k not in given}}
            lacking = [f for f in required if f not in v]
            if lacking:
                line = _line({f: guess(f) for f in lacking})
                raise UserValueError(
                    f"cannot build {name}: its {cls.__name__} config needs {', '.join(lacking)}, "
                    f"which --arg does not give; give them: {line}"
                )
            return cls(**{k: x for k, x in v.items() if k in known})

        return make
    if cls is not None:  # a class of the file's own, e.g. Config(**kw)

        def make_own(v: dict[str, object]) -> object:
            try:
                return cls(**v)
            except CAUGHT:
                return types.SimpleNamespace(**v)

        return make_own
    return lambda v: types.SimpleNamespace(**v)


def _with_config(
    factory: Callable[..., Any],
    name: str,
    param: inspect.Parameter,
    args: dict[str, object],
    values: dict[str, object],
    given: Mapping[str, object],
    sizes: Mapping[str, object],
) -> dict[str, object]:
    """``args`` plus the config object ``param`` built from ``values`` (given and common)."""
    own = {p.name for p in _signature(factory)} - {param.name}
    rest = {k: v for k, v in args.items() if k in own}  # the rest go into the config
    make = _maker(factory, name, param, given, sizes)
    values = {**CONFIG_DEFAULTS, **values}
    added: dict[str, object] = {}
    for _ in range(16):  # each round adds one attribute the block read and nobody gave
        try:
            config = make({**values, **added})
            with torch.random.fork_rng(devices=[]):
                factory(**rest, **{param.name: config})
        except AttributeError as e:
            attribute = getattr(e, "name", None)
            if not isinstance(attribute, str) or attribute in added:
                break
            added[attribute] = guess(attribute)
            continue
        except UserValueError:
            raise
        except CAUGHT:
            break
        if added:
            raise UserValueError(
                f"cannot build {name}: its {param.name} needs {', '.join(added)}, which --arg "
                f"does not give; this builds it: {_line(added)}"
            )
        return {**rest, param.name: config}
    raise UserValueError(
        f"cannot build {name}({param.name}): give the config's fields with --arg NAME=VALUE "
        "(they make a namespace), or check a function that returns the block"
    )


_SAME = ("key", "value", "keys", "values", "k", "v", "kv")  # not memory: a cross-attention
_POSITIONS = ("position_ids", "positions", "pos", "input_pos", "pos_ids")


def _optional(annotation: object) -> bool:
    """Whether an annotation admits None (``Optional[Tensor]``, ``Tensor | None``, as text too)."""
    if isinstance(annotation, str):
        words = annotation.strip("'\"").split("|")  # quoted under `from __future__ import ...`
        return "Optional[" in annotation or "None" in (w.strip() for w in words)
    return type(None) in typing.get_args(annotation)


def forward_arguments(module: nn.Module) -> list[str]:
    """Fill what the block's ``forward`` requires besides its input, where the parameter says
    what it holds: the input again for ``key`` / ``value`` (self-attention), ``torch.arange(T)``
    as (1, T) for ``position_ids``, True for ``is_causal``, None where its annotation admits
    None. Returns the note saying so (none when nothing was filled). A mask is never made: the
    same mask means "keep" in one block and "hide" in another, so a guess can turn a correct
    block into a failing one, or a reversed mask into a passing one.

    Raises:
        UserValueError: a required parameter whose value is the block's own convention (a mask:
            kept or hidden, bool or added) or unknown; the message names it and the wrapper.

    Example:
        >>> class Layer(nn.Module):
        ...     def forward(self, query, key, value, cache: "dict | None"):
        ...         return query + key + value
        >>> layer = Layer()
        >>> forward_arguments(layer)
        ['forward(query, key, value, cache) called with key = value = the input, cache=None']
        >>> layer(torch.ones(1, 2, 3)).sum().item()
        18.0
    """
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    if not params or params[0].kind not in (*kinds, inspect.Parameter.POSITIONAL_ONLY):
        return []
    fill: dict[str, str] = {}
    for p in params[1:]:
        if p.default is not inspect.Parameter.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        name = type(module).__name__
        if p.kind in kinds and p.name.lower() in _SAME:
            fill[p.name] = "input"
        elif p.kind in kinds and p.name.lower() in _POSITIONS:
            fill[p.name] = "positions"
        elif p.kind in kinds and p.name.lower() in ("is_causal", "causal"):
            fill[p.name] = "causal"
        elif p.kind in kinds and _optional(p.annotation):
            fill[p.name] = "none"
        else:
            what = "a mask's convention (kept or hidden, bool or added) is the block's own" if (
                "mask" in p.name.lower()) else "the checker cannot tell what it holds"  # fmt: skip
            raise UserValueError(
                f"cannot check {name}: its forward needs {p.name} besides the input and {what}; "
                f"check a module whose forward(x) calls it with the {p.name} your model passes"
            )
    if not fill:
        return []
    module.register_forward_pre_hook(functools.partial(_filled, fill), with_kwargs=True)
    said = {"input": "the input", "positions": "torch.arange(T) as (1, T)", "none": "None",
            "causal": "True"}  # fmt: skip
    same = [n for n, how in fill.items() if how == "input"]
    parts = [f"{' = '.join(same)} = the input"] if same else []
    parts += [f"{n}={said[how]}" for n, how in fill.items() if how != "input"]
    shown = ", ".join(p.name for p in params)
    return [f"forward({shown}) called with {', '.join(parts)}"]


def _filled(
    fill: Mapping[str, str], module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The pre-hook: the arguments the caller did not give, made from the input (B, T, C)."""
    x = args[0] if args else next(iter(kwargs.values()))
    T = x.shape[-2]
    for n, how in list(fill.items())[max(len(args) - 1, 0) :]:
        if n not in kwargs:
            kwargs[n] = x if how == "input" else (how == "causal" or None)
            if how == "positions":
                kwargs[n] = torch.arange(T, device=x.device).unsqueeze(0)  # (1, T)
    return args, kwargs
