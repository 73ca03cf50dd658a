"""The checker behind ``gptblock check``: ``check_block`` says what is wrong with a block.

Which file owns what:

* ``run`` -- ``check_block`` and its orchestration: build the target, tell its width C and
  longest sequence, run the probes, compare with the steps, combine the evidence into a diagnosis.
* ``probes`` -- black-box probes that need nothing but a module mapping (B, T, C) to (B, T, C).
* ``mapping`` -- reading a block's weights by parameter name into ``steps.Params``.
* ``steps`` -- the lessons' block computed step by step from a plain set of weights, each step
  replaceable.
* ``variants`` -- the catalogued mistakes as changes to those steps, and the search for the
  smallest set of them that reproduces a block.
* ``catalogue`` -- the mistakes the checker can name: title, explanation, fix, lesson line.
* ``report`` -- ``CheckReport`` and ``Finding``, what ``check_block`` returns, as text and JSON.
* ``target`` -- ``load_target`` and ``parse_argument``: the block named by ``FILE.py:NAME`` or
  ``package.module:NAME`` and its ``NAME=VALUE`` arguments, for ``gptblock check``. The only
  module that imports and runs the user's code before the check.

Imports point one way, down this list, and never out to ``gptblock.cli``:

1. ``catalogue`` and ``steps`` use nothing of gptblock;
2. ``report`` uses ``catalogue``; ``mapping`` and ``variants`` use ``steps``;
3. ``probes`` and ``target`` use ``report`` (for ``one_line``, an exception as one line of text);
4. ``run`` uses all but ``target``, and the block forms it checks by default (``lesson``,
   ``mha``, ``fused``).

Shapes: B batch, T time, C channels.
"""

from .catalogue import MISTAKES
from .report import CheckReport, Finding
from .run import COMMON_ARGUMENTS, check_block, fill_common_arguments, own_blocks
from .target import load_target, parse_argument

__all__ = [
    "COMMON_ARGUMENTS",
    "MISTAKES",
    "CheckReport",
    "Finding",
    "check_block",
    "fill_common_arguments",
    "load_target",
    "own_blocks",
    "parse_argument",
]
