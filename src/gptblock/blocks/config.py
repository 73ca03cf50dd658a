"""Frozen, validated configuration and the input checks every block form shares.

Every check raises ``ValueError`` (or ``TypeError`` for a wrong type) whose message names the
bad value and what was expected. None of them uses ``assert``: asserts vanish under
``python -O`` and their messages say nothing a learner can act on.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F

from ..errors import UserTypeError, UserValueError


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU's tanh approximation, GPT-2's ``gelu_new``: ``nn.GELU(approximate="tanh")``."""
    return F.gelu(x, approximate="tanh")


# The MLP's nonlinearity by name. "gelu" is the exact (erf) form, as nn.GELU() and
# nn.TransformerEncoderLayer's "gelu"; "gelu_tanh" is the approximation GPT-2 was trained with,
# which differs from it by up to ~1e-3, enough to matter when loading GPT-2's weights.
ACTIVATION_FUNCTIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "relu": F.relu,
    "gelu_tanh": gelu_tanh,
}
ACTIVATIONS = tuple(ACTIVATION_FUNCTIONS)  # ("gelu", "relu", "gelu_tanh")


def check_positive_int(name: str, value: object) -> int:
    """Return ``value`` if it is an int >= 1, else raise naming ``name`` and the value."""
    # bool is an int subclass; True as a head count is always a mistake.
    if isinstance(value, bool) or not isinstance(value, int):
        raise UserTypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if value < 1:
        raise UserValueError(f"{name} must be a positive int, got {value}")
    return value


MAX_SEED = 2**63 - 1  # torch's generators take 64 bits; the trainer adds offsets to the seed


def check_seed(value: object, name: str = "seed") -> int:
    """Return ``value`` if it is an int seed in [0, 2**63 - 1], else raise naming ``name``.

    Example:
        >>> check_seed(2**64)
        Traceback (most recent call last):
        ...
        gptblock.errors.UserValueError: seed must be an int in [0, 2**63 - 1], got 18446744073709551616
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise UserTypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if not 0 <= value <= MAX_SEED:
        raise UserValueError(f"{name} must be an int in [0, 2**63 - 1], got {value}")
    return value


def check_dropout(value: object, name: str = "dropout") -> float:
    """Return ``value`` as a float if it is a probability in [0, 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserTypeError(f"{name} must be a float in [0, 1), got {value!r}")
    if not (0.0 <= value < 1.0) or math.isnan(value):
        raise UserValueError(f"{name} must be in [0, 1), got {value}")
    return float(value)


def check_activation(value: object) -> str:
    """Return ``value`` if it names a supported activation, else list the choices."""
    if value not in ACTIVATIONS:
        raise UserValueError(f"activation must be one of {ACTIVATIONS}, got {value!r}")
    return str(value)


def activation_function(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The activation called ``name`` (see ``ACTIVATION_FUNCTIONS``); an unknown name lists the choices.

    Example:
        >>> activation_function("relu")(torch.tensor([-1.0, 2.0]))
        tensor([0., 2.])
        >>> activation_function("silu")
        Traceback (most recent call last):
        ...
        gptblock.errors.UserValueError: activation must be one of ('gelu', 'relu', 'gelu_tanh'), got 'silu'
    """
    if name not in ACTIVATION_FUNCTIONS:
        check_activation(name)  # raises, naming the choices
    return ACTIVATION_FUNCTIONS[name]


def activation_name(fn: object) -> str | None:
    """The name of an activation given as a function or module, or ``None`` if it is neither.

    ``F.relu`` and ``nn.ReLU()`` are ``"relu"``; ``F.gelu`` and exact ``nn.GELU()`` are
    ``"gelu"``; ``gelu_tanh`` and ``nn.GELU(approximate="tanh")`` are ``"gelu_tanh"``. This is how
    a module's ``activation`` attribute (``nn.TransformerEncoderLayer``'s) is read back into the
    name a block is built with.

    Example:
        >>> activation_name(nn.GELU()), activation_name(F.relu), activation_name(torch.tanh)
        ('gelu', 'relu', None)
        >>> activation_name(nn.GELU(approximate="tanh"))
        'gelu_tanh'
    """
    if fn is F.relu or isinstance(fn, nn.ReLU):
        return "relu"
    if fn is F.gelu or (isinstance(fn, nn.GELU) and fn.approximate == "none"):
        return "gelu"
    if fn is gelu_tanh or (isinstance(fn, nn.GELU) and fn.approximate == "tanh"):
        return "gelu_tanh"
    return None


def check_norm_eps(value: object) -> float:
    """Return ``value`` if it is a LayerNorm epsilon: a finite float > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserTypeError(f"norm_eps must be a positive float, got {value!r}")
    if not 0 < value < math.inf:
        raise UserValueError(f"norm_eps must be a positive float, got {value}")
    return float(value)


def check_heads(
    d_model: int, n_heads: int, *, names: tuple[str, str] = ("d_model", "n_heads")
) -> int:
    """Return the head size ``d_model // n_heads``, refusing a remainder.

    The lesson computes ``n_embd // n_head`` and silently builds a block whose concatenated
    heads are narrower than the stream when the division is not exact.
    """
    check_positive_int(names[0], d_model)
    check_positive_int(names[1], n_heads)
    if d_model % n_heads != 0:
        raise UserValueError(
            f"{names[0]}={d_model} is not divisible by {names[1]}={n_heads}: "
            f"each head must get an equal share of the channels"
        )
    return d_model // n_heads


def check_input(
    x: object, d_model: int, block_size: int | None = None, like: torch.Tensor | None = None
) -> tuple[int, int, int]:
    """Check that ``x`` is a (B, T, C) tensor with C == ``d_model`` and T <= ``block_size``.

    With ``like`` (one of the block's parameters), ``x`` must also be on its device and, unless
    autocast is on there (it casts per operation), of its dtype: PyTorch's own message for a
    float64 input to a float32 block is "mixed dtype (CPU)", which names neither.

    Returns ``(B, T, C)``.
    """
    if not isinstance(x, torch.Tensor):
        raise UserTypeError(
            f"expected a torch.Tensor of shape (B, T, {d_model}), got {type(x).__name__}"
        )
    if not x.is_floating_point():
        raise UserTypeError(
            f"expected a floating-point input (B, T, {d_model}), got dtype {x.dtype} "
            f"(token ids go through an embedding first)"
        )
    if like is not None and x.device != like.device:
        raise UserValueError(
            f"the input is on {x.device} but the block's parameters are on {like.device}; "
            f"move one of them (x.to({str(like.device)!r}))"
        )
    if like is not None and x.dtype != like.dtype and not _autocast_on(x.device.type):
        raise UserTypeError(
            f"the input has dtype {x.dtype} but the block's parameters are {like.dtype}; "
            f"convert the input (x.to({like.dtype})) or the block (block.to({x.dtype}))"
        )
    if x.dim() != 3 or x.shape[-1] != d_model:
        raise UserValueError(
            f"expected input of shape (B, T, {d_model}) (batch, time, channels), "
            f"got {tuple(x.shape)}"
        )
    B, T, C = x.shape
    if T == 0 or B == 0:
        raise UserValueError(
            f"expected a non-empty input of shape (B, T, {d_model}), got {tuple(x.shape)}"
        )
    if block_size is not None and T > block_size:
        raise UserValueError(f"sequence length T={T} exceeds block_size={block_size}")
    return B, T, C


def _autocast_on(device_type: str) -> bool:
    try:
        return bool(torch.is_autocast_enabled(device_type))
    except TypeError:  # torch < 2.4 has no device argument
        if device_type == "cpu":
            return bool(torch.is_autocast_cpu_enabled())
        return bool(torch.is_autocast_enabled())


@dataclass(frozen=True)
class BlockConfig:
    """The hyperparameters of one pre-norm transformer block.

    ``TransformerBlock`` and ``FusedBlock`` build one from their constructor arguments, so
    the two forms validate identically and a block's ``config`` describes it completely.

    Args:
        d_model: C, the width of the residual stream.
        n_heads: nh, the number of attention heads; each has head size hs = C // nh.
        dropout: probability for every dropout in the block (attention weights, both
            residual branches, the MLP hidden layer); used in training mode only.
        activation: the MLP's nonlinearity, ``"gelu"`` (exact, erf-based), ``"relu"`` or
            ``"gelu_tanh"`` (the tanh approximation, GPT-2's).
        bias: whether the linear layers (q/k/v, output projection, MLP) have biases.
        norm_eps: the LayerNorms' epsilon.

    Example:
        >>> BlockConfig(d_model=16, n_heads=2).head_size
        8
        >>> BlockConfig(d_model=16, n_heads=3)
        Traceback (most recent call last):
        ...
        gptblock.errors.UserValueError: d_model=16 is not divisible by n_heads=3: each head must get an equal share of the channels
    """

    d_model: int  # C: channels of the residual stream
    n_heads: int  # nh: attention heads, each of size hs = C // nh
    dropout: float = 0.0  # dropout probability, active in training mode only
    activation: str = "gelu"  # MLP nonlinearity: "gelu" (exact erf), "relu" or "gelu_tanh"
    bias: bool = True  # biases on q/k/v, the output projection and the MLP
    norm_eps: float = 1e-5  # LayerNorm epsilon, as nn.LayerNorm's default

    def __post_init__(self) -> None:
        check_heads(self.d_model, self.n_heads)
        check_dropout(self.dropout)
        check_activation(self.activation)
        if not isinstance(self.bias, bool):
            raise UserTypeError(f"bias must be a bool, got {self.bias!r}")
        check_norm_eps(self.norm_eps)

    @property
    def head_size(self) -> int:
        """hs: channels per head."""
        return self.d_model // self.n_heads

    @property
    def d_ff(self) -> int:
        """Width of the MLP's hidden layer: four times the stream, as in both lessons."""
        return 4 * self.d_model


BLOCK_FORMS = ("fused", "mha", "lesson")


@dataclass(frozen=True)
class GPTConfig:
    """The shape of a tiny GPT: embeddings, ``n_layer`` blocks, a final norm, a tied unembedding.

    ``dataclasses.asdict(config)`` round-trips through ``GPTConfig(**d)``, which is how
    checkpoints store it.

    Args:
        vocab_size: V, number of token ids.
        block_size: the longest context the model reads (its position embeddings).
        n_layer: number of blocks.
        n_head: nh, attention heads per block; must divide n_embd.
        n_embd: C, width of the residual stream.
        dropout: dropout probability everywhere, training mode only.
        bias: biases in the blocks' linear layers and LayerNorms.
        activation: the MLP's nonlinearity, ``"gelu"``, ``"relu"`` or ``"gelu_tanh"``.
        block: the block form, ``"fused"`` (fast; has the KV cache), ``"mha"``
            (``TransformerBlock``) or ``"lesson"`` (the lesson's ``Block``, which is ReLU with
            biases and eps 1e-5, so it needs ``activation="relu"``, ``bias=True`` and the
            default ``norm_eps``).
        norm_eps: every LayerNorm's epsilon (GPT-2's ``layer_norm_epsilon``).
        tie_embeddings: the unembedding ``lm_head`` is the token embedding's weight, as in
            GPT-2 and nanoGPT; False gives it its own (for checkpoints trained that way).

    Example:
        >>> GPTConfig(vocab_size=65, block_size=32, n_layer=2, n_head=2, n_embd=32).block
        'fused'
        >>> GPTConfig(vocab_size=65, block_size=32, n_layer=2, n_head=2, n_embd=32, block="lesson")
        Traceback (most recent call last):
        ...
        gptblock.errors.UserValueError: block='lesson' is the lesson's ReLU block: it needs activation='relu', got 'gelu'
    """

    vocab_size: int  # V: token ids are 0 .. V-1
    block_size: int  # longest context; the number of position embeddings
    n_layer: int  # number of blocks
    n_head: int  # nh: heads per block, each of size hs = n_embd // n_head
    n_embd: int  # C: width of the residual stream
    dropout: float = 0.0  # dropout probability, training mode only
    bias: bool = True  # biases in the blocks' linear layers and LayerNorms
    activation: str = "gelu"  # MLP nonlinearity: "gelu" (exact erf), "relu" or "gelu_tanh"
    block: str = "fused"  # block form: "fused", "mha" or "lesson"
    norm_eps: float = 1e-5  # every LayerNorm's epsilon
    tie_embeddings: bool = True  # lm_head.weight is transformer.wte.weight

    def __post_init__(self) -> None:
        check_positive_int("vocab_size", self.vocab_size)
        check_positive_int("block_size", self.block_size)
        check_positive_int("n_layer", self.n_layer)
        check_heads(self.n_embd, self.n_head, names=("n_embd", "n_head"))
        check_dropout(self.dropout)
        check_activation(self.activation)
        if not isinstance(self.bias, bool):
            raise UserTypeError(f"bias must be a bool, got {self.bias!r}")
        check_norm_eps(self.norm_eps)
        if not isinstance(self.tie_embeddings, bool):
            raise UserTypeError(f"tie_embeddings must be a bool, got {self.tie_embeddings!r}")
        if self.block not in BLOCK_FORMS:
            raise UserValueError(f"block must be one of {BLOCK_FORMS}, got {self.block!r}")
        if self.block == "lesson" and self.activation != "relu":
            raise UserValueError(
                f"block='lesson' is the lesson's ReLU block: it needs activation='relu', "
                f"got {self.activation!r}"
            )
        if self.block == "lesson" and not self.bias:
            raise UserValueError(
                "block='lesson' is the lesson's block, which has biases: it needs bias=True"
            )
        if self.block == "lesson" and self.norm_eps != 1e-5:
            raise UserValueError(
                f"block='lesson' is the lesson's block, whose LayerNorms have eps 1e-5: it "
                f"needs norm_eps=1e-5, got {self.norm_eps}"
            )
