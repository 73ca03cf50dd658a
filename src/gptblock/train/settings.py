"""``RunSettings``: everything that decides a GPT run, typed, each field a ``gptblock train`` flag.

It derives from ``GPTConfig`` and ``TrainConfig``, so each field is declared once, with its
``help`` and ``choices``; only the tokenizer, its ``vocab_size`` and ``"auto"`` for ``device``
and ``dtype`` are declared here. A preset is a ``RunSettings``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..blocks.config import GPTConfig, applicable, check_choices, option
from ..devices import AUTOCAST_DTYPES
from ..errors import UserValueError
from .config import TrainConfig

__all__ = ["SETTINGS", "TOKENIZERS", "RunSettings"]

TOKENIZERS = ("char", "bpe")
DTYPES = ("auto", *AUTOCAST_DTYPES)


@dataclass(frozen=True, kw_only=True)
class RunSettings(TrainConfig, GPTConfig):
    """The settings of a GPT run, validated when made by the configs they give.

    Example:
        >>> s = RunSettings(n_layer=2, n_head=2, n_embd=32, block_size=16)
        >>> s.model_config(vocab_size=65).n_embd, s.train_config().block_size
        (32, 16)
        >>> s.replace({"lr": None, "n_layer": 3}).n_layer  # None: keep the value
        3
        >>> s.replace({"rope_theta": 5e5})  # unused with learned positions: refused
        Traceback (most recent call last):
        ...
        gptblock.errors.UserValueError: rope_theta=500000.0 acts only with position='rope', but position is 'learned': change position too, or leave rope_theta out
        >>> s.replace({"layers": 3})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        gptblock.errors.UserValueError: unknown setting 'layers'; the settings are vocab_size, block_size, n_layer, n_head, n_embd, dropout, ..., tokenizer
    """

    vocab_size: int | None = option(  # type: ignore[assignment]  # the model's, from this
        None,
        "BPE's vocabulary (>= 256); bpe only (a character tokenizer's is the text's)",
        acts_with=("tokenizer", "bpe"),
    )
    device: str = option("auto", "cpu, cuda, cuda:N, mps, or auto")
    dtype: str = option(
        "float32", "float32, an autocast dtype, or auto: bfloat16 where the device has it", DTYPES
    )
    tokenizer: str = option(
        "char",
        "char: a token per character; bpe: byte-level BPE learnt from the training part of the "
        "text (never the validation part), --vocab-size tokens",
        TOKENIZERS,
    )

    def __post_init__(self) -> None:
        check_choices(self)  # vocab_size too: it acts only with tokenizer='bpe'
        if self.tokenizer == "bpe" and self.vocab_size is None:
            raise UserValueError(
                "tokenizer='bpe' needs a vocab_size (--vocab-size N, at least 256)"
            )
        # Every other value is checked by the config it feeds, with the config's own message.
        self.model_config(vocab_size=1)
        self.train_config(dtype="float32" if self.dtype == "auto" else self.dtype, device="cpu")

    def model_config(self, vocab_size: int) -> GPTConfig:
        """The ``GPTConfig`` of these settings, for a tokenizer of ``vocab_size`` tokens."""
        return GPTConfig(**(self._fields_of(GPTConfig) | {"vocab_size": vocab_size}))

    def train_config(self, **resolved: Any) -> TrainConfig:
        """The ``TrainConfig`` of these settings, ``resolved`` (device, dtype) put over them."""
        return TrainConfig(**(self._fields_of(TrainConfig) | resolved))

    def replace(self, overrides: Mapping[str, Any]) -> RunSettings:
        """These settings with ``overrides`` put over them; a None value keeps the setting."""
        for name in overrides:
            if name not in SETTINGS:
                raise UserValueError(
                    f"unknown setting {name!r}; the settings are {', '.join(SETTINGS)}"
                )
        changes = {k: v for k, v in overrides.items() if v is not None}
        if not changes:
            return self
        # A value of this preset's that the changes leave unable to act is dropped (not given:
        # it may be there for another setting's value); a given one is refused by the configs.
        values = {name: getattr(self, name) for name in SETTINGS} | changes
        return RunSettings(**applicable(RunSettings, values, given=changes))

    def _fields_of(self, config: type) -> dict[str, Any]:
        names = {f.name for f in dataclasses.fields(config)}
        return {name: getattr(self, name) for name in SETTINGS if name in names}


SETTINGS = tuple(f.name for f in dataclasses.fields(RunSettings))
