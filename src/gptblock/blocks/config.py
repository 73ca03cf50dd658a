"""Frozen, validated configuration: ``BlockConfig`` and ``GPTConfig``, and the activations.

``gptblock.blocks.checks``' input checks are importable from here too, where they once lived.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

import torch
import torch.nn as nn
from torch.nn import functional as F

from ..errors import UserTypeError, UserValueError
from .checks import check_dropout as check_dropout
from .checks import check_heads as check_heads
from .checks import check_input as check_input
from .checks import check_norm_eps, check_softcap, check_within
from .checks import check_positive_int as check_positive_int
from .checks import check_seed as check_seed
from .rotary import PAIRINGS, check_rotary


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU's tanh approximation, GPT-2's ``gelu_new``: ``nn.GELU(approximate="tanh")``."""
    return F.gelu(x, approximate="tanh")


def relu2(x: torch.Tensor) -> torch.Tensor:
    """Squared ReLU (So et al. 2021, "Primer"; nanochat's MLP): ``relu(x) ** 2``.

    Example:
        >>> relu2(torch.tensor([-1.0, 3.0]))
        tensor([0., 9.])
    """
    return F.relu(x).square()


# The MLP's nonlinearity by name. "gelu" is the exact (erf) form, as nn.GELU() and
# nn.TransformerEncoderLayer's "gelu"; "gelu_tanh" is the approximation GPT-2 was trained with,
# which differs from it by up to ~1e-3, enough to matter when loading GPT-2's weights.
ACTIVATION_FUNCTIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "relu": F.relu,
    "gelu_tanh": gelu_tanh,
    "relu2": relu2,
}
ACTIVATIONS = tuple(ACTIVATION_FUNCTIONS)  # ("gelu", "relu", "gelu_tanh", "relu2")
NORMS = ("layernorm", "rmsnorm")  # LayerNorm (GPT-2) or RMSNorm (Llama)
MLPS = ("dense", "swiglu")  # linear2(act(linear1 x)) or linear2(silu(linear1 x) * linear3 x)
POSITIONS = ("learned", "rope", "none")  # a GPT's position information
ROPE = ("position", "rope")  # what the rotary settings act with
DENSE = ("mlp", "dense")  # what activation acts with: SwiGLU's gate is SiLU


def activation_function(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The activation called ``name``; an unknown name lists the choices.

    Example:
        >>> activation_function("relu")(torch.tensor([-1.0, 2.0]))
        tensor([0., 2.])
        >>> activation_function("silu")
        Traceback (most recent call last):
        ...
        gptblock.errors.UserValueError: activation must be one of ('gelu', 'relu', 'gelu_tanh', 'relu2'), got 'silu'
    """
    if name not in ACTIVATION_FUNCTIONS:
        raise UserValueError(f"activation must be one of {ACTIVATIONS}, got {name!r}")
    return ACTIVATION_FUNCTIONS[name]


def activation_name(fn: object) -> str | None:
    """The name of an activation given as a function or module (``nn.TransformerEncoderLayer``'s
    ``activation``), or ``None`` if it is none of them.

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
    if fn is relu2:
        return "relu2"
    return None


def option(
    default: Any = MISSING,
    help: str = "",
    choices: tuple[str, ...] = (),
    within: str = "",
    acts_with: tuple[str, str] | None = None,
) -> Any:
    """A config field with its help (``gptblock train --help``'s), its ``choices``, its interval
    ``within`` (``"[0, 1)"``) and the setting and value it ``acts_with`` (``("mlp", "dense")``),
    in its metadata, where ``check_choices`` and the command line read them."""
    metadata = {"help": help, "choices": choices, "within": within, "acts_with": acts_with}
    return field(default=default, metadata=metadata)


def check_choices(config: object) -> None:
    """Refuse a field of the dataclass ``config`` not among its ``choices``, not in its interval
    ``within``, or set (away from its default) where it cannot act (``inapplicable``)."""
    values = {f.name: getattr(config, f.name) for f in fields(config)}  # type: ignore[arg-type]
    for f in fields(config):  # type: ignore[arg-type]
        value, choices = values[f.name], f.metadata.get("choices")
        if choices and value not in choices:
            raise UserValueError(f"{f.name} must be one of {choices}, got {value!r}")
        if within := f.metadata.get("within", ""):
            check_within(f.name, value, within)
    for name, other, needed in inapplicable(config, values):
        raise UserValueError(
            f"{name}={values[name]!r} acts only with {other}={needed!r}, but {other} is "
            f"{values[other]!r}: change {other} too, or leave {name} out"
        )


def inapplicable(config: object, values: Mapping[str, Any]) -> list[tuple[str, str, Any]]:
    """(name, setting, value it needs) of each field of the dataclass ``config`` set in
    ``values`` away from its default where its ``acts_with`` setting (in ``values``, else its
    default) has another value."""
    defaults = {f.name: f.default for f in fields(config)}  # type: ignore[arg-type]
    found = []
    for f in fields(config):  # type: ignore[arg-type]
        other, needed = f.metadata.get("acts_with") or ("", None)
        away = other and values.get(f.name, f.default) != f.default
        if away and values.get(other, defaults[other]) != needed:
            found.append((f.name, other, needed))
    return found


def applicable(
    config: type, values: Mapping[str, Any], given: Collection[str] = ()
) -> dict[str, Any]:
    """``values`` with each field that cannot act put back to its default, unless ``given``
    names it (then the config refuses it): a preset's or an older checkpoint's value that did
    nothing is dropped.

    Example:
        >>> applicable(GPTConfig, {"position": "learned", "rope_theta": 100.0})
        {'position': 'learned', 'rope_theta': 10000.0}
    """
    defaults = {f.name: f.default for f in fields(config)}
    dropped = {n: defaults[n] for n, *_ in inapplicable(config, values) if n not in given}
    return {**values, **dropped}


@dataclass(frozen=True, kw_only=True)
class BlockOptions:
    """The options of a pre-norm block, ``BlockConfig``'s and ``GPTConfig``'s; the defaults are
    GPT-2's block."""

    dropout: float = option(0.0, "dropout probability (attention weights, residual branches, MLP)")
    activation: str = option(
        "gelu", "dense MLP's: gelu, relu, gelu_tanh (GPT-2's) or relu2", ACTIVATIONS, "", DENSE
    )
    bias: bool = option(True, "biases in the linear layers and norms (Llama has none)")
    norm_eps: float = option(1e-5, "every norm's epsilon")
    norm: str = option("layernorm", "layernorm (GPT-2) or rmsnorm (Llama)", NORMS)
    mlp: str = option("dense", "dense (GPT-2's MLP) or swiglu (Llama's gated MLP)", MLPS)
    d_ff: int = option(None, "the MLP's hidden width (none: 4 * n_embd)")  # resolved: an int
    n_kv_head: int = option(None, "key/value heads: grouped-query attention (none: n_head)")
    qk_norm: bool = option(False, "RMSNorm on each head's queries and keys")
    parallel_residual: bool = option(False, "x + attn(norm(x)) + mlp(norm(x)), as GPT-J")
    position: str = option("learned", "learned (GPT-2's), rope (rotary) or none", POSITIONS)
    rotary_dim: int | None = option(None, "with rope: channels rotated (none: all)", acts_with=ROPE)
    rope_theta: float = option(10000.0, "with rope: the angles' base", acts_with=ROPE)
    rope_pairing: str = option(
        "halves", "with rope: halves (i, i + hs/2; HF) or adjacent (2i, 2i + 1)", PAIRINGS, "", ROPE
    )

    def _check_options(self, width: tuple[str, int], n_head: int) -> None:
        """Validate the options for ``width`` channels (name, value) and ``n_head`` heads, with
        ``d_ff`` and ``n_kv_head`` resolved (None: GPT-2's)."""
        hs = check_heads(width[1], n_head, names=(width[0], "n_head"))
        check_dropout(self.dropout)
        check_norm_eps(self.norm_eps)
        check_choices(self)
        _check_flags(self, "bias", "qk_norm", "parallel_residual")
        # None means "as GPT-2": resolved here, so asdict() round-trips to an equal config.
        object.__setattr__(self, "d_ff", 4 * width[1] if self.d_ff is None else self.d_ff)
        n_kv = n_head if self.n_kv_head is None else self.n_kv_head
        object.__setattr__(self, "n_kv_head", n_kv)
        check_positive_int("d_ff", self.d_ff)
        if n_head % check_positive_int("n_kv_head", self.n_kv_head):
            raise UserValueError(
                f"n_kv_head={self.n_kv_head} does not divide n_head={n_head}: each key/value "
                f"head must serve an equal number of query heads"
            )
        if self.position == "rope":  # otherwise its settings are unused, any head size is fine
            check_rotary(hs, self.rotary_dim, self.rope_theta, self.rope_pairing)


@dataclass(frozen=True)
class BlockConfig(BlockOptions):
    """One pre-norm block's hyperparameters: ``d_model`` (C), ``n_head`` (nh, each head hs = C //
    nh wide) and ``BlockOptions``. The block forms build one from their constructor arguments
    (``BlockConfig.of``), so they validate alike; ``position`` matters to a block only as "rope".

    Example:
        >>> BlockConfig(d_model=16, n_head=2).head_size
        8
        >>> BlockConfig(d_model=16, n_head=3)
        Traceback (most recent call last):
        ...
        gptblock.errors.UserValueError: d_model=16 is not divisible by n_head=3: each head must get an equal share of the channels
    """

    d_model: int  # C: channels of the residual stream
    n_head: int  # nh: attention heads, each of size hs = C // nh

    def __post_init__(self) -> None:
        self._check_options(("d_model", self.d_model), self.n_head)

    @classmethod
    def of(cls, d_model: int, n_heads: int, **options: Any) -> BlockConfig:
        """The config of a block form's constructor arguments, which may also name ``n_kv_head``
        and ``position="rope"`` ``n_kv_heads`` and ``rope=True`` (the blocks' older names).

        Example:
            >>> BlockConfig.of(16, 4, n_kv_heads=2, rope=True).position
            'rope'
        """
        check_heads(d_model, n_heads)  # named as the constructors' arguments
        if "n_kv_heads" in options:
            options["n_kv_head"] = options.pop("n_kv_heads")
        if "rope" in options:
            rope = options.pop("rope")
            if not isinstance(rope, bool):
                raise UserTypeError(f"rope must be a bool, got {rope!r}")
            options["position"] = "rope" if rope else "learned"
        return cls(d_model, n_heads, **options)

    @property
    def head_size(self) -> int:
        """hs: channels per head."""
        return self.d_model // self.n_head

    @property
    def modern(self) -> tuple[str, ...]:
        """The options set away from GPT-2's block: what ``TransformerBlock`` and the lesson's
        ``Block`` cannot express."""
        learned = "learned" if self.position == "rope" else self.position  # a block's: no rope
        gpt2 = BlockOptions(d_ff=4 * self.d_model, n_kv_head=self.n_head, position=learned)
        names = (*MODERN, "activation") if self.activation == "relu2" else MODERN
        return tuple(n for n in names if getattr(self, n) != getattr(gpt2, n))


def _check_flags(config: object, *names: str) -> None:
    for name in names:
        if not isinstance(getattr(config, name), bool):
            raise UserTypeError(f"{name} must be a bool, got {getattr(config, name)!r}")


# The options GPT-2's block has one value of, in the order ``BlockConfig.modern`` names them.
MODERN = ("norm", "mlp", "qk_norm", "parallel_residual", "position", "d_ff", "n_kv_head")
BLOCK_FORMS = ("fused", "mha", "lesson")


@dataclass(frozen=True)
class GPTShape:
    """A GPT's size: ``GPTConfig``'s first fields (a base class, so that they come first)."""

    vocab_size: int = option(help="V: token ids are 0 .. V-1")
    block_size: int = option(help="context length (T): the number of position embeddings")
    n_layer: int = option(help="number of blocks")
    n_head: int = option(help="attention heads per block (nh), each n_embd // n_head wide")
    n_embd: int = option(help="width of the residual stream (C)")


@dataclass(frozen=True, kw_only=True)
class GPTConfig(BlockOptions, GPTShape):
    """The shape of a tiny GPT: embeddings, ``n_layer`` blocks, a final norm, a tied unembedding.

    ``GPTShape``'s five fields may be given in order. ``GPTConfig(**asdict(config))`` is how
    checkpoints store it; a field missing from an older one has its default, what it built.

    Example:
        >>> GPTConfig(vocab_size=65, block_size=32, n_layer=2, n_head=2, n_embd=32).block
        'fused'
        >>> GPTConfig(vocab_size=65, block_size=32, n_layer=2, n_head=2, n_embd=32, block="lesson")
        Traceback (most recent call last):
        ...
        gptblock.errors.UserValueError: block='lesson' is the lesson's ReLU block: it needs activation='relu', got 'gelu'
    """

    block: str = option("fused", "the block form: fused, mha or lesson", BLOCK_FORMS)
    tie_embeddings: bool = option(True, "the unembedding is the token embedding's weight")
    zero_init_proj: bool = option(False, "output projections (and an untied head) start at 0")
    logit_softcap: float | None = option(None, "logits to cap * tanh(logits / cap) (none: none)")
    bigram: bool = option(False, "add an embedding of each (previous, this) token pair")
    smear: bool = option(False, "add a gated part of each position's embedding to the next")

    def __post_init__(self) -> None:
        check_positive_int("vocab_size", self.vocab_size)
        _check_flags(self, "bigram", "smear", "tie_embeddings", "zero_init_proj")
        check_positive_int("block_size", self.block_size)
        check_positive_int("n_layer", self.n_layer)
        self._check_options(("n_embd", self.n_embd), self.n_head)
        object.__setattr__(self, "logit_softcap", check_softcap(self.logit_softcap))
        modern = self.block_config().modern
        if modern and self.block != "fused":
            raise UserValueError(
                f"block={self.block!r} cannot express {modern[0]}="
                f"{getattr(self, modern[0])!r}: the modern block's options need block='fused'"
            )
        lesson = {"activation": "relu", "bias": True, "norm_eps": 1e-5}
        wrong = [name for name, value in lesson.items() if getattr(self, name) != value]
        if self.block == "lesson" and wrong:  # the lesson's Block is ReLU, biased, eps 1e-5
            raise UserValueError(
                f"block='lesson' is the lesson's ReLU block: it needs {wrong[0]}="
                f"{lesson[wrong[0]]!r}, got {getattr(self, wrong[0])!r}"
            )

    def block_config(self) -> BlockConfig:
        """The ``BlockConfig`` of each of this GPT's blocks."""
        options = {f.name: getattr(self, f.name) for f in fields(BlockOptions)}
        return BlockConfig(d_model=self.n_embd, n_head=self.n_head, **options)
