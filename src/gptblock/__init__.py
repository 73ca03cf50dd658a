"""gptblock: the GPT transformer block as the lessons teach it, verified, fast, and stacked into a tiny GPT.

The public API is exactly ``__all__`` (a test pins it); README.md's "The library in one screen"
says what each name is. Errors caused by the caller's input are ``UserError``s (also
``ValueError``, ``TypeError``, ...) whose message names the bad value; anything else is a bug.
"""

from importlib import import_module
from types import FunctionType
from typing import TYPE_CHECKING, Any

__version__ = "0.3.0"

# Every name is imported at its first use (PEP 562's module __getattr__), so that a command
# imports only what it runs: `gptblock check` loads nothing of the training code, `gptblock
# train` nothing of the checker (tests/test_commands.py), and `import gptblock` alone loads no
# torch. The names, by the module (under gptblock) that defines them.
NAMES = {
    name: module
    for module, names in {
        "blocks.config": "BlockConfig GPTConfig", "blocks.convert": "ConversionError convert",
        "blocks.attention": "attention", "blocks.fused": "FusedBlock",
        "blocks.llama": "GroupedQueryAttention LlamaBlock", "blocks.masks": "causal_mask",
        "blocks.mha": "TransformerBlock", "blocks.mlp": "SwiGLU swiglu",
        "blocks.norms": "RMSNorm rmsnorm", "blocks.rotary": "Rotary apply_rotary",
        "check": "CheckReport Finding check_block", "check.grading": "grade",
        "data.batches": "CharTokenizer", "errors": "UserError", "loading": "load load_gpt",
        "model.generation.decode": "KVCache", "model.generation.sampling": "GenerationStep",
        "model.gpt": "GPT GPTOutput", "runs.checkpoint": "CheckpointError", "runs.meta": "RunMeta",
        "train.config": "TrainConfig", "train.loop": "Trainer",
        "train.result": "NonFiniteLossError", "train.run": "train_gpt",
    }.items()
    for name in names.split()
}  # fmt: skip
MODULES = ("check", "exercises", "lens", "lesson", "loading", "reference", "sampling")

if TYPE_CHECKING:
    from . import exercises, lens, lesson, reference
    from .blocks.attention import attention
    from .blocks.config import BlockConfig, GPTConfig
    from .blocks.convert import ConversionError, convert
    from .blocks.fused import FusedBlock
    from .blocks.llama import GroupedQueryAttention, LlamaBlock
    from .blocks.masks import causal_mask
    from .blocks.mha import TransformerBlock
    from .blocks.mlp import SwiGLU, swiglu
    from .blocks.norms import RMSNorm, rmsnorm
    from .blocks.rotary import Rotary, apply_rotary
    from .check import CheckReport, Finding, check_block
    from .check.grading import grade
    from .data.batches import CharTokenizer
    from .errors import UserError
    from .loading import load, load_gpt
    from .model.generation.decode import KVCache
    from .model.generation.sampling import GenerationStep
    from .model.gpt import GPT, GPTOutput
    from .runs.checkpoint import CheckpointError
    from .runs.meta import RunMeta
    from .train.config import TrainConfig
    from .train.loop import Trainer
    from .train.result import NonFiniteLossError
    from .train.run import train_gpt


def __getattr__(name: str) -> Any:
    if name in NAMES:
        value = getattr(import_module(f".{NAMES[name]}", __name__), name)
        if isinstance(value, FunctionType):  # an argument of another type: named, one line
            value = import_module(".errors", __name__).checked(value)
    elif name in MODULES:
        value = import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, *MODULES})


__all__ = ["GPT", "BlockConfig", "CharTokenizer", "CheckReport", "CheckpointError"]
__all__ += ["ConversionError", "Finding", "FusedBlock", "GPTConfig", "GPTOutput", "GenerationStep"]
__all__ += ["GroupedQueryAttention", "KVCache", "LlamaBlock", "NonFiniteLossError", "RMSNorm"]
__all__ += ["Rotary", "RunMeta", "SwiGLU", "TrainConfig", "Trainer", "TransformerBlock"]
__all__ += ["UserError", "__version__", "apply_rotary", "attention", "causal_mask", "check_block"]
__all__ += ["convert", "exercises", "grade", "lens", "lesson", "load", "load_gpt", "reference"]
__all__ += ["rmsnorm", "swiglu", "train_gpt"]
