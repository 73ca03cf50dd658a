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
"""

from __future__ import annotations

import dataclasses
import inspect
import types
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..errors import UserValueError
from .report import CAUGHT

__all__ = ["CONFIG_NAMES", "complete", "guess"]

CONFIG_NAMES = ("config", "cfg", "conf", "args", "hparams", "params", "settings", "opt", "opts")
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


def _required(factory: Callable[..., Any]) -> list[inspect.Parameter]:
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return []
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


def complete(
    factory: Callable[..., Any],
    args: dict[str, object],
    given: Mapping[str, object],
    defaults: Mapping[str, object],
) -> dict[str, object]:
    """``args`` with a config object built where ``factory`` takes one.

    Args:
        factory: the block's class or factory.
        args: the arguments it will be called with (given ones and common ones).
        given: the arguments the caller gave (``--arg``).
        defaults: the common arguments' small values, also a config's defaults.

    Raises:
        UserValueError: ``factory`` needs arguments nobody gave; the message has the ``--arg``
            line that builds it, or the names to give.
    """
    name = getattr(factory, "__qualname__", repr(factory))
    missing = [p for p in _required(factory) if p.name not in args]
    if not missing:
        return args
    if len(missing) == 1 and missing[0].name.lower() in CONFIG_NAMES:
        return _with_config(factory, name, missing[0], args, {**defaults, **given}, given)
    values = {p.name: guess(p.name) for p in missing}
    if _builds(factory, {**args, **values}):
        raise UserValueError(
            f"cannot build {name}: it needs {', '.join(values)}, which --arg does not give; "
            f"this builds it: {_line(values)}"
        )
    raise UserValueError(
        f"cannot build {name}: it needs {', '.join(values)}; give each with --arg NAME=VALUE"
    )


def _with_config(
    factory: Callable[..., Any],
    name: str,
    param: inspect.Parameter,
    args: dict[str, object],
    values: dict[str, object],
    given: Mapping[str, object],
) -> dict[str, object]:
    """``args`` plus the config object ``param`` built from ``values`` (given and common)."""
    rest = {k: v for k, v in args.items() if k not in values}
    cls = param.annotation
    if isinstance(cls, type) and dataclasses.is_dataclass(cls):
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(given) - fields)
        if unknown:
            raise UserValueError(
                f"{name} takes a {cls.__name__} config, which has no field {', '.join(unknown)}"
            )
        make: Callable[[dict[str, object]], object] = lambda v: cls(  # noqa: E731
            **{k: x for k, x in v.items() if k in fields}
        )
    else:
        make = lambda v: types.SimpleNamespace(**v)  # noqa: E731
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
