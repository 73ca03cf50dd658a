"""``gptblock check``: find the mistakes in a transformer block, and say how to fix them.

Parsing and printing only: ``check_isolated`` runs the target in a child process that only
answers requests, so whatever the block does, the exit code and report are the checker's."""

from __future__ import annotations

import argparse
import json

from ..check import (
    COMMON_ARGUMENTS,
    DEFAULT_TIMEOUT,
    ROLES,
    check_isolated,
    own_blocks,
    parse_argument,
)
from ..check.building.target import parse_role
from ..check.submissions import named
from ..errors import UserError, UserValueError
from .formatting import add_command, add_timeout_option, check_timeout

EXIT_UNVERIFIED = 3  # every black-box check passed, but the block was not compared


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    defaults = ", ".join(f"{k}={v!r}" for k, v in COMMON_ARGUMENTS.items())
    p = add_command(
        sub,
        "check",
        run,
        argparse.ArgumentDefaultsHelpFormatter,
        description=(
            "Probe a block mapping (B, T, C) to (B, T, C) (shape, causality, batch "
            "independence, eval determinism, residual stream, finite outputs, gradients), read "
            "its weights from one recorded forward pass (whatever holds them) and diagnose its "
            "mistakes by comparison with the lessons' block. The block runs in a child process. "
            "Exit code 0 (PASS) only when the block was compared and matches, 1 (FAIL) when a "
            "check fails or a mistake is found (the block crashed, hung or exited included), 2 "
            "when the target cannot be loaded or built, or an --arg or --map cannot be what it "
            "claims (a norm for a projection, a role the forward pass shows is another), 3 (UNVERIFIED) when every black-box "
            "check passed but the weights could not be read (the report says which --map reads "
            "them) or the block has a part no reference models (the report names it)."
        ),
        epilog=(
            "Constructor arguments the block takes but --arg does not give are filled with "
            f"small values: {defaults} (dropout > 0 so that dropout left on in eval shows up)."
        ),
    )
    p.add_argument(
        "target",
        nargs="?",
        default=None,
        help="the block: FILE.py:NAME, FILE.ipynb:NAME or package.module:NAME, NAME a class, a "
        "factory or a module instance; a FILE alone: the block gptblock grade finds in it; "
        "without it, gptblock's own blocks are checked",
    )
    p.add_argument(
        "--arg",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a constructor argument, VALUE read as a Python literal (else as a string); repeat "
        "for more",
    )
    p.add_argument(
        "--map",
        action="extend",
        nargs="+",
        default=[],
        metavar="ROLE=NAME",
        help=f"the block's part for a role the checker cannot read itself (roles: "
        f"{' '.join(ROLES)}; NAME a module or parameter, a glob like heads.*.query for one "
        "module per head, or a slice and layout like attn.c_attn.weight[:,0:32]:in_out or "
        "W_Q:in_out for (nh, C, hs) per head); an UNVERIFIED report suggests one",
    )
    add_timeout_option(p, DEFAULT_TIMEOUT, "the block")
    p.add_argument("--json", action="store_true", help="print the reports as JSON")


def run(args: argparse.Namespace) -> int:
    try:
        kwargs = dict(parse_argument(a) for a in args.arg)
        roles = dict(parse_role(m) for m in args.map)
        check_timeout(args.timeout)
        if args.target is None:
            if kwargs or roles:
                raise UserValueError(
                    "--arg and --map need a TARGET; gptblock's own blocks use the defaults"
                )
            targets = [f"{b.__module__}:{b.__qualname__}" for b in own_blocks()]
        else:
            targets = [named(args.target)]
        reports = check_isolated(targets, kwargs=kwargs, roles=roles, timeout=args.timeout)
    except UserError as e:
        if args.json:  # valid JSON on stdout in every case; the one-line error goes to stderr
            print(json.dumps({"passed": False, "error": str(e), "reports": []}, indent=2))
        raise
    passed = all(r.passed for r in reports)
    verdicts = [r.verdict for r in reports]
    if args.json:
        print(json.dumps({"passed": passed, "reports": [r.to_dict() for r in reports]}, indent=2))
    else:
        print("\n\n".join(str(r) for r in reports))
        if len(reports) > 1:
            print(f"\n{verdicts.count('PASS')} of {len(reports)} blocks pass")
    if "FAIL" in verdicts:
        return 1
    return EXIT_UNVERIFIED if "UNVERIFIED" in verdicts else 0
