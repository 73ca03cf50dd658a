"""The sizes a block is checked at: the file's own (``file_sizes``), another valid set
(``other_sizes``), and one report of the two checks (``combine``).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Callable, Mapping
from typing import Any

from ..mistakes.report import CheckReport, Finding

__all__ = [
    "CONFIG_NAMES", "KINDS", "Sizes", "combine", "config_class", "file_sizes", "names",
    "not_other", "number", "other_sizes", "parameters", "patch_globals", "settings", "signature",
    "size_sets",
]  # fmt: skip

# each kind of size and its names (``dim`` is a width only as an argument or a setting:
# ``nn.Softmax`` has a ``.dim``)
KINDS: dict[str, tuple[str, ...]] = {
    "width": ("n_embd", "d_model", "embed_dim", "hidden_size", "dim"),
    "heads": ("n_head", "n_heads", "nhead", "num_heads", "num_attention_heads", "heads"),
    "kv_heads": ("n_kv_head", "n_kv_heads", "num_kv_heads", "num_key_value_heads"),
    "head_size": ("head_size", "head_dim", "d_head", "d_k", "d_v", "dim_head"),
    "length": ("block_size", "max_len", "context_length", "max_seq_len", "n_ctx", "seq_len"),
}
# the names of an argument that is a config object (``Block(config)``)
CONFIG_NAMES = ("config", "cfg", "conf", "args", "hparams", "params", "settings", "opt", "opts")

CHECKER = {"width": 32, "heads": 4, "length": 16}  # a kind the file uses but gives no value
LARGEST_IMPLIED = {"width": 256, "length": 1024}  # above: built smaller, the same head count
_OTHERS = ((48, 3), (48, 6), (24, 2), (32, 2), (40, 5), (64, 8))  # (C, nh): hs 16, 8, 12, 16...
_HINTS = (*_OTHERS, (32, 4), (64, 4), (128, 4), (128, 8), (256, 8), (384, 6), (512, 8), (768, 12))


@dataclasses.dataclass(frozen=True)
class Sizes:
    """One value per kind of size (``KINDS``' keys), where each came from, what was assumed."""

    values: dict[str, int]
    sources: dict[str, str] = dataclasses.field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def label(self, used: Mapping[str, object]) -> str:
        """``n_embd=64, n_head=4``: one name ``used`` has for each kind."""
        found = (next((n for n in kind if n in used), None) for kind in KINDS.values())
        return ", ".join(f"{n}={used[n]!r}" for n in found if n is not None) or "its own sizes"

    def origins(self, shown: Mapping[str, object]) -> list[str]:
        by_source: dict[str, list[str]] = {}
        for kind, source in self.sources.items():
            if source not in ("--arg", "the checker"):
                name = next((n for n in KINDS[kind] if n in shown), KINDS[kind][0])
                by_source.setdefault(source, []).append(f"{name}={self.values[kind]}")
        said = "; ".join(f"{', '.join(v)} from {source}" for source, v in by_source.items())
        return ([f"built at the file's sizes: {said}"] if said else []) + list(self.notes)


def number(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    return None


def settings(factory: object) -> tuple[str, dict[str, int]]:
    """The file name and the numbers (the lecture's global ``n_embd = 64``) of ``factory``'s module.

    Example:
        >>> settings(int)
        ('builtins', {})
    """
    module = inspect.getmodule(factory)
    if module is None:
        return "", {}
    found = {n: v for n, x in vars(module).items() if (v := number(x))}
    file = getattr(module, "__file__", None)
    return (os.path.basename(file) if file else module.__name__), found


def config_class(factory: Callable[..., Any], param: inspect.Parameter) -> type | None:
    """``param``'s annotation if a dataclass or a class of the block's own file."""
    cls = param.annotation
    if isinstance(cls, str):
        module = inspect.getmodule(factory)
        cls = vars(module).get(cls) if module is not None else None
    if not isinstance(cls, type) or (cls.__module__ != getattr(factory, "__module__", None)
                                     and not dataclasses.is_dataclass(cls)):  # fmt: skip
        return None
    return cls


def signature(factory: object) -> dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(factory).parameters)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return {}


def parameters(factory: Callable[..., Any]) -> list[inspect.Parameter]:
    """The parameters that take one value each."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p for p in signature(factory).values() if p.kind in kinds]


def file_sizes(factory: Callable[..., Any], given: Mapping[str, object]) -> Sizes:
    """The sizes the file implies, by the first of ``places`` that names them, else the checker's.

    Example:
        >>> def make(n_embd=64, n_head=4): ...
        >>> file_sizes(make, {}).values
        {'width': 64, 'heads': 4}
    """
    params = parameters(factory)
    defaults = {p.name: p.default for p in params if p.default is not p.empty}
    classes = [c for p in params if dataclasses.is_dataclass(c := config_class(factory, p))]
    fields = {f.name: f.default for c in classes for f in dataclasses.fields(c)}
    file, module = settings(factory)
    used = {p.name for p in params} | set(fields) | set(module) | set(given)
    if any(p.name.lower() in CONFIG_NAMES and p.name not in given for p in params):
        used |= {"n_embd", "n_head", "block_size"}  # a config the checker builds has them all
    places = (
        ("--arg", given),
        ("the constructor's defaults", defaults),
        ("the config's defaults", fields),
        (f"{file}'s module settings", module),
    )
    values: dict[str, int] = {}
    sources: dict[str, str] = {}
    for kind, kind_names in KINDS.items():
        if not used & set(kind_names):
            continue
        for source, where in places:
            value = next((v for n in kind_names if n in where and (v := number(where[n]))), None)
            if value is not None and (kind != "width" or value >= 8 or source == "--arg"):
                values[kind], sources[kind] = value, source  # a width of 1 is a softmax's dim
                break
        else:
            if kind in CHECKER:
                values[kind], sources[kind] = CHECKER[kind], "the checker"
    C = values.get("width")
    if used & set(KINDS["head_size"]) and "head_size" not in values and C and "heads" in values:
        values["head_size"], sources["head_size"] = C // values["heads"], "the checker"
    # above LARGEST_IMPLIED and not --arg's: made smaller (the same head count, 16 channels a
    # head), as the checker's mistakes show at any size
    notes, nh, L = [], values.get("heads", 1), values.get("length")
    if C and C > LARGEST_IMPLIED["width"] and sources.get("width") != "--arg" and nh <= 16:
        values["width"] = 16 * nh
        if "head_size" in values:
            values["head_size"] = 16
        notes.append(f"the file's width {C} made {16 * nh} for the check (--arg sets it)")
    if L and L > LARGEST_IMPLIED["length"] and sources.get("length") != "--arg":
        values["length"] = 256
        notes.append(f"the file's length {L} made 256 for the check (--arg sets it)")
    return Sizes(values, sources, tuple(notes))


def other_sizes(sizes: Sizes) -> Sizes | None:
    """Another valid set, with a different width, head count, head size and length.

    Example:
        >>> other_sizes(Sizes({"width": 32, "heads": 4, "length": 16})).values
        {'width': 48, 'heads': 3, 'length': 24}
    """
    return next(iter(size_sets(sizes)), None)


def size_sets(sizes: Sizes, hints: bool = False) -> list[Sizes]:
    """Other valid sets; with ``hints``, to try for a block not built at its file's."""
    v = sizes.values
    C, nh, kv = v.get("width"), v.get("heads"), v.get("kv_heads")
    group = nh // kv if nh and kv and nh % kv == 0 else 1
    found = []
    for C2, nh2 in _HINTS if hints else _OTHERS:
        if C is None or (C2 == C and (nh is None or nh2 == nh)) or nh2 % group:
            continue
        if not hints and (C2 == C or (nh is not None and (nh2 == nh or C2 // nh2 == C // nh))):
            continue
        if nh is None and C2 % 12:  # heads fixed inside the block: a width many counts divide
            continue
        per_head = nh2 if nh is not None else C // v.get("head_size", C)
        length = 16 if v.get("length") != 16 else 24
        every = {"width": C2, "heads": nh2, "kv_heads": nh2 // group, "head_size": C2 // per_head}
        values = {k: x for k, x in {**every, "length": length}.items() if k in v}
        found.append(Sizes(values, {k: "the checker" for k in values}))
    return found


def names(sizes: Sizes) -> dict[str, int]:
    """Every name of every kind ``sizes`` has, with its value.

    Example:
        >>> names(Sizes({"heads": 2}))["n_head"], names(Sizes({"heads": 2}))["num_heads"]
        (2, 2)
    """
    return {n: value for kind, value in sizes.values.items() for n in KINDS[kind]}


def patch_globals(factory: object, sizes: Mapping[str, int]) -> Callable[[], None]:
    """Set ``factory``'s module's globals (``n_embd``) to ``sizes`` by name; returns the undo."""
    module = inspect.getmodule(factory)
    if module is None:
        return lambda: None
    before = {n: v for n, v in vars(module).items() if n in sizes and number(v) and sizes[n] != v}
    vars(module).update({n: sizes[n] for n in before})
    return lambda: vars(module).update(before)


def not_other(why: str) -> str:
    """The note of a block not checked at other sizes: not a failure.

    Example:
        >>> print(not_other("it takes a width of 64, not 48"))
        checked at the file's sizes only: at other sizes it takes a width of 64, not 48 (a size fixed in the code?)
    """
    return f"checked at the file's sizes only: at other sizes {why} (a size fixed in the code?)"


def combine(first: CheckReport, second: CheckReport | str, at: str, other: str) -> CheckReport:
    """One report of the checks at the file's sizes (``at``) and others (``second``, or why it
    did not run): the file's sizes decide, unless only the other sizes fail."""
    if isinstance(second, str) or first.verdict == "FAIL" or second.verdict != "FAIL":
        if not isinstance(second, str):
            said = {"PASS": "PASS", "FAIL": "FAIL", "UNVERIFIED": "not compared"}[second.verdict]
            second = f"checked again at {other}: {said}"
        return dataclasses.replace(first, notes=[*first.notes, *([second] if second else [])])
    failed = [f for f in second.findings if not f.passed]
    why = "; ".join(f"{f.name}: {f.message}" for f in failed[:2]) or ", ".join(second.diagnosis)
    finding = Finding("other sizes", False, f"{first.verdict} at {at}; at {other}: FAIL ({why})")
    notes = [*first.notes, *(n for n in second.notes if n not in first.notes)]
    findings = [*first.findings, finding]  # the rest is the other sizes' report's
    return dataclasses.replace(
        second, target=first.target, findings=findings, notes=notes, verify=""
    )
