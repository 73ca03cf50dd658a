"""What a config object is (a dataclass, a dict, a namespace, a class of plain values) and how
to copy one with other sizes: ``sizes`` reads and changes the sizes a block's configs hold."""

from __future__ import annotations

import copy
import dataclasses
import dis
import inspect
import sys
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard, cast

import torch

from ..serve.loop import signature

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = [
    "config_defaults", "config_fields", "config_name", "dataclass_config", "namespace", "number",
    "parameters", "replaced", "settings_module",
]  # fmt: skip

# the names of an argument that is a config object (``Block(config)``)
_CONFIG_NAMES = ("config", "cfg", "conf", "args", "hparams", "params", "settings", "opt", "opts")
# attributes a parameter read as ``x.name`` may have without being a config (``get`` is a dict's)
_TENSOR_OR_MODULE = frozenset({*dir(torch.Tensor), *dir(torch.nn.Module)} - {"get"})
_CONFIG_WORDS = ("config", "cfg", "conf", "args", "params", "settings", "options")  # a class's


def number(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def config_defaults(cls: object) -> dict[str, object]:
    """A config class's defaults: a dataclass's fields', else its own public plain values (the
    learner's ``class Config: n_embd = 64``) and its own ``__init__``'s parameters, ``empty``
    where required (minGPT's ``GPTConfig(vocab_size, block_size, **kwargs)``)."""
    if dataclass_config(cls):
        return {f.name: f.default for f in dataclasses.fields(cls)}
    plain = (int, float, str, bool, type(None))
    public = vars(cls).items() if isinstance(cls, type) else ()
    found: dict[str, object] = {
        n: v for n, v in public if not n.startswith("_") and isinstance(v, plain)
    }
    if not isinstance(cls, type) or not any(w in cls.__name__.lower() for w in _CONFIG_WORDS):
        return found  # (its __init__: a config's, not a KVCache(max_seq_len, ...)'s)
    if "__init__" in vars(cls) and not hasattr(cls, "forward"):
        found |= {p.name: p.default for p in parameters(cls)}
    return found


def dataclass_config(obj: object) -> TypeGuard[DataclassInstance]:
    """A dataclass (or one of them) whose ``__init__`` takes its fields: not one with its own (a
    ``transformers.PretrainedConfig`` subclass, a dataclass from transformers 5: s71 unseen set)
    nor one without fields, whose values are plain class values (s84 unseen set)."""
    cls = obj if isinstance(obj, type) else type(obj)
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else None
    return bool(fields) and {p.name for p in parameters(cls)} <= cast(set[str], fields)


def config_name(name: str, factory: Callable[..., Any] | None = None) -> bool:
    """A parameter named as a config object: ``config``, ``cfg``, and such a word after another
    (``model_config``, ``gpt_params``: s70 unseen set), or one ``factory`` reads as one."""
    low = name.lower()
    named = low in _CONFIG_NAMES or low.rpartition("_")[2] in _CONFIG_NAMES
    return named or (factory is not None and _read_as_config(factory, name))


def _read_as_config(factory: Callable[..., Any], name: str) -> bool:
    """Whether ``factory`` (a class: its ``__init__``) reads its parameter ``name`` as a config:
    ``c["d_model"]``, ``c.get(...)`` or an attribute no tensor or module has (s96 unseen set:
    ``Block(c)``, read as ``c["d_model"]``)."""
    init = getattr(factory, "__init__", None) if isinstance(factory, type) else factory
    codes = [getattr(inspect.unwrap(init), "__code__", None)] if callable(init) else []
    while codes:
        if not inspect.iscode(code := codes.pop()):
            continue
        codes += code.co_consts  # a comprehension's or a nested function's, reading it too
        steps = list(dis.get_instructions(code))
        for a, b, c in zip(steps[:-1], steps[1:], [*steps[2:], None], strict=True):
            if a.opname not in ("LOAD_FAST", "LOAD_DEREF") or a.argval != name:
                continue
            key = b.opname == "LOAD_CONST" and isinstance(b.argval, str)
            if key and c is not None and (c.opname == "BINARY_SUBSCR" or c.argrepr == "[]"):
                return True
            if b.opname in ("LOAD_ATTR", "LOAD_METHOD") and b.argval not in _TENSOR_OR_MODULE:
                return True
    return False


def parameters(factory: Callable[..., Any]) -> list[inspect.Parameter]:
    """The parameters that take one value each."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p for p in signature(factory).values() if p.kind in kinds]


def namespace(value: object) -> bool:
    """A class of plain values only, read as ``Config.n_embd`` (s76 unseen set)."""
    return isinstance(value, type) and value.__bases__ == (object,) and not any(
        callable(v) or isinstance(v, (classmethod, staticmethod, property))
        for k, v in vars(value).items() if k[:2] != "__"
    )  # fmt: skip


def settings_module(value: object) -> bool:
    """A module of the learner's own, not installed nor gptblock's (installed for editing)
    (``import hyperparameters as hp`` read as ``hp.n_embd``: s83 unseen set)."""
    if not isinstance(value, types.ModuleType) or value.__name__.split(".")[0] == "gptblock":
        return False
    file, homes = getattr(value, "__file__", None), {sys.prefix, sys.base_prefix, sys.exec_prefix}
    return bool(file) and not any(Path(cast(str, file)).is_relative_to(h) for h in homes)


def config_fields(value: object) -> dict[str, object] | None:
    """A config object's fields, None for anything else (a module, a tensor, a number...)."""
    if isinstance(value, dict):
        return {k: v for k, v in value.items() if isinstance(k, str)}
    if namespace(value):
        return {k: v for k, v in vars(value).items() if k[0] != "_"}
    if settings_module(value):
        plain = (int, float, str, bool)
        return {k: v for k, v in vars(value).items() if k[0] != "_" and isinstance(v, plain)}
    if dataclass_config(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name, None) for f in dataclasses.fields(value)}
    library = type(value).__module__.split(".")[0] in ("torch", "builtins", "numpy")
    if (library and not isinstance(value, types.SimpleNamespace)) or callable(value):
        return None
    try:
        return {k: v for k, v in vars(value).items() if not k.startswith("_")}
    except TypeError:  # __slots__
        return None


def replaced(config: object, changes: Mapping[str, int]) -> object:
    """A copy of ``config`` with ``changes`` (a dataclass's ``__post_init__`` derives from them)."""
    if isinstance(config, dict):
        return {**config, **changes}
    if namespace(config):  # a class that is sent as its fields
        return types.SimpleNamespace(**{**(config_fields(config) or {}), **changes})
    if dataclass_config(config) and not isinstance(config, type):
        init = {f.name for f in dataclasses.fields(config) if f.init}
        new: object = dataclasses.replace(config, **{k: v for k, v in changes.items() if k in init})
    else:
        new = copy.copy(config)
    for k, v in changes.items():
        object.__setattr__(new, k, v)  # also a frozen one: the value is the derived one
    return new
