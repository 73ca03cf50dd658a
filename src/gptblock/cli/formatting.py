"""How every command's ``--help`` looks: defaults shown, None defaults explained in words."""

from __future__ import annotations

import argparse

__all__ = ["HelpFormatter", "RawEpilogHelpFormatter"]


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` with every default shown, except None: those options say in their help text
    what they default to (a preset's value, a newline, ...) instead of "(default: None)"."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None:
            return action.help
        return super()._get_help_string(action)


class RawEpilogHelpFormatter(HelpFormatter, argparse.RawDescriptionHelpFormatter):
    """``HelpFormatter``, with the description's and epilog's lines kept as written."""
