"""The runner: the process whose answers decide the verdict (``Held.answer``), forked from a copy
of this folder as the package ``serve``, importing nothing of gptblock; it builds the block from
the builder's ``recipe`` (``to_data``) and calls it as the builder does (``forward_arguments``).
docs/checker.md, "The block cannot break the checker" and "What the block can still tell"."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import os
import pickle
import sys
import traceback
import types
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from . import loop, script
from .cache import drive_cache
from .calls import forward_arguments, learner_line, size_error
from .loop import CAUGHT, Message, UserValueError, one_line, record
from .script import SKIPPED, Cells, as_script, definitions, package_of
from .subject import Subject, cut_graphs

__all__ = ["DROPOUT_NAMES", "Held", "build", "load", "load_module", "main", "to_data"]

Tensor = torch.Tensor
DROPOUT_NAMES = ("p", "dropout", "dropout_p", "attn_pdrop", "resid_pdrop", "drop", "pdrop",
                 "dropout_rate", "drop_prob", "attn_dropout", "resid_dropout", "dropout_prob")  # fmt: skip


class Held:
    """A process's answers: ``build`` makes ``module``; the rest ask its copy (``subject``)."""

    subject: Subject
    module: nn.Module
    refused: tuple[type[BaseException], ...] = (UserValueError,)  # said as the user's error

    def __init__(self, request: Mapping[str, Any]) -> None:
        self.targets: list[str | bytes] = list(request["targets"])
        self.target: object = None
        self.undo: Callable[[], None] = lambda: None
        self.C, self.T, self.longest = 0, 0, 0

    def load(self, target: str | bytes) -> object:
        as_script(target)
        return load(target)

    def build(self, args: Mapping[str, Any]) -> Message:
        self.module, self.undo = build(self.target, args["recipe"])
        return {}, {}

    def answer(self, op: str, args: Mapping[str, Any], tensors: Mapping[str, Tensor]) -> Message:
        if op == "load":
            try:
                self.target = self.load(self.targets[int(args["index"])])
            except self.refused:
                raise
            except CAUGHT as why:
                raise UserValueError(f"cannot load it in a fresh process: {one_line(why)}") from why
            return {}, {}
        if op == "build":
            self.undo()
            self.undo = lambda: None
            return self.build(args)
        if op == "copy":  # the checker's copy (float64, eval), and what its first call raised
            if "C" in args:
                self.C, self.T, self.longest = int(args["C"]), int(args["T"]), int(args["longest"])
            s = self.subject = Subject(self.module, self.C, self.T, self.longest)
            e = s.failure
            failed = "" if e is None else one_line(e)
            raised = "" if e is None or size_error(e) else failed + learner_line(e, type(s.module))
            told = {"dtype": str(s.dtype).removeprefix("torch."), "note": s.note, "failed": failed}
            told["float64"] = s.fell_back  # what made it check in float32
            return {**told, "raised": raised}, {}  # (a size error: the shape probe's to tell)
        s = self.subject
        x = tensors["x"].to(s.device) if "x" in tensors else torch.empty(0)
        if op == "forward":
            y = s(x, seeded=bool(args["seeded"]), train=bool(args.get("train", False)))
            same = y.device == s.device  # (else its values stay here: it says its shape)
            meta = {"shape": list(y.shape), "dtype": str(y.dtype).removeprefix("torch.")}
            return {**meta, "device": "same" if same else str(y.device)}, {"y": y} if same else {}
        if op == "grads":
            got = s.grads(x, tensors["weights"].to(s.device), inputs=bool(args["inputs"]))
            found = {f"g{i}": g for i, g in enumerate(got.grads) if g is not None}
            found.update({"input": got.input} if got.input is not None else {})
            said = {"failed": got.failed, "message": got.message, "kept": got.kept}
            return {"names": got.names, **said}, found
        if op == "parameters":
            values = {n: p.detach() for n, p in s.module.named_parameters() if n not in s.aside}
            return {"names": list(values)}, values
        if op == "set":
            own = dict(s.module.named_parameters())
            with torch.no_grad():
                for name, value in tensors.items():
                    p = own.get(name)
                    if p is None or p.shape != value.shape:
                        raise ValueError(f"no parameter {name!r} of shape {tuple(value.shape)}")
                    p.copy_(value.to(device=p.device, dtype=p.dtype))
            return {}, {}
        if op == "dropout_off":  # every dropout probability 0, else dropout off where it runs
            copies = [m for m in (s.module, s.float32) if m is not None]  # float32's too
            for m in (m for copy in copies for m in copy.modules()):
                for name, value in vars(m).items():
                    if name in DROPOUT_NAMES and isinstance(value, float) and 0.0 < value < 1.0:
                        setattr(m, name, 0.0)
            how, x = "", s.input(s.T, s.T, s.C)  # how, if then its eval outputs are the same
            for switched_off in (False, True):  # (a probability it cannot reach: NoDropout)
                s.no_dropout = switched_off
                with contextlib.suppress(*CAUGHT), s.own_rng():
                    if torch.equal(s(x, seeded=False), s(x, seeded=False)):
                        how = "switched off" if switched_off else "with its probability set to 0"
                        break
            s.no_dropout = how == "switched off"
            return {"how": how}, {}
        if op == "record":  # (this module's ``record``: a forgery test swaps it)
            return record(s.module, x, no_dropout=s.no_dropout)
        if op == "cache":  # by its own forward, whose (y, cache) tuple the drive reads
            cut_graphs(s.module)  # (a tensor with a graph cannot be deep-copied)
            taken = s.module.__dict__.pop("forward", None)  # (``subject._take``'s)
            drove = drive_cache(s.module, x, no_dropout=s.no_dropout)  # (it catches the block's)
            s.module.__dict__.update({"forward": taken} if taken is not None else {})
            return drove
        raise RuntimeError(f"unknown request {op!r}")


def to_data(value: object, home: object) -> object:
    """A value as JSON (``loop.encode``), a config as its class and fields, a function pickled."""

    def other(value: object) -> object:
        cls = type(value)
        if callable(value) or isinstance(value, types.ModuleType):  # by name: F.gelu, nn.GELU
            named = getattr(value, "__qualname__", "<locals>")
            if getattr(value, "__module__", 0) == getattr(home, "__name__", 1) and "<" not in named:
                return {"named": named}  # the file's own (s103: a config's attn_func default)
            with contextlib.suppress(*CAUGHT):
                return {"pickle": pickle.dumps(value).hex()}
        elif hasattr(value, "__dict__") and "<locals>" not in cls.__qualname__:
            where = "" if cls.__module__ == getattr(home, "__name__", None) else cls.__module__
            kept = dict(vars(value))
            for name, field in vars(value).items():
                try:
                    to_data(field, home)
                except ValueError:  # (PretrainedConfig's id2label, int keys): its own default
                    if not any(p.kind is p.VAR_KEYWORD for p in loop.signature(cls).values()):
                        raise
                    del kept[name]
            return {"object": cls.__qualname__, "module": where, "fields": to_data(kept, home)}
        raise ValueError(f"a {cls.__name__}, which cannot be sent as data")

    return loop.encode(value, other)


def _made(home: object, data: dict[str, Any]) -> object:
    """A config as its class called with its fields, else made without calling it."""
    if "named" in data:  # the file's own function or class
        return functools.reduce(getattr, str(data["named"]).split("."), home)
    if "pickle" in data:
        return pickle.loads(bytes.fromhex(data["pickle"]))
    where = importlib.import_module(data["module"]) if data["module"] else home
    cls: Any = functools.reduce(getattr, data["object"].split("."), where)
    fields = loop.decode(data["fields"], functools.partial(_made, home))
    own = isinstance(cls, type) and dataclasses.is_dataclass(cls)  # (sizes.dataclass_config)
    if own and set(loop.signature(cls)) <= {f.name for f in dataclasses.fields(cls)}:
        init = [f.name for f in dataclasses.fields(cls) if f.init and f.name in fields]
        return cls(**{n: fields[n] for n in init})
    try:
        return cls(**fields)
    except CAUGHT:
        made = cls.__new__(cls)
        made.__dict__.update(fields)
        return made


def load(target: str | bytes) -> object:
    """``FILE.py:NAME``, ``module:NAME``, or a pickled class, factory or module (the checker's)."""
    if isinstance(target, bytes):
        return pickle.loads(target)
    where, _, name = target.rpartition(":")
    return functools.reduce(getattr, name.split("."), load_module(where, needs=name))


def load_module(where: str, name_as: str = "", needs: str = "") -> Any:
    """A file runs as the module ``name_as``, else of its own name where free, else "learner",
    inside its package (``mygpt/model.py`` as ``mygpt.model``, after ``mygpt`` is imported, as
    ``import mygpt.model`` would: its relative imports work); with ``needs`` (the target's
    name), only what it needs of the top level (``definitions``). A script's folder goes first on
    ``sys.path`` (as ``python gpt.py`` has it), a package's root (``mygpt``'s folder, where
    ``import mygpt`` finds the package) before the file's own folder; the working directory goes
    last (as ``python -m`` has it: ``gptblock check mygpt.model:Block`` from the project)."""
    if not (where.endswith((".py", ".ipynb")) or "/" in where or "\\" in where):
        with _on_path([], [os.getcwd()]):
            return importlib.import_module(where)
    path = Path(where)
    free = path.stem.isidentifier() and path.stem not in {*sys.modules, *sys.stdlib_module_names}
    package = package_of(path)
    dotted = ".".join(f.name for f in reversed(package))
    own = name_as or (path.stem if free else "learner")
    name = f"{dotted}.{own}" if dotted else own
    folder = str(path.resolve().parent)
    first, last = ([str(package[-1].parent)], [folder]) if package else ([folder], [])
    cells = Cells(path) if path.suffix == ".ipynb" else None
    spec = importlib.util.spec_from_file_location(name, path.absolute(), loader=cells)
    if spec is None or spec.loader is None:
        raise UserValueError(f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    try:
        with _on_path(first, [*last, os.getcwd()]):
            if dotted:  # its ``__init__.py`` may import this very file: then that is the module
                sys.modules.pop(name, None)  # an earlier load's: the file is read as it is now
                importlib.import_module(dotted)
                if name in sys.modules:
                    return sys.modules[name]
            sys.modules[spec.name] = module  # dataclasses and pickling look the module up here
            code = definitions(path, needs) if needs else None
            try:
                if code is None:
                    spec.loader.exec_module(module)
                else:
                    exec(code, vars(module))
            except Exception:  # what the statements left out did, after all (a sys.path.append)
                if code is None:
                    raise
                SKIPPED.pop(str(path.absolute()), None)
                spec.loader.exec_module(module)  # the whole file, over what the part defined
    except BaseException:
        sys.modules.pop(spec.name, None)
        raise
    return module


@contextlib.contextmanager
def _on_path(first: list[str], last: list[str]) -> Iterator[None]:
    """``sys.path`` with ``first`` before and ``last`` after it while the learner's code runs."""
    last = [entry for entry in dict.fromkeys(last) if entry not in sys.path + first]
    sys.path[:0] = first
    sys.path += last
    try:
        yield
    finally:
        for entry in first + last:
            with contextlib.suppress(ValueError):  # the code took it out itself
                sys.path.remove(entry)


def build(target: object, recipe: Mapping[str, Any]) -> tuple[nn.Module, Callable[[], None]]:
    """The block built from ``recipe``, seeded as the builder's, and the undo of the module
    settings it set (kept set: ``forward`` may read them)."""
    if isinstance(target, nn.Module):
        return target, lambda: None
    home = sys.modules.get(getattr(target, "__module__", None) or "")
    own: dict[str, Any] = vars(home) if home else {}
    made = functools.partial(_made, home)
    settings = {n: loop.decode(v, made) for n, v in recipe["settings"].items()} if home else {}
    undo = script.set_settings(own, settings)
    name = getattr(target, "__qualname__", type(target).__name__)
    try:
        with loop.fixed_seed():
            module = target(**loop.decode(recipe["args"], made))  # type: ignore[operator]
        if not isinstance(module, nn.Module):
            raise TypeError(f"it returned a {type(module).__name__}")
    except CAUGHT as e:
        undo()
        raise UserValueError(f"cannot build {name} again in a fresh process: {one_line(e)}") from e
    forward_arguments(module)  # called as the builder calls it (said in the builder's note)
    return module, undo


def main(argv: list[str], start: Callable[[dict[str, Any]], Held] = Held) -> int:
    """Answer requests from fd ``argv[0]`` on fd ``argv[1]`` until it closes."""
    in_fd, out_fd = int(argv[0]), int(argv[1])
    for fd in (in_fd, out_fd):
        os.set_inheritable(fd, False)  # not passed on to processes the block starts
    reader = loop.Reader(in_fd)
    try:
        header, _ = reader.next()
    except EOFError:  # started early by a command that ended without a check
        return 0
    request = pickle.loads(bytes.fromhex(header["init"]))  # (from the checker)
    sys.path += [r for r in request.get("roots", ()) if r not in sys.path]  # a student's folder
    held = start(request)
    loop.send(out_fd, {"id": 0, "ok": {"ready": True}})
    torch.set_num_threads(1)  # tiny tensors: extra threads only add synchronisation
    while True:
        try:
            header, tensors = reader.next()
        except EOFError:
            return 0
        reply: dict[str, Any] = {"id": header.get("id")}
        found: dict[str, Tensor] = {}
        try:
            reply["ok"], found = held.answer(str(header.get("op")), header, tensors)
        except held.refused as e:
            reply.update(user_error=type(e).__name__, message=str(e))
        except CAUGHT as e:
            where = " ".join(w.strip() for w in traceback.format_exception(e)[-3:])
            at = learner_line(e, None) if header.get("op") == "forward" else ""  # its line
            reply.update(raised=one_line(e) + at, where=where)
        loop.send(out_fd, reply, found)
