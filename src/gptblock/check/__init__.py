"""The checker behind ``gptblock check``: ``check_block`` says what is wrong with a block.

Its rooms, in the order they import each other (each uses only the rooms before it; each
room's ``__init__`` says which file owns what), and nothing imports ``gptblock.cli``:

1. ``serve/`` -- where the block runs: ``runner``, ``subject`` (the checker's copy of the block),
   ``loop`` (the recorder), ``frames``, ``calls``. The standard library, torch and
   each other only: ``gptblock.early`` copies the folder as the package ``serve`` for the
   runner's process, which imports nothing of gptblock.
2. ``mistakes/`` -- what the checker can name and how it says so: ``catalogue`` (each mistake's
   one home), the reference's ``steps`` (the lessons' and the modern block's), the mistakes as changes to them
   (``variants``), ``search`` (``explain``) and ``report`` (``CheckReport``, ``Finding``, as text, JSON and HTML).
3. ``building/`` -- the learner's block loaded (``target``: the only module that imports the user's
   code) and built at the sizes its file implies (``build``, ``arguments``, ``sizes``, ``vary``).
4. ``roles/`` -- finding the roles from what the tensors do (``trace``, ``walks``,
   ``dataflow`` (the norms too), ``weights``), else from the module tree by shapes and order
   (``parts``, ``mapping``) or ``--map`` (``given``; its offer in ``readings``); the reading used
   (``readings``) as numbers (``plain``, ``provenance``); the modern block's (``modern_*``).
5. ``compare/`` -- ``decide`` (``verdict``): probes, the comparison held where a learner runs
   the block (``conditions``), every parameter acting (``account``), the modern
   block's comparison (``modern``), confirmed as the lessons' block's is.
6. ``isolation/`` -- ``check_isolated`` (``check``): the block in child processes that only answer
   requests (``child``, ``reaper``, ``worker`` (its ``Remote``)), checked at two sizes.

``run`` -- ``check_block``: the block in this process (trusted code) or in a child process; it
uses all the rooms, and the block forms it checks by default (``lesson``, ``mha``, ``fused``).
``submissions`` and ``grading`` -- ``grade`` (``gptblock grade``): a class's submissions found, the
block in each found without running it, each checked by ``check_isolated``, rows into a gradebook.

Shapes: B batch, T time, C channels.
"""

from .building.build import COMMON_ARGUMENTS, fill_common_arguments
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
