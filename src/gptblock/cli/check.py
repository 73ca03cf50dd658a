"""``gptblock check``: find the mistakes in a transformer block, and say how to fix them."""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from ..check import COMMON_ARGUMENTS, check_block, own_blocks
from ..check.probes import one_line


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    defaults = ", ".join(f"{k}={v!r}" for k, v in COMMON_ARGUMENTS.items())
    p = sub.add_parser(
        "check",
        help="find the mistakes in a transformer block and say how to fix them",
        description=(
            "Probe a block mapping (B, T, C) to (B, T, C) (shape, causality, batch "
            "independence, eval determinism, residual stream, finite outputs, gradients) and, "
            "when its parameter names can be read, diagnose its mistakes by comparison with "
            "the reference. Exit code 0 when everything passes, 1 when a check fails, 2 when "
            "the target cannot be loaded or built."
        ),
        epilog=(
            "Constructor arguments the block takes but --arg does not give are filled with "
            f"small values: {defaults} (dropout > 0 so that dropout left on in eval shows up)."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "target",
        nargs="?",
        default=None,
        help="the block: FILE.py:NAME or package.module:NAME, NAME a class, a factory function "
        "or a module instance; without it, gptblock's own blocks are checked",
    )
    p.add_argument(
        "--arg",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a constructor argument, VALUE read as a Python literal (else as a string); repeat "
        "for more",
    )
    p.add_argument("--json", action="store_true", help="print the reports as JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    kwargs = dict(_parse_arg(a) for a in args.arg)
    if args.target is None:
        if kwargs:
            raise ValueError("--arg needs a TARGET; gptblock's own blocks use the defaults")
        targets = own_blocks()
    else:
        targets = [load_target(args.target)]
    reports = [check_block(t, **kwargs) for t in targets]
    passed = all(r.passed for r in reports)
    if args.json:
        print(json.dumps({"passed": passed, "reports": [r.to_dict() for r in reports]}, indent=2))
    else:
        print("\n\n".join(str(r) for r in reports))
        if len(reports) > 1:
            failed = sum(not r.passed for r in reports)
            print(f"\n{len(reports) - failed} of {len(reports)} blocks pass")
    return 0 if passed else 1


def _parse_arg(text: str) -> tuple[str, object]:
    name, sep, value = text.partition("=")
    if not sep or not name.isidentifier():
        raise ValueError(f"--arg expects NAME=VALUE with NAME an identifier, got {text!r}")
    try:
        return name, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return name, value  # not a literal: the string itself, e.g. activation=relu


def load_target(spec: str) -> Any:
    """The object ``FILE.py:NAME`` or ``package.module:NAME`` names (NAME may be dotted).

    Raises ValueError (or FileNotFoundError) with a one-line message, which the CLI prints
    before exiting with code 2.
    """
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise ValueError(f"TARGET must be FILE.py:NAME or package.module:NAME, got {spec!r}")
    if where.endswith(".py") or "/" in where or "\\" in where:
        module = _load_file(Path(where))
    else:
        try:
            module = importlib.import_module(where)
        except Exception as e:
            raise ValueError(f"cannot import {where}: {one_line(e)}") from e
    obj: Any = module
    for part in name.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{where} has no {name!r}")
        obj = getattr(obj, part)
    return obj


def _load_file(path: Path) -> ModuleType:
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    name = f"_gptblock_check_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up here
    sys.path.insert(0, str(path.resolve().parent))  # so the file can import its neighbours
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise ValueError(f"cannot load {path}: {one_line(e)}") from e
    finally:
        sys.path.remove(str(path.resolve().parent))
    return module
