"""Frozen, validated configuration: ``BlockConfig`` and ``GPTConfig``, and the activations.

The input checks they share live in ``gptblock.blocks.checks`` and are importable from here too,
as they were before the modern block's options made this file too long for them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F

from ..errors import UserTypeError, UserValueError
from .checks import MAX_SEED as MAX_SEED
from .checks import check_dropout as check_dropout
from .checks import check_heads as check_heads
from .checks import check_input as check_input
from .checks import check_norm_eps as check_norm_eps
from .checks import check_positive_int as check_positive_int
from .checks import check_seed as check_seed
from .checks import check_softcap
from .rotary import check_rotary


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
MLPS = (
    "dense",
    "swiglu",
)  # linear2(act(linear1 x)) or the gated linear2(silu(linear1 x) * linear3 x)
POSITIONS = ("learned", "rope", "none")  # a GPT's position information


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
        gptblock.errors.UserValueError: activation must be one of ('gelu', 'relu', 'gelu_tanh', 'relu2'), got 'silu'
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
    if fn is relu2:
        return "relu2"
    return None


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
        norm_eps: the norms' epsilon.
        norm: ``"layernorm"`` (GPT-2) or ``"rmsnorm"`` (Llama: ``x / sqrt(mean(x^2) + eps) * w``).
        mlp: ``"dense"`` (``linear2(act(linear1 x))``) or ``"swiglu"``
            (``linear2(silu(linear1 x) * linear3 x)``; ``activation`` is then not used).
        d_ff: the MLP's hidden width; None: 4 * d_model, as in both lessons.
        n_kv_heads: key/value heads (grouped-query attention; 1 is multi-query); each serves
            n_heads // n_kv_heads query heads. None: n_heads (multi-head attention).
        qk_norm: an RMSNorm over each head's queries and keys (OLMo 2, Qwen 3, Gemma 3).
        parallel_residual: ``x + attn(norm1(x)) + mlp(norm1(x))`` (GPT-J, PaLM): one norm, both
            branches read the block's input.
        rope: rotate the queries and keys by their positions (``gptblock.blocks.rotary``).
        rotary_dim: with ``rope``, the leading channels of each head rotated; None: all.
        rope_theta: with ``rope``, the angles' base.
        rope_pairing: with ``rope``, ``"halves"`` (Hugging Face) or ``"adjacent"`` (the paper).

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
    # The modern block's parts (gptblock.blocks.norms, .mlp, .rotary); the defaults are GPT-2's.
    norm: str = "layernorm"  # "layernorm" or "rmsnorm"
    mlp: str = "dense"  # "dense" or "swiglu"
    d_ff: int = None  # type: ignore[assignment]  # MLP hidden width; None -> 4 * d_model
    n_kv_heads: int = None  # type: ignore[assignment]  # key/value heads; None -> n_heads
    qk_norm: bool = False  # RMSNorm on each head's queries and keys
    parallel_residual: bool = False  # x + attn(norm1(x)) + mlp(norm1(x))
    rope: bool = False  # rotary position embeddings on q and k
    rotary_dim: int | None = None  # rotated channels per head; None: all (hs)
    rope_theta: float = 10000.0  # the angles' base
    rope_pairing: str = "halves"  # "halves" (i, i + r/2) or "adjacent" (2i, 2i + 1)

    def __post_init__(self) -> None:
        check_heads(self.d_model, self.n_heads)
        check_dropout(self.dropout)
        check_activation(self.activation)
        if not isinstance(self.bias, bool):
            raise UserTypeError(f"bias must be a bool, got {self.bias!r}")
        check_norm_eps(self.norm_eps)
        # None means "as GPT-2": resolved here, so asdict() round-trips to an equal config.
        object.__setattr__(self, "d_ff", 4 * self.d_model if self.d_ff is None else self.d_ff)
        object.__setattr__(
            self, "n_kv_heads", self.n_heads if self.n_kv_heads is None else self.n_kv_heads
        )
        check_modern(
            self, self.n_heads, self.head_size, ("n_heads", "n_kv_heads"), self.rope is True
        )

    @property
    def head_size(self) -> int:
        """hs: channels per head."""
        return self.d_model // self.n_heads

    @property
    def modern(self) -> tuple[str, ...]:
        """The names of the options set away from GPT-2's block (empty for the default)."""
        return modern_options(self)


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
        norm, mlp, d_ff, qk_norm, parallel_residual, rotary_dim, rope_theta, rope_pairing: the
            blocks' parts, as ``BlockConfig``'s (``norm`` also for the final norm).
        n_kv_head: key/value heads per block (grouped-query attention); None: n_head.
        position: ``"learned"`` (GPT-2's position embedding ``wpe``), ``"rope"`` (rotary, in
            every block; no ``wpe``) or ``"none"`` (no position information but the causal mask).
        zero_init_proj: start every block's output projections (attention's and the MLP's), and
            an untied ``lm_head``, at zero (modded-nanogpt): each block starts as the identity.
        logit_softcap: None, or ``cap``: the logits are ``cap * tanh(logits / cap)`` (Gemma 2,
            modded-nanogpt), in training, evaluation and generation alike.
        bigram, smear: the input side (``gptblock.model.embeddings``): an embedding of each
            (previous token, token) pair added to the token's; a gated part of each position's
            embedding added to the next one's. Any block form.
        The modern options need ``block="fused"``.

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
    # The modern block's parts, as BlockConfig's; missing from a 0.1-0.3 checkpoint = GPT-2's.
    norm: str = "layernorm"  # "layernorm" or "rmsnorm" (blocks and the final norm)
    mlp: str = "dense"  # "dense" or "swiglu"
    d_ff: int = None  # type: ignore[assignment]  # MLP hidden width; None -> 4 * n_embd
    n_kv_head: int = None  # type: ignore[assignment]  # key/value heads; None -> n_head
    qk_norm: bool = False  # RMSNorm on each head's queries and keys
    parallel_residual: bool = False  # x + attn(norm1(x)) + mlp(norm1(x))
    position: str = "learned"  # "learned" (wpe), "rope" or "none"
    rotary_dim: int | None = None  # with rope: rotated channels per head; None: all
    rope_theta: float = 10000.0  # with rope: the angles' base
    rope_pairing: str = "halves"  # with rope: "halves" or "adjacent"
    zero_init_proj: bool = False  # output projections (and an untied lm_head) start at zero
    logit_softcap: float | None = None  # logits -> cap * tanh(logits / cap); None: no cap
    bigram: bool = False  # + an embedding of (previous token, token); missing: off
    smear: bool = False  # + a gated part of the previous position's embedding

    def __post_init__(self) -> None:
        check_positive_int("vocab_size", self.vocab_size)
        for flag in ("bigram", "smear"):
            if not isinstance(getattr(self, flag), bool):
                raise UserTypeError(f"{flag} must be a bool, got {getattr(self, flag)!r}")
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
        if not isinstance(self.zero_init_proj, bool):
            raise UserTypeError(f"zero_init_proj must be a bool, got {self.zero_init_proj!r}")
        object.__setattr__(self, "logit_softcap", check_softcap(self.logit_softcap))
        object.__setattr__(self, "d_ff", 4 * self.n_embd if self.d_ff is None else self.d_ff)
        object.__setattr__(
            self, "n_kv_head", self.n_head if self.n_kv_head is None else self.n_kv_head
        )
        if self.position not in POSITIONS:
            raise UserValueError(f"position must be one of {POSITIONS}, got {self.position!r}")
        check_modern(
            self,
            self.n_head,
            self.n_embd // self.n_head,
            ("n_head", "n_kv_head"),
            self.position == "rope",
        )
        modern = self.block_config().modern
        if modern and self.block != "fused":
            # BlockConfig's names, as this config spells them
            name = {"n_kv_heads": "n_kv_head", "rope": "position"}.get(modern[0], modern[0])
            raise UserValueError(
                f"block={self.block!r} cannot express {name}={getattr(self, name)!r}: "
                f"the modern block's options need block='fused'"
            )
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

    def block_config(self) -> BlockConfig:
        """The ``BlockConfig`` of each of this GPT's blocks."""
        return BlockConfig(
            self.n_embd,
            self.n_head,
            self.dropout,
            self.activation,
            self.bias,
            self.norm_eps,
            norm=self.norm,
            mlp=self.mlp,
            d_ff=self.d_ff,
            n_kv_heads=self.n_kv_head,
            qk_norm=self.qk_norm,
            parallel_residual=self.parallel_residual,
            rope=self.position == "rope",
            rotary_dim=self.rotary_dim,
            rope_theta=self.rope_theta,
            rope_pairing=self.rope_pairing,
        )


# The modern options and GPT-2's values of them: what ``BlockConfig.modern`` compares against.
_GPT2_BLOCK: dict[str, object] = {
    "norm": "layernorm",
    "mlp": "dense",
    "qk_norm": False,
    "parallel_residual": False,
    "rope": False,
}


def modern_options(config: BlockConfig) -> tuple[str, ...]:
    """The options of ``config`` that GPT-2's block (and so ``TransformerBlock`` and the
    lesson's ``Block``) cannot express, by name; empty for GPT-2's block."""
    names = [
        n
        for n in ("norm", "mlp", "qk_norm", "parallel_residual", "rope")
        if getattr(config, n) != _GPT2_BLOCK[n]
    ]
    if config.d_ff != 4 * config.d_model:
        names.append("d_ff")
    if config.n_kv_heads != config.n_heads:
        names.append("n_kv_heads")
    if config.activation == "relu2":
        names.append("activation")
    return tuple(names)


def check_modern(
    config: object, n_heads: int, head_size: int, names: tuple[str, str], rope: bool
) -> None:
    """Validate the modern options of a ``BlockConfig`` or ``GPTConfig`` (same field names but
    the head counts', which ``names`` gives)."""
    get = config.__getattribute__
    if get("norm") not in NORMS:
        raise UserValueError(f"norm must be one of {NORMS}, got {get('norm')!r}")
    if get("mlp") not in MLPS:
        raise UserValueError(f"mlp must be one of {MLPS}, got {get('mlp')!r}")
    check_positive_int("d_ff", get("d_ff"))
    n_kv = check_positive_int(names[1], get(names[1]))
    if n_heads % n_kv:
        raise UserValueError(
            f"{names[1]}={n_kv} does not divide {names[0]}={n_heads}: each key/value head "
            f"must serve an equal number of query heads"
        )
    for flag in ("qk_norm", "parallel_residual", "rope"):
        if hasattr(config, flag) and not isinstance(get(flag), bool):
            raise UserTypeError(f"{flag} must be a bool, got {get(flag)!r}")
    if rope:  # without rotary positions its settings are unused, and any head size is fine
        check_rotary(head_size, get("rotary_dim"), get("rope_theta"), get("rope_pairing"))
