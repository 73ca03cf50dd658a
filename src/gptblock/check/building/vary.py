"""The other sizes a block is checked at, found by value rather than by name.

A block's sizes go by many names (``hid_dim``, ``n_state``, ``emb_dim`` in a config dict...), so
``plan`` starts from the block built at its file's sizes, whose width C it measured, and reads
every whole number it was built with (arguments, defaults, config objects' fields, module
settings). A number equal to C is the width; 2C..8C a hidden width; with a head count, C / nh the
head size. A name says only what a value cannot (``kind_of``). Each is changed consistently to
``sizes.other_sizes``' set; the build there, whose width the caller measures again, is the proof.

Shapes: C channels, nh heads, hs head size.
"""

from __future__ import annotations

import copy
import dataclasses
import types
from collections.abc import Callable, Mapping
from typing import Any

from .sizes import KINDS, Sizes, number, other_sizes, settings, signature

__all__ = ["Plan", "kind_of", "plan"]

_NOT_SIZES = ("layer", "vocab", "ratio", "mult", "factor", "expansion", "window", "seed", "batch",
              "rotary", "theta", "depth", "bucket", "stride", "kernel")  # fmt: skip
_NOT_SIZE_WORDS = {"id", "idx", "index", "base"}
_LENGTHS = ("block_size", "len", "ctx", "context", "seq", "position", "max_t")
_HEAD_SIZES = {"d_k", "d_v", "d_kv", "dk", "dv", "kv_channels", "d_head"}


def kind_of(name: str) -> str | None:
    """What a name says its number is, when the number alone cannot: ``heads``, ``kv_heads``,
    ``head_size``, ``length``, ``other`` (not a size), or None (the value decides).

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
    """How to build the block at other sizes: the arguments (the changed ones and config
    copies in), the sizes by kind, the module settings to set, and the label
    (``hid_dim=48 (C), pf_dim=192 (4C)``)."""

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
    kind = type(value)
    if kind.__module__.split(".")[0] in ("torch", "builtins", "numpy") and not isinstance(
        value, types.SimpleNamespace
    ):
        return None
    if isinstance(value, (type, types.FunctionType, types.ModuleType)) or callable(value):
        return None
    try:
        return {k: v for k, v in vars(value).items() if not k.startswith("_")}
    except TypeError:  # __slots__
        return None


def _replaced(config: object, changes: Mapping[str, int]) -> object:
    """A copy of ``config`` with ``changes`` (a dataclass through ``replace``, so that its
    ``__post_init__`` derives what it derives from them)."""
    if isinstance(config, dict):
        return {**config, **changes}
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        init = {f.name for f in dataclasses.fields(config) if f.init}
        kept = {k: v for k, v in changes.items() if k in init}
        new: object = dataclasses.replace(config, **kept)
    else:
        new = copy.copy(config)
    for k, v in changes.items():
        object.__setattr__(new, k, v)  # also a frozen one: the value is the derived one
    return new


def _by_name(leaves: list[tuple[str, int]], kind: str, divides: int) -> int | None:
    return next((v for n, v in leaves if kind_of(n) == kind and divides % v == 0), None)


def plan(factory: Callable[..., Any], args: Mapping[str, object], C: int) -> Plan | None:
    """The arguments that build ``factory`` at other sizes, from ``args`` it was built with
    at the file's sizes and the width ``C`` measured there; None when no number is a size.

    Example:
        >>> def make(hid_dim=32, n_heads=4, pf_dim=128, dropout=0.1): ...
        >>> found = plan(make, {}, 32)
        >>> found.args, found.label
        ({'hid_dim': 48, 'n_heads': 3, 'pf_dim': 192}, 'hid_dim=48 (C), n_heads=3, pf_dim=192 (4C)')
    """
    top = {n: p.default for n, p in signature(factory).items() if p.default is not p.empty}
    top.update(args)
    configs = {n: f for n, v in top.items() if (f := _fields(v)) is not None}
    leaves = [(n, v) for n, x in top.items() if (v := number(x)) is not None]
    leaves += [(n, v) for f in configs.values() for n, x in f.items() if (v := number(x))]
    globals_ = settings(factory)[1]
    leaves += list(globals_.items())
    nh = _by_name(leaves, "heads", C)
    kv = _by_name(leaves, "kv_heads", nh) if nh else None
    fewer = [v for n, v in leaves if kind_of(n) == "heads" and nh and v < nh and nh % v == 0]
    kv = kv or next(iter(fewer), None)  # two head counts: the fewer are key/value heads
    hs = next((v for n, v in leaves if kind_of(n) == "head_size"), C // nh if nh else None)
    L = next((v for n, v in leaves if kind_of(n) == "length"), None)
    measured = {"width": C, "heads": nh, "kv_heads": kv, "head_size": hs, "length": L}
    other = other_sizes(Sizes({k: v for k, v in measured.items() if v is not None}))
    if other is None:
        return None
    new = other.values

    def changed(name: str, v: int) -> tuple[int, str] | None:
        """The new value of a number called ``name`` and its kind (``4C`` for a multiple)."""
        kind = kind_of(name)
        if kind in ("heads", "kv_heads"):  # gpt-fast's n_local_heads: kv heads by value
            kind = "heads" if kind == "heads" and v == nh else "kv_heads"
        if kind in ("heads", "kv_heads", "head_size", "length"):
            return (new[kind], kind) if v == measured[kind] and kind in new else None
        if kind is not None:
            return None
        if v == C:
            return new["width"], "width"
        if v % C == 0 and 2 <= v // C <= 8:
            return v // C * new["width"], f"{v // C}C"
        if hs is not None and v == hs and "head_size" in new:
            return new["head_size"], "head_size"
        return None

    out, said = dict(args), {}
    for n, x in top.items():
        if (v := number(x)) is not None and (c := changed(n, v)) is not None:
            out[n], said[n] = c
    for n, fields in configs.items():
        changes = {}
        for k, x in fields.items():
            if (v := number(x)) is not None and (c := changed(k, v)) is not None:
                changes[k], said[k] = c
        if changes:
            out[n] = _replaced(top[n], changes)
    patched = {}
    for n, v in globals_.items():
        if (c := changed(n, v)) is not None:
            patched[n], said[n] = c
    if not said:
        return None
    values: dict[str, object] = dict(patched)
    for n in configs:
        values.update({k: v for k, v in (_fields(out[n]) or {}).items() if k in said})
    values.update({k: v for k, v in out.items() if k in said})
    return Plan(out, other, patched, _label(values, said))


_ORDER = ("width", "heads", "kv_heads", "head_size", "C", "length")
_WHY = {"width": "C", "heads": "nh", "kv_heads": "kv heads", "head_size": "hs", "length": "T max"}


def _label(values: Mapping[str, object], said: Mapping[str, str]) -> str:
    """``hid_dim=48 (C), n_heads=3, pf_dim=192 (4C)``: the changed values by kind, the kind
    said where the name does not say it."""

    def rank(name: str) -> int:
        kind = said[name]
        return _ORDER.index("C" if kind.endswith("C") else kind)

    shown = []
    for n in sorted(said, key=rank):
        kind = said[n]
        obvious = n in KINDS.get(kind, ())
        why = "" if obvious else f" ({_WHY.get(kind, kind)})"
        shown.append(f"{n}={values[n]!r}{why}")
    return ", ".join(shown)
