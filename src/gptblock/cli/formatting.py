"""How every command's ``--help`` looks: defaults shown, None defaults explained in words."""

from __future__ import annotations

import argparse

__all__ = ["HelpFormatter", "RawEpilogHelpFormatter", "add_threads_option"]


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` with every default shown, except None: those options say in their help text
    what they default to (a preset's value, a newline, ...) instead of "(default: None)"."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None:
            return action.help
        return super()._get_help_string(action)


class RawEpilogHelpFormatter(HelpFormatter, argparse.RawDescriptionHelpFormatter):
    """``HelpFormatter``, with the description's and epilog's lines kept as written."""


def add_threads_option(p: argparse.ArgumentParser) -> None:
    """``--threads``; the command runs inside ``devices.cpu_threads(args.threads)`` (``main``)."""
    p.add_argument(
        "--threads",
        type=int,
        help="torch CPU threads (default: the cores no other process keeps busy, so a busy "
        "machine slows the command down rather than stalling it)",
    )
    p.set_defaults(threads_option=True)
