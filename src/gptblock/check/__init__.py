"""The checker behind ``gptblock check``: ``check_block`` says what is wrong with a block.

Which file owns what, in the order a check runs:

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

Imports point one way: ``run`` uses every other module (and the block forms ``lesson``, ``mha``
and ``fused``, which it checks by default); ``variants`` and ``mapping`` use ``steps``; ``report``
uses ``catalogue``; ``probes``, ``steps`` and ``catalogue`` use nothing of gptblock. Nothing here
imports ``gptblock.cli``.

Shapes: B batch, T time, C channels.
"""

from .catalogue import MISTAKES
from .report import CheckReport, Finding
from .run import COMMON_ARGUMENTS, check_block, fill_common_arguments, own_blocks

__all__ = [
    "COMMON_ARGUMENTS",
    "MISTAKES",
    "CheckReport",
    "Finding",
    "check_block",
    "fill_common_arguments",
    "own_blocks",
]
