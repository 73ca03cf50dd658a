"""The checker behind ``gptblock check``: ``check_block`` says what is wrong with a block.

Its rooms, in the order they import each other (each uses only the rooms before it; each room's
``__init__`` says which file owns what), and nothing imports ``gptblock.cli``:

1. ``serve/`` -- where the block runs; torch and the standard library only (``gptblock.early``
   copies it into the runner's process, which imports nothing of gptblock).
2. ``mistakes/`` -- what the checker can name and how it says so: the catalogue, the reference's
   steps and the mistakes as changes to them, ``search.explain``, the report.
3. ``building/`` -- the learner's block loaded and built at the sizes its file implies.
4. ``roles/`` -- the roles and their weights, from what the tensors do (else the module tree or
   ``--map``), the modern block's too.
5. ``compare/`` -- ``verdict.decide``: probes, the learner's conditions, every parameter acting,
   the modern block's comparison.
6. ``isolation/`` -- ``check_isolated``: the block in child processes that only answer requests.

``run`` (``check_block``, ``own_blocks``) uses them all; ``submissions`` and ``grading``
(``gptblock grade``) check a class's submissions with ``check_isolated``, rows into a gradebook.

Shapes: B batch, T time, C channels.
"""

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
