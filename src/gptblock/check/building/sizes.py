"""The sizes a block is checked at (one table of their kinds, ``KINDS``): the file's own
(``file_sizes``), other valid sets (``size_sets``) and the arguments that build it (``plan``)."""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
import sys
import types
from collections import ChainMap
from collections.abc import Callable, Collection, Mapping
from typing import Any, cast

from ..serve.script import SKIPPED, set_settings
from .configs import (
    config_defaults,
    config_fields,
    config_name,
    dataclass_config,
    namespace,
    number,
    parameters,
    replaced,
    settings_module,
)  # fmt: skip

__all__ = [
    "DROPOUTS", "KINDS", "Kind", "Plan", "config_class", "file_sizes", "kind_of", "names",
    "patch_globals", "plan", "settings", "size_sets",
]  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Kind:
    """A kind of size: its names (the first ``common`` are common arguments), its ``value`` where
    the file gives none; ``kind_of`` knows it by ``also``, ``parts`` (all) or ``words`` (one)."""

    names: tuple[str, ...]
    value: int | None = None
    common: int = 0
    short: str = ""
    guess: tuple[str, ...] = ()
    parts: tuple[tuple[str, ...], ...] = ()
    words: tuple[str, ...] = ()
    also: tuple[str, ...] = ()


# ``dim`` is a width only as an argument or a setting: ``nn.Softmax`` has a ``.dim``; ``kind_of``
# knows no width: a width is found by value, its multiples too
KINDS: dict[str, Kind] = {  # in a label's order
    "width": Kind(("n_embd", "n_embed", "d_model", "embed_dim", "hidden_size", "dim", "d",
                   "emb_dim"), 32, 3, "C",
                  ("embd", "d_model", "dim", "hidden", "width", "embed", "channels")),
    "heads": Kind(("n_head", "n_heads", "nhead", "num_heads", "num_attention_heads", "heads"), 4,
                  4, "nh", ("head",), (("head",),)),
    "kv_heads": Kind(("n_kv_head", "n_kv_heads", "num_kv_heads", "num_key_value_heads"),
                     short="kv heads", parts=(("head", "group"), ("kv", "key", "query"))),
    "head_size": Kind(("head_size", "head_dim", "d_head", "d_k", "d_v", "dim_head"), short="hs",
                      parts=(("head",), ("dim", "size", "_d_")),
                      also=("d_kv", "dk", "dv", "kv_channels")),
    "length": Kind(("block_size", "max_len", "context_length", "max_seq_len", "n_ctx", "seq_len"),
                   16, 1, "T max", ("block", "ctx", "len", "seq", "position", "context", "window"),
                   (("block_size", "len", "ctx", "context", "seq", "position", "max_t"),),
                   ("pos", "tokens", "t")),
}  # fmt: skip
# not a size, whatever else the name says
_OTHER = Kind((), parts=(("layer", "vocab", "ratio", "mult", "factor", "expansion", "window",
              "seed", "batch", "rotary", "theta", "depth", "bucket", "stride", "kernel"),),
              words=("id", "idx", "index", "base", "mtp", "medusa"))  # fmt: skip
_NUM = re.compile(r"^(num|number_of)_")  # NUM_EMBD = 128 is an n_embd too
DROPOUTS = ("dropout", "p_drop", "drop", "dropout_rate", "attn_pdrop", "pdrop")
LARGEST_IMPLIED = {"width": 256, "length": 1024}  # above: built smaller, the same head count
_OTHERS = ((48, 3), (48, 6), (24, 2), (32, 2), (40, 5), (64, 8), (24, 6))  # (C, nh): hs 16, 8...
_HINTS = (*_OTHERS, (32, 4), (64, 4), (128, 4), (128, 8), (256, 8), (384, 6), (512, 8), (768, 12))


def settings(
    factory: object, given: Collection[str] = ()
) -> tuple[str, dict[str, int], dict[str, object]]:
    """The file name, the numbers (the lecture's ``n_embd = 64``) of ``factory``'s module, and its
    config objects (``model_config = SimpleNamespace(n_embd=384)``) that ``factory``'s code reads,
    or the module's classes and functions it reads do; where ``factory`` takes a config nobody
    gave (not in ``given``), any that holds a head count and another size too (``Block(cfg)``
    and the file's ``GPT_CONFIG_124M``)."""
    module = inspect.getmodule(factory)
    if module is None:
        return "", {}, {}
    # what the code reads, in each of the learner's files it reaches (a class imported from a
    # sibling file that reads ``hp.n_embd``: s83 unseen set), by name: the first binding
    own, done, seen = vars(module), list[object](), dict[str, Any]()
    todo = [(factory, own)]
    while todo:
        obj, where = todo.pop()
        done.append(obj)
        members = vars(obj).values() if isinstance(obj, type) else [obj]
        codes = [getattr(getattr(f, "__func__", f), "__code__", 0) for f in members]
        read = set[str]()
        while codes:
            if inspect.iscode(code := codes.pop()):
                read |= set(code.co_names)
                codes += code.co_consts
        seen |= {n: where[n] for n in read if n in where and n not in seen}
        homes = {n: sys.modules.get(getattr(v, "__module__", None) or "") for n, v in seen.items()}
        todo += [(v, vars(homes[n])) for n, v in seen.items() if callable(v)
                 and v not in done + [t for t, _ in todo]
                 and (homes[n] is module or settings_module(homes[n]))]  # fmt: skip
    plain = (dict, types.SimpleNamespace)
    configs = {n: v for n, v in seen.items() if isinstance(v, plain) or namespace(v)
               or dataclasses.is_dataclass(type(v)) or (settings_module(v) and _sized(v))}  # fmt: skip
    params = parameters(factory) if callable(factory) else []
    if any(config_name(p.name, cast(Any, factory)) and p.name not in given for p in params):
        configs |= {n: v for n, v in own.items() if _sized(v) and not namespace(v)}
    file = getattr(module, "__file__", None)
    numbers = {n: v for n, x in own.items() if (v := number(x))}
    return (os.path.basename(file) if file else module.__name__), numbers, configs


def config_class(factory: Callable[..., Any], param: inspect.Parameter) -> type | None:
    """``param``'s annotation if a dataclass or a class of the block's own file; for a config
    parameter without one (or a Protocol), the file's dataclass with the most size fields."""
    own = vars(inspect.getmodule(factory) or types)
    cls = own.get(param.annotation) if isinstance(param.annotation, str) else param.annotation
    if getattr(cls, "_is_protocol", False) or (
        cls is param.empty and config_name(param.name, factory)
    ):
        wanted = set(getattr(cls, "__annotations__", ()))  # a Protocol's fields
        found = [(sum(kind_of(n) not in (None, "other") for n in names), c) for c in own.values()
                 if isinstance(c, type) and c.__module__ == own["__name__"]
                 and wanted <= (names := set(config_defaults(c)))]  # fmt: skip
        return max((f for f in found if f[0] or wanted), key=lambda f: f[0], default=(0, None))[1]
    ours = isinstance(cls, type) and cls.__module__ == getattr(factory, "__module__", None)
    return cls if ours or (isinstance(cls, type) and dataclass_config(cls)) else None


def file_sizes(
    factory: Callable[..., Any], given: Mapping[str, object]
) -> tuple[dict[str, int], list[str], set[str]]:
    """The sizes the file implies, by the first of ``places`` that names them, else the
    checker's, the notes of where they came from, and the kinds the file chose."""
    params = parameters(factory)
    defaults = {p.name: p.default for p in params if p.default is not p.empty}
    classes = [config_class(factory, p) for p in params if p.name not in given]
    fields = {n: v for c in classes for n, v in config_defaults(c).items()}
    file, numbers, configs = settings(factory, given)  # model_config.n_embd: after the numbers
    module = ChainMap(
        dict[str, object](numbers), *(config_fields(c) or {} for c in configs.values())
    )
    used = {  # NUM_EMBD = 64: an n_embd; num_attention_heads: a name of its own too (s87)
        m for n in [*(p.name for p in params), *fields, *module, *given]
        for m in (n.lower(), _NUM.sub("n_", n.lower()))
    }  # fmt: skip
    if any(config_name(p.name, factory) and p.name not in given for p in params):
        used |= {"n_embd", "n_head", "block_size"}  # a config the checker builds has them all
    places = (
        ("--arg", given),
        ("the constructor's defaults", defaults),
        ("the config's defaults", fields),
        (f"{file}'s module settings", module),
    )
    values: dict[str, int] = {}
    named: dict[str, list[str]] = {}  # place -> the sizes it gives, n_embd=64
    chosen: set[str] = set()
    for kind, k in KINDS.items():
        if not used & set(k.names):
            continue
        for source, where in places:
            lower = {k: m for m in where for k in (m.lower(), _NUM.sub("n_", m.lower()))}
            n, value = next(
                ((m, v) for n in k.names if (m := lower.get(n)) and (v := number(where[m]))),
                ("", None),
            )
            if value is not None and (kind != "width" or value >= 8 or source == "--arg"):
                values[kind] = value  # (a width of 1 is a softmax's dim)
                named.setdefault(source, []).append(f"{n}={value}")
                chosen |= {kind} if source != "--arg" else set()
                break
        else:  # the checker's; a head size C / nh
            C, nh = values.get("width"), values.get("heads")
            value = C // nh if kind == "head_size" and C and nh else k.value
            if value is not None:
                values[kind] = value
    said = "; ".join(
        f"{', '.join(v)} from {source}" for source, v in named.items() if source != "--arg"
    )
    notes = [f"built at the file's sizes: {said}"] * bool(said)
    if skipped := SKIPPED.get(getattr(inspect.getmodule(factory), "__file__", None) or ""):
        notes.append(
            f"not run: {file}'s top-level {skipped} (nothing the block needs is defined "
            "or changed there: a script's run when imported)"
        )
    return values, notes, chosen


def size_sets(v: Mapping[str, int], hints: bool = False) -> list[dict[str, int]]:
    """Other valid sets of sizes (``KINDS``' keys), each with a different width, head count,
    head size and length; with ``hints``, more, to try for a block not built at its file's."""
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
        # ungrouped at the file's sizes: grouped here, where keys repeated wrongly show
        kv2 = nh2 // group if group > 1 or hints else nh2 // 2 if nh2 % 2 == 0 else 1
        every = {"width": C2, "heads": nh2, "kv_heads": kv2, "head_size": C2 // per_head}
        found.append({k: x for k, x in {**every, "length": length}.items() if k in v})
    # where the file's are ungrouped, first those with two key/value heads or more in groups
    return sorted(found, key=lambda s: group == 1 and not 1 < s.get("kv_heads", 0) < s["heads"])


def names(values: Mapping[str, int]) -> dict[str, int]:
    return {n: value for kind, value in values.items() for n in KINDS[kind].names}


def patch_globals(
    factory: object, sizes: Mapping[str, object]
) -> tuple[dict[str, object], Callable[[], None]]:
    """Set ``factory``'s module's numbers (``n_embd``) and configs (``plan``'s) to ``sizes`` by
    name: those set, the undo."""
    module = inspect.getmodule(factory)
    if module is None:
        return {}, lambda: None

    def key(n: str) -> str:  # N_EMBD = 64 is an n_embd, NUM_HEADS an n_heads (s87)
        return next((k for k in (n, n.lower(), _NUM.sub("n_", n.lower())) if k in sizes), n)

    before = {
        n: v for n, v in vars(module).items()
        if (k := key(n)) in sizes and sizes[k] != v and (number(v) or not isinstance(sizes[k], int))
    }  # fmt: skip
    inside = [  # "hyperparameters.n_embd": set in that settings module, imported by the files
        key for key in sizes if "." in key
        and settings_module(m := sys.modules.get(key.partition(".")[0]))
        and hasattr(m, key.partition(".")[2])
    ]  # fmt: skip
    changed = {**{n: sizes[key(n)] for n in before}, **{k: sizes[k] for k in inside}}
    return changed, set_settings(vars(module), changed)


def kind_of(name: str) -> str | None:
    """What a name says its number is: a kind, ``other`` (not a size), None (the value says)."""
    lower = name.lower()
    words, padded = set(lower.split("_")), f"_{lower}_"  # _d_: d_head's, not head_count's
    for kind in ("other", "head_size", "kv_heads", "heads", "length"):  # the first that says
        k = KINDS.get(kind, _OTHER)
        if (
            lower in k.names + k.also
            or (k.parts and all(any(w in padded for w in part) for part in k.parts))
            or words & set(k.words)
        ):
            return kind
    return None


def _smaller(m: Mapping[str, int], keep: Collection[int]) -> dict[str, int] | None:
    """Sizes for a block over ``LARGEST_IMPLIED`` (its mistakes show at any size): 16 channels a
    head (4 over 16 heads), the same head counts, a length of 256, an MLP's hidden width in
    proportion, at most 8 times the width; --arg's (``keep``) kept."""
    out, C, L, hs = dict(m), m["width"], m.get("length", 0), m.get("head_size")
    nh = m.get("heads") or (C // hs if hs and C % hs == 0 else 0)
    if C > LARGEST_IMPLIED["width"] and C not in keep:
        small = 16 if nh <= 16 else 4
        out.update({"width": nh * small, "head_size": small} if nh else {"width": 96})
    if L > LARGEST_IMPLIED["length"] and L not in keep:
        out["length"] = 256
    if (H := m.get("hidden")) and H not in keep and (out["width"] != C or H > 8 * C):
        out["hidden"] = _hidden(H, C, out["width"], 8)  # (s87: 11008 read at width 64: 5 GB)
    return out if out != m else None


def _hidden(H: int, C: int, new: int, most: int = 0) -> int:
    """An MLP's hidden width ``H`` at width ``new`` (``C`` before): in proportion (even)."""
    scaled = max(2, 2 * round(H * new / C / 2))
    return min(scaled, most * new) if most else scaled


def _mlp_name(name: str) -> bool:  # d_ff, intermediate_size, hidden_dim, ffn_dim, n_inner
    words = set(name.lower().split("_"))
    return kind_of(name) is None and bool(words & {"ff", "ffn", "intermediate", "hidden", "inner",
                                                   "mlp", "feedforward", "dff"})  # fmt: skip


@dataclasses.dataclass
class Plan:
    """The arguments, width, module settings and label of the other sizes."""

    args: dict[str, object]
    width: int
    settings: dict[str, object]
    label: str


def _sized(value: object) -> bool:
    """Whether ``value`` is a config that gives a block's head count and another size."""
    numbers = [n for n, v in (config_fields(value) or {}).items() if number(v)]
    return len(numbers) > 1 and "heads" in map(kind_of, numbers)


def plan(
    factory: Callable[..., Any], args: Mapping[str, object], C: int,
    keep: Collection[int] | None = None,
) -> Plan | None:  # fmt: skip
    """The arguments that build ``factory`` at other sizes (with ``keep``: smaller ones,
    ``_smaller``), from ``args`` and the width ``C`` it was built at, found by value, whatever
    their names (of the numbers it was built with, C is the width, 2C..8C a hidden width, C / nh
    the head size; a name says what a value cannot); None when no number is a size."""
    top = {**{p.name: p.default for p in parameters(factory) if p.default is not p.empty}, **args}
    configs = {n: f for n, v in top.items() if (f := config_fields(v)) is not None}
    _, found, objects = settings(factory, args)
    # a module setting named like a constructor argument takes that argument's value (s94)
    globals_ = {n: top.get(n, top.get(n.lower(), v)) for n, v in found.items()}
    held = {n: f for n, v in objects.items() if (f := config_fields(v)) is not None}
    places = [top, globals_, *configs.values(), *held.values()]
    leaves = [(kind_of(n), v) for place in places for n, x in place.items() if (v := number(x))]
    nh = next((v for k, v in leaves if k == "heads" and C % v == 0), None)
    kv = next((v for k, v in leaves if k == "kv_heads" and nh and nh % v == 0), None) or next(
        (v for k, v in leaves if k == "heads" and nh and v < nh and nh % v == 0), None
    )  # the fewer of two head counts: key/value heads
    hs = next((v for k, v in leaves if k == "head_size"), C // nh if nh else None)
    L = next((v for k, v in leaves if k == "length"), None)
    H = next((v for place in places for n, x in place.items() if (v := number(x)) and v > C
              and (v % C or v > 8 * C) and _mlp_name(n)), None)  # fmt: skip # (2C..8C: by value)
    measured = {"width": C, "heads": nh, "kv_heads": kv, "head_size": hs, "length": L, "hidden": H}
    sized = {k: v for k, v in measured.items() if v is not None}
    other = _smaller(sized, keep) if keep is not None else next(iter(size_sets(sized)), None)
    if other is None:
        return None
    if H and "hidden" not in other:
        other["hidden"] = _hidden(H, C, other["width"])
    many = [f"{m}C" for m in range(2, 9)]  # a hidden width, a multiple of the width
    measured.update({m: int(m[0]) * C for m in many})
    new = {**other, **{m: int(m[0]) * other["width"] for m in many}}
    said: dict[str, tuple[str, int]] = {}  # each name changed: its kind, its new value

    def changes(numbers: Mapping[str, object]) -> dict[str, int]:
        out = {}
        for name, x in numbers.items():
            if (v := number(x)) is None or (kind := kind_of(name)) == "other":
                continue
            if kind in ("heads", "kv_heads"):  # gpt-fast's n_local_heads: kv heads by value
                kind = "heads" if kind == "heads" and v == nh else "kv_heads"
            kind = kind or next(
                (k for k in ("width", *many, "head_size", "hidden") if measured[k] == v), None
            )
            if kind is not None and v == measured[kind] and kind in new:
                out[name] = new[kind]
                said.update({name: (kind, new[kind])} if new[kind] != v else {})
        return out

    top_changes = changes(top)
    config_changes = {n: c for n, fields in configs.items() if (c := changes(fields))}
    patched: dict[str, object] = {**changes(globals_)}
    for n, f in held.items():  # a module's settings changed in it: "hp.n_embd" (its readers')
        if c := changes(f):
            whole = not settings_module(objects[n])
            patched.update(
                {n: replaced(objects[n], c)}
                if whole
                else {f"{cast(types.ModuleType, objects[n]).__name__}.{k}": v for k, v in c.items()}
            )
    if not said:
        return None
    out = {**args, **top_changes, **{n: replaced(top[n], c) for n, c in config_changes.items()}}
    # the label, hid_dim=48 (C), n_heads=3, pf_dim=192 (4C): the kind said where the name does not
    order = [*[*KINDS][:4], *many, "hidden", "length"]  # a multiple after the head size
    shown = []
    for n, (kind, value) in sorted(said.items(), key=lambda s: order.index(s[1][0])):
        k = KINDS.get(kind)
        why = "" if k and n in k.names else f" ({k.short if k else kind})"
        shown.append(f"{n}={value!r}{why}")
    return Plan(out, other["width"], patched, ", ".join(shown))
