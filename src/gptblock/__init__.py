"""gptblock: the GPT transformer block as the lessons teach it, verified, fast, and stacked into a tiny GPT.

The public API is exactly ``__all__`` (a test pins it). Block forms:

* ``gptblock.lesson`` -- ``Head``, ``MultiHeadAttention``, ``FeedForward``, ``Block``, as taught.
* ``TransformerBlock`` -- the same pre-norm block on ``nn.MultiheadAttention``; its state_dict
  loads into ``nn.TransformerEncoderLayer(..., norm_first=True)``.
* ``FusedBlock`` -- the same function and parameter names, with packed QKV and
  ``F.scaled_dot_product_attention``; the fast form, with a ``KVCache`` for generation.
* ``convert(module, to)`` -- any form into any other, computing the same function.
"""

from . import lesson
from .config import BlockConfig
from .convert import ConversionError, convert
from .fused import FusedBlock, KVCache
from .masks import causal_mask
from .mha import TransformerBlock

__version__ = "0.1.0"

__all__ = [
    "BlockConfig",
    "ConversionError",
    "FusedBlock",
    "KVCache",
    "TransformerBlock",
    "__version__",
    "causal_mask",
    "convert",
    "lesson",
]
