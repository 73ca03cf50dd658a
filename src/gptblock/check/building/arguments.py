"""Constructor arguments a block needs beyond the common ones (``complete``), else the ``--arg``
line that builds it: a guessed value is never used for a check."""

from __future__ import annotations

import dataclasses
import inspect
import re
import types
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ...errors import UserValueError
from ..mistakes.report import CAUGHT, one_line
from ..serve.calls import learner_line
from ..serve.loop import signature
from . import sizes as _sizes
from .configs import (
    config_defaults,
    config_fields,
    config_name,
    dataclass_config,
    number,
    parameters,
)
from .sizes import DROPOUTS, KINDS, Kind, config_class

__all__ = [
    "COMMON_ARGUMENTS", "arg_line", "builds", "complete", "fill_common_arguments", "fit_arguments",
    "guess",
]  # fmt: skip

# small values for the arguments most blocks take; dropout non-zero, so that dropout left on in
# eval mode shows up
COMMON_ARGUMENTS: dict[str, object] = {
    **{n: k.value for k in KINDS.values() for n in k.names[: k.common]},
    DROPOUTS[0]: 0.1,
}
_GUESSES = (  # the first that fits: hidden_dropout_prob is a dropout, dim_ff an MLP's width,
    (("drop",), 0.1),  # ffn_mult a multiplier; a dropout on, so that one left on in eval shows
    (("partial", "theta", "base"), None),  # the block's own rotation: no value to suggest
    (("_mult", "multip", "ratio", "factor", "expansion"), 4),  # (multi_query: a flag)
    (("ff", "mlp", "intermediate", "inner"), 128),  # 4C
    *((k.guess, k) for k in KINDS.values() if k.guess),  # a size: the file's, else k.value
    (("emb",), 32),
    (("eps",), 1e-5),
    (("bias",), True),
    (("idx", "index", "layer_id", "_id"), 0),
    (("layer",), 1),
    (("vocab",), 64),
)
_ROLES = (*(k.names for k in KINDS.values()), DROPOUTS)


_LETTERS = {"c": "width", "d": "width", "h": "heads", "t": "length"}  # C, d, H, T
_NUMBERS = (int, float, bool, inspect.Parameter.empty)  # annotations a number may have
# a module's name (``rotary_embeddings``, ``rope``), unless a number's word says otherwise
_MODULE, _NUMBER = ("rotary", "rope", "embeddings"), ("dim", "theta", "base", "pct", "fac", "scal")


def guess(name: str, annotation: object = None, sizes: Mapping[str, object] = {}) -> object:
    """A small value for a constructor argument from its name (a size: the file's ``sizes``, by
    name), None where neither the name nor its annotation says a number (``rope: RoPE``)."""
    lower = name.lower()
    if isinstance(annotation, type) and annotation not in _NUMBERS:
        return None
    rotary = any(w in lower for w in _MODULE[:2]) and "dim" in lower  # as many as a head has
    kind = "head_size" if rotary else _sizes.kind_of(name)  # max_position_embeddings: a length
    module = any(w in lower for w in _MODULE) and not any(w in lower for w in _NUMBER)
    if module and kind in (None, "other"):
        return None
    if kind in ("heads", "length"):
        return sizes.get(KINDS[kind].names[0], KINDS[kind].value)
    if kind in ("head_size", "kv_heads"):
        C, nh = (
            number(sizes.get(KINDS[k].names[0])) or KINDS[k].value or 1 for k in ("width", "heads")
        )
        # kv heads: a group of two (one where the heads are odd), so that the grouping is checked
        own = number(sizes.get(KINDS[kind].names[0]))
        return own or (C // nh if kind == "head_size" else nh // 2 if nh % 2 == 0 else 1)
    found = next((v for words, v in _GUESSES if any(w in lower for w in words)), None)
    found = KINDS[_LETTERS[lower]] if found is None and lower in _LETTERS else found
    return sizes.get(found.names[0], found.value) if isinstance(found, Kind) else found


def fill_common_arguments(
    factory: Callable[..., Any], given: Mapping[str, object]
) -> dict[str, object]:
    """``given`` plus a small value for every common argument ``factory`` takes.

    Example:
        >>> from gptblock import lesson
        >>> fill_common_arguments(lesson.Block, {"n_head": 2})
        {'n_head': 2, 'n_embd': 32, 'block_size': 16, 'dropout': 0.1}
    """
    common = (n for n in signature(factory) if n in COMMON_ARGUMENTS and n not in given)
    return {**given, **{n: COMMON_ARGUMENTS[n] for n in common}}


def arg_line(values: Mapping[str, object]) -> str:
    return " ".join(f"--arg {k}={v!r}" for k, v in values.items())


def fit_arguments(
    factory: Callable[..., Any], given: Mapping[str, object]
) -> tuple[dict[str, object], list[str]]:
    """``given``, each to ``factory``'s parameter of its name, else of its role (``d_model`` to
    ``n_embd``), else left out; with notes of what moved."""
    params = signature(factory)  # **kwargs included
    if not params or any(
        p.kind is p.VAR_KEYWORD or config_name(n, factory) for n, p in params.items()
    ):
        return dict(given), []  # **kwargs or a config object: they take what is given
    fitted: dict[str, object] = {n: v for n, v in given.items() if n in params}
    name = getattr(factory, "__qualname__", repr(factory))
    notes = []
    for n, v in ((n, v) for n, v in given.items() if n not in params):
        role = next((r for r in _ROLES if n in r), ())
        to = next((p for p in params if p in role and p not in given and p not in fitted), "")
        fitted.update({to: v} if to else {})
        said = f"given to {name}'s {to} (it has no {n})" if to else f"left out: {name} takes no {n}"
        notes.append(f"{n}={v!r} {said}")
    return fitted, notes


def builds(factory: Callable[..., Any], args: Mapping[str, object]) -> bool:
    with torch.random.fork_rng(devices=[]):
        try:
            factory(**args)
        except CAUGHT:
            return False
    return True


def _index(name: str) -> int | None:
    """The value of an argument saying which layer the block is, None for any other name."""
    lower = name.lower()
    if lower in ("idx", "index", "i"):
        return 0
    words = lower.split("_")
    if len(words) < 2 or not ({"layer", "block", "depth"} & set(words[:-1])):
        return None
    return {"idx": 0, "index": 0, "id": 0, "i": 0, "number": 1, "no": 1, "num": 1}.get(words[-1])


def _needs(name: str, whose: str, values: Mapping[str, object], then: str) -> UserValueError:
    """The error naming what ``whose`` needs, with the ``--arg`` line where each has a guess."""
    said = f"{then}: {arg_line(values)}"
    if None in values.values():  # the values it can suggest, and which it cannot
        known = {k: v for k, v in values.items() if v is not None}
        rest = ", ".join(k for k in values if k not in known)
        said = f", e.g. {arg_line(known)} and a value for {rest}" if known else ""
        said = (
            f"give each with --arg NAME=VALUE (a Python literal){said}; a tensor or a module "
            "cannot be given so: check a function that builds the block with it"
        )
    return UserValueError(
        f"cannot build {name}: {whose} needs {', '.join(values)}, which --arg does not give; {said}"
    )


_AS_DICT = ("subscriptable", "not iterable", "must be a mapping")  # cfg["x"], dict(cfg), **cfg
_DICT_TYPED = re.compile(r"['\"]?(typing\.|collections\.abc\.)?(dict|Dict|Mapping)\b")


def _named(annotation: object) -> str:  # dict, dict[str, int], "dict", typing.Mapping[...]
    return annotation.__name__ if isinstance(annotation, type) else str(annotation)


def complete(
    factory: Callable[..., Any], args: dict[str, object], given: Mapping[str, object],
    sizes: Mapping[str, int],
) -> dict[str, object]:  # fmt: skip
    """``args`` with a layer index (``layer_idx`` 0), and a config object where ``factory``
    takes one nobody gave: its dataclass or own class called with ``given`` and ``sizes`` (a
    namespace: the common arguments of them), else a namespace. Attributes the block reads and
    nobody gave are asked for."""
    name = getattr(factory, "__qualname__", repr(factory))
    params = parameters(factory)
    missing = [p for p in params if p.default is p.empty and p.name not in args]
    args = {**args, **{p.name: i for p in missing if (i := _index(p.name)) is not None}}
    missing = [p for p in missing if p.name not in args]
    if not missing:
        return args
    param, cls = missing[0], config_class(factory, missing[0])
    index = {p.name for p in params if _index(p.name) is not None}  # the constructor's own
    given = {k: v for k, v in given.items() if k not in index}  # (s98: shown in the config too)
    if len(missing) != 1 or not (cls or config_name(param.name, factory)):
        values = {p.name: guess(p.name, p.annotation, sizes) for p in missing}
        built = None not in values.values() and builds(factory, {**args, **values})
        raise _needs(name, "it", values if built else dict.fromkeys(values), "this builds it")
    rest = {k: v for k, v in args.items() if k in {p.name for p in params}}  # the rest: config
    common = {n: sizes.get(n, v) for n, v in COMMON_ARGUMENTS.items()}
    values = {"bias": True, **common, **given}  # bias: not a size, but in most configs
    own = {} if dataclass_config(cls) else config_defaults(cls)
    if own:  # a plain class's values (``class Config: n_embd = 64``), the file's sizes, --arg's
        values = {**own, **{k: x for k, x in sizes.items() if k in own}, **given}
        required = inspect.Parameter.empty  # its __init__'s required parameters
        if lacking := {k: guess(k, sizes=sizes) for k, x in values.items() if x is required}:
            raise _needs(name, f"its {getattr(cls, '__name__', '')} config", lacking, "give them")
    fields, called = None, getattr(cls, "__name__", "")
    if cls is not None and dataclass_config(cls):
        fields = dataclasses.fields(cls)
        known = {f.name for f in fields}
        if unknown := sorted(set(given) - known - {n for k in KINDS.values() for n in k.names}):
            raise UserValueError(
                f"{name} takes a {called} config, which has no field {', '.join(unknown)}"
            )
        empty = dataclasses.MISSING
        values = {k: x for k, x in {**values, **sizes, **given}.items() if k in known}
        if "bias" not in given and any(f.name == "bias" and f.default is not empty for f in fields):
            values.pop("bias")  # the config's own default stands: bias=False builds no biases
        half = [f.name for f in fields if str(f.default) in ("torch.bfloat16", "torch.float16")]
        values = {**{n: torch.float32 for n in half if n not in given}, **values}  # checked on CPU
        lacking = {f.name: guess(f.name, sizes=sizes) for f in fields if f.default is empty
                   and f.default_factory is empty and f.name not in values}  # fmt: skip
        if lacking:
            raise _needs(name, f"its {called} config", lacking, "give them")

    def make(v: dict[str, object]) -> object:
        try:  # a dataclass (its own checks), or a class of the file's own, e.g. Config(**kw)
            return (cls or types.SimpleNamespace)(**v)
        except CAUGHT:
            if fields is not None:  # an attribute it lacks: not a field
                raise
            return types.SimpleNamespace(**v)

    files = [f for c in _sizes.settings(factory, given)[2].values() if (f := config_fields(c))]
    if files and not own and fields is None:  # the file's own cfg's keys, not the common ones
        values = {**files[0], **{k: v for k, v in sizes.items() if k in files[0]}, **given}
    added: dict[str, object] = {}
    # what building it raised, at the learner's line; config["x"], or ``cfg: dict`` (s103)
    raised, as_dict = "", fields is None and _DICT_TYPED.match(_named(param.annotation)) is not None
    for _ in range(16):  # each round adds one attribute the block read and nobody gave
        try:
            config = dict(values, **added) if as_dict else make({**values, **added})
            with torch.random.fork_rng(devices=[]):
                factory(**rest, **{param.name: config})
        except UserValueError:
            raise
        except CAUGHT as e:
            read = isinstance(e, KeyError if as_dict else AttributeError)  # config["x"], .x
            if read and getattr(e, "obj", config) is config:  # not another object's attribute
                attribute = e.args[0] if as_dict and e.args else getattr(e, "name", None)
                if fields is not None:  # a dataclass has every field: the code and it disagree
                    raise UserValueError(
                        f"cannot build {name}: it reads {param.name}.{attribute}, which its "
                        f"{type(config).__name__} has no field for{learner_line(e, None)}"
                    ) from e
                if isinstance(attribute, str) and attribute not in added:
                    held = [f[attribute] for f in files if attribute in f]  # the file's cfg's
                    named = any(attribute in k.names for k in KINDS.values())
                    if named or _sizes.kind_of(attribute) not in (None, "other") or not held:
                        held = [guess(attribute, sizes=sizes)]  # a size: the file's, by kind
                    added[attribute] = held[0]
                    if added[attribute] is None:  # named, with no value to suggest
                        raise _needs(name, f"its {param.name}", added, "") from e
                    continue
            elif as_dict and isinstance(e, TypeError) and "required" in str(e):  # f(**config)
                said = re.findall(r"'(\w+)'", str(e).partition("argument")[2])
                if lacking := {n: guess(n, sizes=sizes) for n in said if n not in added}:
                    if None in lacking.values():  # named, with no value to suggest
                        raise _needs(name, f"its {param.name}", lacking, "") from e
                    added.update(lacking)
                    continue
            elif fields is None and not as_dict and any(w in str(e) for w in _AS_DICT):
                as_dict = True
                continue
            raised = f": building it raised {one_line(e)}{learner_line(e, factory)}"
            break
        if not added.keys() <= {k for f in files for k in f}:  # a guess: said, never assumed
            raise _needs(name, f"its {param.name}", added, "this builds it")
        return {**rest, param.name: config}
    raise UserValueError(
        f"cannot build {name}({param.name}){raised}; give the config's fields with --arg "
        "NAME=VALUE (they make a namespace or a dict), or check a function that returns the block"
    )
