"""gptblock: the GPT transformer block as the lessons teach it, verified, fast, and stacked into a tiny GPT.

The public API is exactly ``__all__`` (a test pins it). Block forms:

* ``gptblock.lesson`` -- ``Head``, ``MultiHeadAttention``, ``FeedForward``, ``Block``, as taught.
* ``TransformerBlock`` -- the same pre-norm block on ``nn.MultiheadAttention``; its state_dict
  loads into ``nn.TransformerEncoderLayer(..., norm_first=True)``.
* ``FusedBlock`` -- the same function and parameter names, with packed QKV and
  ``F.scaled_dot_product_attention``; the fast form, with a ``KVCache`` for generation.
* ``convert(module, to)`` -- any form into any other, computing the same function.

The modern block's parts (Llama's, Mistral's, Qwen's), options of ``FusedBlock`` and ``GPTConfig``
(``norm``, ``mlp``, ``n_kv_heads``, ``qk_norm``, ``parallel_residual``, rotary positions) and
each usable alone with given weights, named as Hugging Face's Llama: ``RMSNorm`` / ``rmsnorm``,
``Rotary`` / ``apply_rotary``, ``SwiGLU`` / ``swiglu``, ``GroupedQueryAttention`` /
``attention`` (Meta's Llama names load too), and ``LlamaBlock``, the decoder layer made of them.

And the oracle they are tested against, with the lesson's exercises:

* ``gptblock.reference`` -- the block's forward and hand-derived backward in NumPy alone.
* ``gptblock.exercises`` -- the first lesson's three exercises, run, returning their numbers.

``gptblock.lens`` looks inside a GPT: activations by name and hooks (``GPT.run_with_cache``,
``GPT.run_with_hooks``), the residual stream decomposed, the logit lens, figures and an HTML
attention viewer (``gptblock inspect`` on the command line).

``check_block`` finds the mistakes in anyone's block (``gptblock check`` on the command line).

``GPT`` (configured by ``GPTConfig``) stacks the blocks into the tiny GPT the lessons promise.
``train_gpt`` trains one on a text (``gptblock train`` on the command line), recording its
``RunMeta`` in every checkpoint; ``load_gpt`` rebuilds the trained model from its checkpoint, and
``load`` reads a run, a Hugging Face directory (GPT-2, Llama, Mistral, Qwen2) or a nanoGPT
checkpoint by one call.
Under it, ``Trainer`` (configured by ``TrainConfig``) trains any model returning
``(logits, loss)`` on text a ``CharTokenizer`` encodes.

Errors caused by the caller's input are ``UserError``s (also ``ValueError``, ``TypeError``, ...),
with a message that names the bad value; anything else is a bug.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from . import (
    early,  # noqa: F401  (first: `gptblock check`'s child starts importing torch now; early.py)
    interop,  # noqa: F401  (attaches GPT.from_hf & co.: gpt.py says why)
    lesson,
    reference,
)
from .blocks.config import BlockConfig, GPTConfig
from .blocks.convert import ConversionError, convert
from .blocks.fused import FusedBlock
from .blocks.gqa import GroupedQueryAttention, attention
from .blocks.llama import LlamaBlock
from .blocks.masks import causal_mask
from .blocks.mha import TransformerBlock
from .blocks.mlp import SwiGLU, swiglu
from .blocks.norms import RMSNorm, rmsnorm
from .blocks.rotary import Rotary, apply_rotary
from .data.batches import CharTokenizer
from .errors import UserError
from .model.generation.cache import KVCache
from .model.generation.sampling import GenerationStep
from .model.gpt import GPT, GPTOutput
from .runs.checkpoint import CheckpointError
from .runs.meta import RunMeta
from .train.config import TrainConfig
from .train.loop import Trainer
from .train.result import NonFiniteLossError
from .train.run import train_gpt

__version__ = "0.3.0"

# Imported at their first use (PEP 562's module __getattr__): the checker, the lens, the
# exercises and the loaders, which a training run (`gptblock train`, benchmarks/speedrun.py)
# does not use, were a third of `import gptblock`'s own time (-X importtime).
LAZY_NAMES = {
    "CheckReport": "check",
    "Finding": "check",
    "check_block": "check",
    "load": "loading",
    "load_gpt": "loading",
}
LAZY_MODULES = ("check", "exercises", "lens", "loading", "sampling")

if TYPE_CHECKING:
    from . import exercises, lens
    from .check import CheckReport, Finding, check_block
    from .loading import load, load_gpt


def __getattr__(name: str) -> Any:
    if name in LAZY_NAMES:
        value = getattr(import_module(f".{LAZY_NAMES[name]}", __name__), name)
    elif name in LAZY_MODULES:
        value = import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, *LAZY_MODULES})


__all__ = [
    "GPT",
    "BlockConfig",
    "CharTokenizer",
    "CheckReport",
    "CheckpointError",
    "ConversionError",
    "Finding",
    "FusedBlock",
    "GPTConfig",
    "GPTOutput",
    "GenerationStep",
    "GroupedQueryAttention",
    "KVCache",
    "LlamaBlock",
    "NonFiniteLossError",
    "RMSNorm",
    "Rotary",
    "RunMeta",
    "SwiGLU",
    "TrainConfig",
    "Trainer",
    "TransformerBlock",
    "UserError",
    "__version__",
    "apply_rotary",
    "attention",
    "causal_mask",
    "check_block",
    "convert",
    "exercises",
    "lens",
    "lesson",
    "load",
    "load_gpt",
    "reference",
    "rmsnorm",
    "swiglu",
    "train_gpt",
]
