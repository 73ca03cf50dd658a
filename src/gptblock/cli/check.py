"""``gptblock check``: find the mistakes in a transformer block, and say how to fix them.

Argument parsing and printing only: ``gptblock.check.target`` loads the target and parses
``--arg``, ``gptblock.check.check_block`` checks it.
"""

from __future__ import annotations

import argparse
import json

from ..check import COMMON_ARGUMENTS, check_block, load_target, own_blocks, parse_argument
from ..errors import UserValueError


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
    kwargs = dict(parse_argument(a) for a in args.arg)
    if args.target is None:
        if kwargs:
            raise UserValueError("--arg needs a TARGET; gptblock's own blocks use the defaults")
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
