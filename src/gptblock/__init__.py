"""gptblock: the GPT transformer block as the lessons teach it, verified, fast, and stacked into a tiny GPT.

The public API is exactly ``__all__`` (a test pins it). Block forms:

* ``gptblock.lesson`` -- ``Head``, ``MultiHeadAttention``, ``FeedForward``, ``Block``, as taught.
* ``TransformerBlock`` -- the same pre-norm block on ``nn.MultiheadAttention``; its state_dict
  loads into ``nn.TransformerEncoderLayer(..., norm_first=True)``.

``check_block`` finds the mistakes in anyone's block (``gptblock check`` on the command line).
"""

from . import lesson
from .check import CheckReport, check_block
from .config import BlockConfig
from .masks import causal_mask
from .mha import TransformerBlock

__version__ = "0.1.0"

__all__ = [
    "BlockConfig",
    "CheckReport",
    "TransformerBlock",
    "__version__",
    "causal_mask",
    "check_block",
    "lesson",
]
