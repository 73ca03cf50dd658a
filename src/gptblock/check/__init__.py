"""The checker behind ``gptblock check``: ``check_block`` says what is wrong with a block. Its
rooms (``serve``, ``mistakes``, ``building``, ``roles``, ``compare``, ``isolation``) import only
those before them; docs/checker.md, "How it decides". Shapes: B batch, T time, C channels."""

from .building.arguments import COMMON_ARGUMENTS, fill_common_arguments
from .building.target import load_target, parse_argument
from .isolation.check import DEFAULT_TIMEOUT, check_isolated
from .mistakes.catalogue import MISTAKES
from .mistakes.report import CheckReport, Finding
from .roles.mapping import ROLES
from .run import check_block, own_blocks

__all__ = [
    "COMMON_ARGUMENTS",
    "DEFAULT_TIMEOUT",
    "MISTAKES",
    "ROLES",
    "CheckReport",
    "Finding",
    "check_block",
    "check_isolated",
    "fill_common_arguments",
    "load_target",
    "own_blocks",
    "parse_argument",
]
