"""The other sizes a block is checked at, found by value rather than by name (``hid_dim``,
``n_state``...): of the numbers the block was built with, the measured width C is the width,
2C..8C a hidden width, C / nh (nh heads) the head size; a name says what a value cannot.
"""

from __future__ import annotations

import copy
import dataclasses
import types
from collections.abc import Callable, Mapping
from typing import Any

from .sizes import KINDS, Sizes, number, other_sizes, parameters, settings

__all__ = ["Plan", "kind_of", "plan"]

_NOT_SIZES = ("layer", "vocab", "ratio", "mult", "factor", "expansion", "window", "seed", "batch",
              "rotary", "theta", "depth", "bucket", "stride", "kernel")  # fmt: skip
_NOT_SIZE_WORDS = {"id", "idx", "index", "base"}
_LENGTHS = ("block_size", "len", "ctx", "context", "seq", "position", "max_t")
_HEAD_SIZES = {"d_k", "d_v", "d_kv", "dk", "dv", "kv_channels", "d_head"}
_ORDER = ("width", "heads", "kv_heads", "head_size", "C", "length")
_WHY = {"width": "C", "heads": "nh", "kv_heads": "kv heads", "head_size": "hs", "length": "T max"}


def kind_of(name: str) -> str | None:
    """What a name says its number is: a kind, ``other`` (not a size), or None (the value decides).

    Example:
        >>> [kind_of(n) for n in ("num_attention_heads", "attn_dim_head", "n_ctx", "layer_idx")]
        ['heads', 'head_size', 'length', 'other']
        >>> kind_of("hid_dim") is None
        True
    """
    lower = name.lower()
    words = set(lower.split("_"))
    if any(w in lower for w in _NOT_SIZES) or words & _NOT_SIZE_WORDS:
        return "other"
    if lower in _HEAD_SIZES or ("head" in lower and any(w in lower for w in ("dim", "size", "d_"))):
        return "head_size"
    if ("head" in lower or "group" in lower) and any(w in lower for w in ("kv", "key", "query")):
        return "kv_heads"  # n_kv_heads, num_key_value_heads, litgpt's n_query_groups
    if "head" in lower:
        return "heads"
    if any(w in lower for w in _LENGTHS) or words & {"pos", "tokens", "t"}:
        return "length"
    return None


@dataclasses.dataclass
class Plan:
    """The arguments, sizes, module settings and label of the other sizes."""

    args: dict[str, object]
    sizes: Sizes
    settings: dict[str, int]
    label: str


def _fields(value: object) -> dict[str, object] | None:
    """A config object's fields, None for anything else (a module, a tensor, a number...)."""
    if isinstance(value, dict):
        return {k: v for k, v in value.items() if isinstance(k, str)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name, None) for f in dataclasses.fields(value)}
    library = type(value).__module__.split(".")[0] in ("torch", "builtins", "numpy")
    if (library and not isinstance(value, types.SimpleNamespace)) or callable(value):
        return None
    try:
        return {k: v for k, v in vars(value).items() if not k.startswith("_")}
    except TypeError:  # __slots__
        return None


def _replaced(config: object, changes: Mapping[str, int]) -> object:
    """A copy of ``config`` with ``changes`` (a dataclass's ``__post_init__`` derives from them)."""
    if isinstance(config, dict):
        return {**config, **changes}
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        init = {f.name for f in dataclasses.fields(config) if f.init}
        new: object = dataclasses.replace(config, **{k: v for k, v in changes.items() if k in init})
    else:
        new = copy.copy(config)
    for k, v in changes.items():
        object.__setattr__(new, k, v)  # also a frozen one: the value is the derived one
    return new


def plan(factory: Callable[..., Any], args: Mapping[str, object], C: int) -> Plan | None:
    """The arguments that build ``factory`` at other sizes, from ``args`` and the width ``C``
    of the build at the file's sizes; None when no number is a size.

    Example:
        >>> def make(hid_dim=32, n_heads=4, pf_dim=128, dropout=0.1): ...
        >>> found = plan(make, {}, 32)
        >>> found.args, found.label
        ({'hid_dim': 48, 'n_heads': 3, 'pf_dim': 192}, 'hid_dim=48 (C), n_heads=3, pf_dim=192 (4C)')
    """
    top = {p.name: p.default for p in parameters(factory) if p.default is not p.empty}
    top.update(args)
    configs = {n: f for n, v in top.items() if (f := _fields(v)) is not None}
    globals_ = settings(factory)[1]
    found = [*top.items(), *(x for f in configs.values() for x in f.items()), *globals_.items()]
    leaves = [(n, v) for n, x in found if (v := number(x)) is not None]

    def by_name(kind: str, divides: int) -> int | None:
        return next((v for n, v in leaves if kind_of(n) == kind and divides % v == 0), None)

    nh = by_name("heads", C)
    fewer = [v for n, v in leaves if kind_of(n) == "heads" and nh and v < nh and nh % v == 0]
    kv = (by_name("kv_heads", nh) if nh else None) or next(iter(fewer), None)  # fewer: kv heads
    hs = next((v for n, v in leaves if kind_of(n) == "head_size"), C // nh if nh else None)
    L = next((v for n, v in leaves if kind_of(n) == "length"), None)
    measured = {"width": C, "heads": nh, "kv_heads": kv, "head_size": hs, "length": L}
    other = other_sizes(Sizes({k: v for k, v in measured.items() if v is not None}))
    if other is None:
        return None
    new = other.values
    said: dict[str, str] = {}

    def changes(numbers: Mapping[str, object]) -> dict[str, int]:
        """The new value of each size, its kind (``4C`` for a multiple) in ``said``."""
        out = {}
        for name, x in numbers.items():
            if (v := number(x)) is None or (kind := kind_of(name)) == "other":
                continue
            if kind in ("heads", "kv_heads"):  # gpt-fast's n_local_heads: kv heads by value
                kind = "heads" if kind == "heads" and v == nh else "kv_heads"
            if kind is not None:
                if v == measured[kind] and kind in new:
                    out[name], said[name] = new[kind], kind
            elif v == C:
                out[name], said[name] = new["width"], "width"
            elif v % C == 0 and 2 <= v // C <= 8:
                out[name], said[name] = v // C * new["width"], f"{v // C}C"
            elif hs is not None and v == hs and "head_size" in new:
                out[name], said[name] = new["head_size"], "head_size"
        return out

    top_changes = changes(top)
    config_changes = {n: c for n, fields in configs.items() if (c := changes(fields))}
    patched = changes(globals_)
    if not said:
        return None
    in_configs = {k: v for c in config_changes.values() for k, v in c.items()}
    values = {**patched, **in_configs, **top_changes}
    out = {**args, **top_changes, **{n: _replaced(top[n], c) for n, c in config_changes.items()}}
    # the label, hid_dim=48 (C), n_heads=3, pf_dim=192 (4C): the kind said where the name does not
    rank = {n: _ORDER.index("C" if kind.endswith("C") else kind) for n, kind in said.items()}
    shown = []
    for n in sorted(said, key=rank.__getitem__):
        why = "" if n in KINDS.get(said[n], ()) else f" ({_WHY.get(said[n], said[n])})"
        shown.append(f"{n}={values[n]!r}{why}")
    return Plan(out, other, patched, ", ".join(shown))
