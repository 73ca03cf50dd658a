"""The ``gptblock`` command line: argument parsing and printing only.

Each command is the module ``cli/NAME.py``, whose ``register(subparsers)`` adds its parser and
its ``run(args) -> int``; only the command being run is imported. A ``UserError`` or ``OSError``
is one line on stderr and exit code 2; any other exception keeps its traceback (a bug). Ctrl-C
exits 130, a closed pipe quietly 141; warnings are one line each.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import warnings
from collections.abc import Sequence
from importlib import import_module
from typing import Any, NoReturn

from .. import __version__, early
from ..errors import UserError
from .formatting import COMMANDS


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command; given ``command``, that one in full and the others by their
    names and help lines only, so that only the command being run is imported."""
    parser = argparse.ArgumentParser(
        prog="gptblock",
        description="The GPT transformer block as the lessons teach it, verified and fast.",
    )
    parser.add_argument("--version", action="version", version=f"gptblock {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, line in COMMANDS.items():
        if command is None or name == command:
            import_module(f".{name}", __name__).register(sub)
        else:
            sub.add_parser(name, help=line)
    return parser


def script() -> NoReturn:
    """The ``gptblock`` executable and ``python -m gptblock``: ``main``, then the process ends."""
    code = main()
    if _command(sys.argv[1:]) in ("check", "grade"):
        # A check leaves nothing to clean up (its processes are gone, its folder removed), and
        # Python's teardown of torch at exit is ~0.8 s of the ~4 s a check takes here; an
        # interrupted grade's threads are not waited for (their processes end with this one's).
        with contextlib.suppress(OSError):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def _command(argv: Sequence[str]) -> str | None:
    # gptblock's own options (--help, --version) take no value.
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the process exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    command = _command(argv)
    early.start(argv)  # a check's child starts importing torch now, beside this process
    try:
        return _run(command, argv)
    finally:
        early.drop()  # unless the check took it


def _run(command: str | None, argv: list[str]) -> int:
    args = build_parser(command if command in COMMANDS else "").parse_args(argv)
    with warnings.catch_warnings():
        warnings.showwarning = _one_line_warning(args.command)
        try:
            if not getattr(args, "threads_option", False):
                code: int = args.run(args)
                return code
            from ..devices import cpu_threads  # imports torch: not for --help or --version

            with cpu_threads(args.threads):
                code = args.run(args)
            return code
        except BrokenPipeError:
            # The reader went away: say nothing more (stdout is gone), and let no flush at exit
            # raise again.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 141
        except (UserError, OSError) as e:
            print(f"gptblock {args.command}: error: {e}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print(f"gptblock {args.command}: interrupted", file=sys.stderr)
            return 130


def _one_line_warning(command: str) -> Any:
    def show(message: Warning | str, *args: object, **kwargs: object) -> None:
        print(f"gptblock {command}: warning: {message}", file=sys.stderr)

    return show
