"""``RunSettings``: everything that decides a GPT run, typed, each field a ``gptblock train`` flag.

A run's settings are the model's shape (``GPTConfig``'s fields but the vocabulary, which is the
tokenizer's), how to train it (``TrainConfig``'s), and how to read the text (the tokenizer). A
preset (``gptblock.train.presets``) is a ``RunSettings``; ``prepare_run`` and the command line
replace its fields by name. Each field says in its metadata what it means (``help``) and, where
it is a word from a list, the words (``choices``): ``gptblock train``'s flags are made from them,
so a field added here is a flag there.

Which config a field feeds is read off the configs' own fields (``block_size`` feeds both), so
there is no list of names to keep in step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..blocks.config import ACTIVATIONS, MLPS, NORMS, POSITIONS, GPTConfig
from ..blocks.rotary import PAIRINGS
from ..devices import AUTOCAST_DTYPES
from ..errors import UserValueError
from .config import OPTIMIZERS, SCHEDULES, TrainConfig

__all__ = ["SETTINGS", "TOKENIZERS", "RunSettings"]

TOKENIZERS = ("char", "bpe")
DTYPES = ("auto", *AUTOCAST_DTYPES)
DEFAULTS = TrainConfig()  # the training fields no preset names keep TrainConfig's defaults

# Settings that only mean something beside another one's value: given when that value is
# otherwise, they would be silently unused, so ``replace`` refuses them (a preset's own values
# are not given, and may be there for when the other setting is changed too).
APPLIES_TO = {
    "rotary_dim": ("position", "rope"),
    "rope_theta": ("position", "rope"),
    "rope_pairing": ("position", "rope"),
    "decay_fraction": ("schedule", "wsd"),
    "muon_lr": ("optimizer", "muon"),
    "muon_momentum": ("optimizer", "muon"),
}


def setting(default: Any = dataclasses.MISSING, *, help: str, choices: tuple[str, ...] = ()) -> Any:
    """A field of ``RunSettings``: its default, and what ``gptblock train --help`` says of it."""
    return field(default=default, metadata={"help": help, "choices": choices})


@dataclass(frozen=True)
class RunSettings:
    """The settings of a GPT run: model shape, training, tokenizer and where to run.

    Validated when made (by building the ``GPTConfig`` and ``TrainConfig`` they give), so a bad
    value is named before any text is read.

    Example:
        >>> s = RunSettings(n_layer=2, n_head=2, n_embd=32, block_size=16)
        >>> s.model_config(vocab_size=65).n_embd, s.train_config().block_size
        (32, 16)
        >>> s.replace({"lr": None, "n_layer": 3}).n_layer  # None: keep the value
        3
        >>> s.replace({"rope_theta": 5e5})  # unused with learned positions: refused
        Traceback (most recent call last):
        ...
        gptblock.errors.UserValueError: rope_theta applies to position='rope' (--position rope) only; this run's position is 'learned'
        >>> s.replace({"layers": 3})
        Traceback (most recent call last):
        ...
        gptblock.errors.UserValueError: unknown setting 'layers'; the settings are n_layer, n_head, n_embd, block_size, dropout, activation, bias, tie_embeddings, norm, mlp, d_ff, n_kv_head, qk_norm, parallel_residual, position, rotary_dim, rope_theta, rope_pairing, bigram, smear, zero_init_proj, logit_softcap, batch_size, max_iters, lr, min_lr_ratio, warmup, schedule, decay_fraction, optimizer, muon_lr, muon_momentum, weight_decay, beta2, eval_interval, eval_iters, dtype, tokenizer, vocab_size, seed, device, compile
    """

    # The model (GPTConfig's fields).
    n_layer: int = setting(help="number of blocks")
    n_head: int = setting(help="attention heads per block")
    n_embd: int = setting(help="width of the residual stream (C)")
    block_size: int = setting(help="context length (T)")
    dropout: float = setting(0.0, help="dropout probability")
    activation: str = setting(
        "gelu",
        help="the dense MLP's: gelu, relu, gelu_tanh (GPT-2's) or relu2",
        choices=ACTIVATIONS,
    )
    bias: bool = setting(True, help="biases in the linear layers and norms (Llama has none)")
    tie_embeddings: bool = setting(True, help="the unembedding is the token embedding's weight")
    # The modern block's parts (GPTConfig's fields; the defaults are GPT-2's block).
    norm: str = setting("layernorm", help="layernorm (GPT-2) or rmsnorm (Llama)", choices=NORMS)
    mlp: str = setting(
        "dense", help="dense (GPT-2's MLP) or swiglu (Llama's gated MLP)", choices=MLPS
    )
    d_ff: int | None = setting(None, help="the MLP's hidden width (none: 4 * n_embd)")
    n_kv_head: int | None = setting(
        None, help="key/value heads: grouped-query attention (none: n_head)"
    )
    qk_norm: bool = setting(False, help="RMSNorm on each head's queries and keys")
    parallel_residual: bool = setting(False, help="x + attn(norm(x)) + mlp(norm(x)), as GPT-J")
    position: str = setting(
        "learned", help="learned (GPT-2's embedding), rope (rotary) or none", choices=POSITIONS
    )
    rotary_dim: int | None = setting(None, help="with rope: channels rotated per head (none: all)")
    rope_theta: float = setting(10000.0, help="with rope: the angles' base")
    rope_pairing: str = setting(
        "halves",
        help="with rope: halves (i, i + hs/2; Hugging Face) or adjacent (2i, 2i + 1; the paper)",
        choices=PAIRINGS,
    )
    bigram: bool = setting(
        False, help="add an embedding of each (previous token, token) pair (modded-nanogpt)"
    )
    smear: bool = setting(
        False, help="add a gated part of each position's embedding to the next (modded-nanogpt)"
    )
    # The output side (GPTConfig's fields; issue 22).
    zero_init_proj: bool = setting(
        False, help="start the blocks' output projections (and an untied head) at zero"
    )
    logit_softcap: float | None = setting(
        None, help="squash the logits to cap * tanh(logits / cap) (none: no cap)"
    )
    # How to train it (TrainConfig's fields).
    batch_size: int = setting(
        DEFAULTS.batch_size, help="sequences per step, all processes together"
    )
    max_iters: int = setting(DEFAULTS.max_iters, help="optimizer steps")
    lr: float = setting(
        DEFAULTS.lr,
        help="peak learning rate (AdamW's; the embeddings', norms' and biases' with Muon)",
    )
    min_lr_ratio: float = setting(DEFAULTS.min_lr_ratio, help="the schedule ends at lr * this")
    warmup: int = setting(DEFAULTS.warmup, help="linear warmup steps")
    schedule: str = setting(
        DEFAULTS.schedule,
        help="after the warmup: cosine, or wsd (flat, then a linear decay)",
        choices=SCHEDULES,
    )
    decay_fraction: float = setting(
        DEFAULTS.decay_fraction, help="wsd: the last fraction of the run that decays"
    )
    optimizer: str = setting(
        DEFAULTS.optimizer,
        help="adamw, or muon (Muon for the blocks' matrices, AdamW for the rest)",
        choices=OPTIMIZERS,
    )
    muon_lr: float = setting(DEFAULTS.muon_lr, help="Muon's peak learning rate")
    muon_momentum: float = setting(DEFAULTS.muon_momentum, help="Muon's (Nesterov) momentum")
    weight_decay: float = setting(
        DEFAULTS.weight_decay, help="AdamW's weight decay, on matrices and embeddings"
    )
    beta2: float = setting(DEFAULTS.beta2, help="AdamW's second-moment decay")
    eval_interval: int = setting(
        DEFAULTS.eval_interval, help="steps between loss estimates and checkpoints"
    )
    eval_iters: int = setting(DEFAULTS.eval_iters, help="batches per loss estimate")
    dtype: str = setting(
        DEFAULTS.dtype,
        help="float32, an autocast dtype, or auto: bfloat16 where the device has it",
        choices=DTYPES,
    )
    # How to read the text.
    tokenizer: str = setting(
        "char",
        help="char: a token per character; bpe: byte-level BPE learnt from the training part "
        "of the text (never the validation part), --vocab-size tokens",
        choices=TOKENIZERS,
    )
    vocab_size: int | None = setting(None, help="BPE's vocabulary (>= 256); bpe only")
    # Where and how to run.
    seed: int = setting(DEFAULTS.seed, help="seed for weights, batches, dropout")
    device: str = setting("auto", help="cpu, cuda, cuda:N, mps, or auto")
    compile: bool = setting(DEFAULTS.compile, help="torch.compile the model")

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value, choices = getattr(self, f.name), f.metadata["choices"]
            if choices and value not in choices:
                raise UserValueError(f"{f.name} must be one of {choices}, got {value!r}")
        if self.tokenizer == "char" and self.vocab_size is not None:
            raise UserValueError("vocab_size applies to tokenizer='bpe' (--tokenizer bpe) only")
        if self.tokenizer == "bpe" and self.vocab_size is None:
            raise UserValueError(
                "tokenizer='bpe' needs a vocab_size (--vocab-size N, at least 256)"
            )
        # Every other value is checked by the config it feeds, with the config's own message.
        self.model_config(vocab_size=1)
        self.train_config(dtype="float32" if self.dtype == "auto" else self.dtype, device="cpu")

    def model_config(self, vocab_size: int) -> GPTConfig:
        """The ``GPTConfig`` of these settings, for a tokenizer of ``vocab_size`` tokens (the
        tokenizer's size, which for BPE is the ``vocab_size`` setting, is the model's)."""
        return GPTConfig(**(self._fields_of(GPTConfig) | {"vocab_size": vocab_size}))

    def train_config(self, **resolved: Any) -> TrainConfig:
        """The ``TrainConfig`` of these settings; ``resolved`` replaces fields the caller has
        worked out (``device="auto"`` and ``dtype="auto"`` become what this machine has)."""
        return TrainConfig(**(self._fields_of(TrainConfig) | resolved))

    def replace(self, overrides: Mapping[str, Any]) -> RunSettings:
        """These settings with ``overrides`` put over them; a None value keeps the setting."""
        for name in overrides:
            if name not in SETTINGS:
                raise UserValueError(
                    f"unknown setting {name!r}; the settings are {', '.join(SETTINGS)}"
                )
        changes = {k: v for k, v in overrides.items() if v is not None}
        settings = dataclasses.replace(self, **changes) if changes else self
        for name in changes:
            other, needed = APPLIES_TO.get(name, (None, None))
            if other is not None and getattr(settings, other) != needed:
                flag = f"--{other.replace('_', '-')} {needed}"
                raise UserValueError(
                    f"{name} applies to {other}={needed!r} ({flag}) only; this run's {other} "
                    f"is {getattr(settings, other)!r}"
                )
        return settings

    def _fields_of(self, config: type) -> dict[str, Any]:
        names = {f.name for f in dataclasses.fields(config)}
        return {name: getattr(self, name) for name in SETTINGS if name in names}


SETTINGS = tuple(f.name for f in dataclasses.fields(RunSettings))
