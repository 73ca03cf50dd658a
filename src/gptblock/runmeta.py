"""What a GPT training run records about itself: ``RunMeta``, written and validated here only.

Every checkpoint of a ``gptblock train`` run carries three JSON fields beside the trainer's own
(step, optimizer, history): the model's shape, its vocabulary and the text it learned from::

    "model_config": {"vocab_size": 65, "block_size": 64, "n_layer": 4, ...}   GPTConfig
    "vocab": ["\\n", " ", "!", ...]                                            CharTokenizer
    "data": {"source": "input.txt", "characters": 1115394, "sha256": "..."}  CorpusInfo

``RunMeta.to_json`` writes them and ``RunMeta.from_checkpoint`` reads them back, checking each
field's type and that the three agree (the vocabulary has ``vocab_size`` characters), so
``load_gpt``, ``gptblock sample`` and a resumed run see a typed object or a ``CheckpointError``
naming the field, never a ``KeyError``. Runs saved before the corpus hash was recorded load
with ``sha256`` None.

The trainer stays ignorant of all this (it is model-agnostic): it saves ``to_json()`` with every
checkpoint and, on resume, asks ``check_resume`` whether a checkpoint belongs to this run.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .checkpoint import Checkpoint, CheckpointError, check_same_field
from .config import GPTConfig
from .data import CharTokenizer
from .errors import UserTypeError, UserValueError

__all__ = ["CorpusInfo", "RunMeta"]


@dataclass(frozen=True)
class CorpusInfo:
    """Where a run's text came from, and a fingerprint of it.

    Example:
        >>> info = CorpusInfo.of("hello", "greeting.txt")
        >>> info.characters, info.sha256[:12]
        (5, '2cf24dba5fb0')
    """

    source: str  # the file's path as given, or a description of a built-in corpus
    characters: int  # the text's length in characters
    sha256: str | None = None  # of the text's UTF-8 bytes; None in runs saved before 0.2

    @classmethod
    def of(cls, text: str, source: str) -> CorpusInfo:
        """The info of ``text``, read from ``source``."""
        return cls(source, len(text), hashlib.sha256(text.encode("utf-8")).hexdigest())


@dataclass(frozen=True)
class RunMeta:
    """A GPT run's model shape, vocabulary and corpus: the JSON fields its checkpoints carry.

    Args:
        model_config: the GPT's shape.
        tokenizer: the character vocabulary; ``tokenizer.vocab_size == model_config.vocab_size``.
        corpus: the text the run trains on; None for a run that did not record it.

    Example:
        >>> tok = CharTokenizer.from_text("hello world")
        >>> config = GPTConfig(tok.vocab_size, block_size=8, n_layer=1, n_head=1, n_embd=8)
        >>> meta = RunMeta(config, tok, CorpusInfo.of("hello world", "hello.txt"))
        >>> sorted(meta.to_json())
        ['data', 'model_config', 'vocab']
        >>> RunMeta.from_json(meta.to_json(), "hello.json") == meta
        True
    """

    model_config: GPTConfig
    tokenizer: CharTokenizer
    corpus: CorpusInfo | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.model_config, GPTConfig):
            raise UserTypeError(f"model_config must be a GPTConfig, got {self.model_config!r:.80}")
        if not isinstance(self.tokenizer, CharTokenizer):
            raise UserTypeError(f"tokenizer must be a CharTokenizer, got {self.tokenizer!r:.80}")
        if self.tokenizer.vocab_size != self.model_config.vocab_size:
            raise UserValueError(
                f"the vocabulary has {self.tokenizer.vocab_size} characters but model_config "
                f"says vocab_size={self.model_config.vocab_size}"
            )

    def to_json(self) -> dict[str, Any]:
        """The JSON fields, as saved in every checkpoint."""
        out: dict[str, Any] = {
            "model_config": dataclasses.asdict(self.model_config),
            "vocab": self.tokenizer.to_json(),
        }
        if self.corpus is not None:
            out["data"] = dataclasses.asdict(self.corpus)
        return out

    @classmethod
    def from_json(cls, meta: Mapping[str, Any], where: object) -> RunMeta:
        """Read and check the fields written by ``to_json``; ``where`` names the file in errors.

        Raises:
            CheckpointError: a field is missing, of the wrong type, or inconsistent.
        """
        missing = [f for f in ("model_config", "vocab") if f not in meta]
        if missing:
            raise CheckpointError(f"{where}: missing field(s) {', '.join(missing)}")
        if not isinstance(meta["model_config"], dict):
            raise CheckpointError(f"{where}: field 'model_config' must be an object")
        try:
            config = GPTConfig(**meta["model_config"])
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"{where}: invalid field 'model_config' ({e})") from None
        try:
            tokenizer = CharTokenizer.from_json(meta["vocab"])
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"{where}: invalid field 'vocab' ({e})") from None
        corpus = _corpus(meta.get("data"), where)
        try:
            return cls(config, tokenizer, corpus)
        except ValueError as e:
            raise CheckpointError(f"{where}: {e}") from None

    @classmethod
    def from_checkpoint(cls, ckpt: Checkpoint) -> RunMeta:
        """The run metadata of a loaded checkpoint (see ``from_json``)."""
        return cls.from_json(ckpt.meta, ckpt.path)

    def check_resume(self, ckpt: Checkpoint) -> None:
        """Refuse to resume ``ckpt`` unless it is a run of this model on this vocabulary.

        The corpus may differ (a file moved); its fingerprint is recorded, not enforced here.

        Raises:
            CheckpointError: naming every differing field with both values.
        """
        saved = self.from_checkpoint(ckpt).to_json()
        mine = self.to_json()
        for field in ("model_config", "vocab"):
            check_same_field(ckpt, field, saved[field], mine[field])


def _corpus(value: object, where: object) -> CorpusInfo | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise CheckpointError(f"{where}: field 'data' must be an object, got {value!r:.80}")
    source, characters, sha = value.get("source"), value.get("characters"), value.get("sha256")
    if not isinstance(source, str):
        raise CheckpointError(f"{where}: field 'data.source' must be a string, got {source!r:.80}")
    if isinstance(characters, bool) or not isinstance(characters, int) or characters < 0:
        raise CheckpointError(
            f"{where}: field 'data.characters' must be an int >= 0, got {characters!r:.80}"
        )
    if sha is not None and not (isinstance(sha, str) and len(sha) == 64):
        raise CheckpointError(f"{where}: field 'data.sha256' must be a SHA-256 hex digest")
    return CorpusInfo(source, characters, sha)
