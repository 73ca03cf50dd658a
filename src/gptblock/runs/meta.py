"""What a GPT training run records about itself: ``RunMeta``, written and validated here only.

Every checkpoint carries, beside the trainer's own fields::

    "model_config": {"vocab_size": 65, "block_size": 64, "n_layer": 4, ...}   GPTConfig
    "vocab": ["\\n", " ", "!", ...]                                            CharTokenizer
    or "tokenizer": {"kind": "bpe", "json": "..."}                           BPETokenizer
    "data": {"source": "input.txt", "characters": 1115394, "sha256": "..."}  CorpusInfo

``from_checkpoint`` checks each field and that they agree, so a reader sees a typed object or a
``CheckpointError`` naming the field. ``check_resume`` refuses another model, vocabulary or text
(by size and SHA-256) unless ``allow_other_data``; a 0.1 run without a hash is checked by size.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..blocks.config import GPTConfig, applicable
from ..data.batches import CharTokenizer
from ..data.bpe import BPETokenizer
from ..errors import UserTypeError, UserValueError
from ..model.footprint import FLOAT, check_available, parameter_count
from .checkpoint import Checkpoint, CheckpointError, check_same_field, is_count, require_fields

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

    def describe(self) -> str:
        """Where the text came from and its fingerprint, for messages."""
        sha = f"SHA-256 {self.sha256[:16]}..." if self.sha256 else "no hash recorded"
        return f"{self.source!r} ({self.characters:,} characters, {sha})"

    def same_text(self, other: CorpusInfo) -> bool | None:
        """Whether ``other`` fingerprints the same text: None if that cannot be told (a hash is
        missing and the sizes agree). The source is a name, not part of the fingerprint."""
        if self.characters != other.characters:
            return False
        if self.sha256 is None or other.sha256 is None:
            return None
        return self.sha256 == other.sha256


@dataclass(frozen=True)
class RunMeta:
    """A GPT run's model shape, vocabulary and corpus: the JSON fields its checkpoints carry.

    ``allow_other_data`` (not saved) lets ``check_resume`` accept another text, with a warning.

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
    tokenizer: CharTokenizer | BPETokenizer
    corpus: CorpusInfo | None = None
    allow_other_data: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.model_config, GPTConfig):
            raise UserTypeError(f"model_config must be a GPTConfig, got {self.model_config!r:.80}")
        if not isinstance(self.tokenizer, (CharTokenizer, BPETokenizer)):
            raise UserTypeError(
                f"tokenizer must be a CharTokenizer or BPETokenizer, got {self.tokenizer!r:.80}"
            )
        if self.corpus is not None and not isinstance(self.corpus, CorpusInfo):
            raise UserTypeError(f"corpus must be a CorpusInfo or None, got {self.corpus!r:.80}")
        if not isinstance(self.allow_other_data, bool):
            raise UserTypeError(f"allow_other_data must be a bool, got {self.allow_other_data!r}")
        if self.tokenizer.vocab_size != self.model_config.vocab_size:
            raise UserValueError(
                f"the vocabulary has {self.tokenizer.vocab_size} "
                f"{'characters' if isinstance(self.tokenizer, CharTokenizer) else 'tokens'} "
                f"but model_config "
                f"says vocab_size={self.model_config.vocab_size}"
            )

    def to_json(self) -> dict[str, Any]:
        """The JSON fields, as saved in every checkpoint."""
        out: dict[str, Any] = {"model_config": dataclasses.asdict(self.model_config)}
        if isinstance(self.tokenizer, BPETokenizer):
            out["tokenizer"] = {"kind": "bpe", "json": self.tokenizer.to_json()}
        else:
            out["vocab"] = self.tokenizer.to_json()
        if self.corpus is not None:
            out["data"] = dataclasses.asdict(self.corpus)
        return out

    @classmethod
    def from_json(cls, meta: Mapping[str, Any], where: object) -> RunMeta:
        """Read and check the fields written by ``to_json``; ``where`` names the file in errors."""
        vocab = "tokenizer" if "tokenizer" in meta else "vocab"
        require_fields(meta, where, ("model_config", vocab))
        if not isinstance(meta["model_config"], dict):
            raise CheckpointError(f"{where}: field 'model_config' must be an object")
        try:
            # A value that could not act (stored before such values were refused) is dropped.
            config = GPTConfig(**applicable(GPTConfig, meta["model_config"]))
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"{where}: invalid field 'model_config' ({e})") from None
        tokenizer = _tokenizer(meta, vocab, where)
        corpus = _corpus(meta.get("data"), where)
        try:
            return cls(config, tokenizer, corpus)
        except ValueError as e:
            raise CheckpointError(f"{where}: {e}") from None

    @classmethod
    def from_checkpoint(cls, ckpt: Checkpoint) -> RunMeta:
        """The run metadata of a loaded checkpoint (see ``from_json``), its model_config checked
        against the tensors the checkpoint holds and the memory the model would take, before
        anything builds it (an edited, re-hashed n_embd=1000000 is refused here)."""
        if ckpt.meta.get("version") == 1:
            _check_format_1(ckpt)
        meta = cls.from_json(ckpt.meta, ckpt.path)
        _check_fits(ckpt, meta.model_config)
        return meta

    def check_resume(self, ckpt: Checkpoint) -> None:
        """Refuse to resume ``ckpt`` unless it is a run of this model, vocabulary and text (by
        its fingerprint, not its file name); another text only with ``allow_other_data``."""
        saved_meta = self.from_checkpoint(ckpt)
        saved, mine = saved_meta.to_json(), self.to_json()
        # The tokenizer's kind first: another kind also changes vocab_size, and "a different
        # model_config" would hide the cause.
        kinds = saved_meta.tokenizer.kind, self.tokenizer.kind
        if kinds[0] != kinds[1]:
            raise CheckpointError(
                f"{ckpt.path}: a different tokenizer: {kinds[0]} in the checkpoint, {kinds[1]} now"
            )
        check_same_field(ckpt, "model_config", saved["model_config"], mine["model_config"])
        name = "vocab" if kinds[0] == "char" else "tokenizer"
        check_same_field(ckpt, name, saved[name], mine[name])
        theirs, ours = saved_meta.corpus, self.corpus
        if theirs is None or ours is None:
            return
        same = theirs.same_text(ours)
        both = (
            f"the checkpoint was trained on {theirs.describe()}, this run reads {ours.describe()}"
        )
        if same is False and not self.allow_other_data:
            raise CheckpointError(
                f"{ckpt.path}: other data: {both}; resume on the same text, or pass "
                f"--allow-other-data (allow_other_data=True) to continue on this one"
            )
        if same is False:
            warnings.warn(f"resuming on other data, as allowed: {both}", UserWarning, stacklevel=3)
        elif same is None:
            warnings.warn(
                f"{ckpt.path} recorded no hash of its text, so resuming cannot verify that "
                f"{ours.describe()} is the text it was trained on (their sizes agree)",
                UserWarning,
                stacklevel=3,
            )


def _tokenizer(meta: Mapping[str, Any], field: str, where: object) -> CharTokenizer | BPETokenizer:
    value = meta[field]
    try:
        if field == "vocab":
            return CharTokenizer.from_json(value)
        if not isinstance(value, dict) or value.get("kind") != "bpe" or "json" not in value:
            raise UserValueError('expected {"kind": "bpe", "json": "..."}')
        return BPETokenizer.from_json(value["json"])
    except (TypeError, ValueError, ImportError) as e:
        raise CheckpointError(f"{where}: invalid field {field!r} ({e})") from None


def _corpus(value: object, where: object) -> CorpusInfo | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise CheckpointError(f"{where}: field 'data' must be an object, got {value!r:.80}")
    source, characters, sha = value.get("source"), value.get("characters"), value.get("sha256")
    if not isinstance(source, str):
        raise CheckpointError(f"{where}: field 'data.source' must be a string, got {source!r:.80}")
    if not is_count(characters):
        raise CheckpointError(
            f"{where}: field 'data.characters' must be an int >= 0, got {characters!r:.80}"
        )
    if sha is not None and not (isinstance(sha, str) and len(sha) == 64):
        raise CheckpointError(f"{where}: field 'data.sha256' must be a SHA-256 hex digest")
    return CorpusInfo(source, characters, sha)


def _check_fits(ckpt: Checkpoint, config: GPTConfig) -> None:
    """Refuse a ``model_config`` whose embeddings or depth differ from the saved weights', or
    whose model would not fit in memory; reads shapes only, allocates nothing."""
    tensors = ckpt.tensors
    wanted = {
        "model.transformer.wte.weight": (config.vocab_size, config.n_embd),
        "model.transformer.wpe.weight": (config.block_size, config.n_embd),
    }
    for name, shape in wanted.items():
        if name in tensors and tuple(tensors[name].shape) != shape:
            raise CheckpointError(
                f"{ckpt.path}: model_config (vocab_size={config.vocab_size}, block_size="
                f"{config.block_size}, n_embd={config.n_embd}) does not fit {name} of shape "
                f"{tuple(tensors[name].shape)} in {ckpt.tensors_path.name}"
            )
    layers = {k.split(".")[3] for k in tensors if k.startswith("model.transformer.h.")}
    if "model.transformer.wte.weight" in tensors and len(layers) != config.n_layer:
        raise CheckpointError(
            f"{ckpt.path}: model_config n_layer={config.n_layer}, but "
            f"{ckpt.tensors_path.name} holds the weights of {len(layers)} block(s)"
        )
    check_available(
        parameter_count(config) * FLOAT,
        "cpu",
        f"{ckpt.path}: its model_config (n_layer={config.n_layer}, n_embd={config.n_embd})",
        "the model does not fit in this machine's memory",
    )


# What gptblock 0.1 and 0.2 wrote in a format-1 checkpoint, whose fields carry no hash: a file
# holding anything else was edited, or written by something else.
FORMAT_1_MODEL_FIELDS = {
    "vocab_size", "block_size", "n_layer", "n_head", "n_embd", "dropout", "bias", "activation",
    "block",
}  # fmt: skip
FORMAT_1_DATA_FIELDS = {"source", "characters", "sha256"}


def _check_format_1(ckpt: Checkpoint) -> None:
    """Refuse a format-1 checkpoint holding what format 1 could not: a BPE tokenizer, a model
    field added later, or a vocabulary out of the sorted order ``CharTokenizer.from_text`` gave
    it (the characters of a swapped vocabulary, say)."""
    meta = ckpt.meta
    problem = ""
    config, vocab, data = meta.get("model_config"), meta.get("vocab"), meta.get("data")
    if "tokenizer" in meta:
        problem = "a field 'tokenizer' (BPE came with format 2)"
    elif isinstance(config, dict) and set(config) - FORMAT_1_MODEL_FIELDS:
        problem = f"model_config field(s) {sorted(set(config) - FORMAT_1_MODEL_FIELDS)}"
    elif isinstance(data, dict) and set(data) - FORMAT_1_DATA_FIELDS:
        problem = f"data field(s) {sorted(set(data) - FORMAT_1_DATA_FIELDS)}"
    elif (
        isinstance(vocab, list)
        and all(isinstance(c, str) for c in vocab)
        and any(not a < b for a, b in itertools.pairwise(vocab))
    ):
        problem = "a vocab out of sorted order (gptblock 0.1 and 0.2 sorted it)"
    if problem:
        raise CheckpointError(
            f"{ckpt.path}: a format-1 checkpoint with {problem}: no gptblock wrote that, so the "
            f"file was edited; restore it or train again"
        )
