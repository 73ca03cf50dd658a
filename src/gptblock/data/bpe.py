"""Byte-level BPE, GPT-2's tokenizer kind, by Hugging Face's ``tokenizers`` (an optional extra,
imported on use).

``BPETokenizer`` is trained on a text or read from a Hugging Face directory; byte-level, so every
string encodes. ``tokenizers_of`` exports a character vocabulary as BPE without merges (decoded
by ``Fuse``); ``as_char_tokenizer`` reads such a file back as the ``CharTokenizer`` it was.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ..blocks.config import check_positive_int
from ..errors import UserFileNotFoundError, UserImportError, UserTypeError, UserValueError
from .batches import CharTokenizer

__all__ = ["BPETokenizer", "as_char_tokenizer", "tokenizers_of"]

INSTALL = 'pip install "gptblock[hf]"'
MIN_VOCAB = 256  # the byte alphabet: every byte must have a token


def _tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError:
        raise UserImportError(
            f"BPE needs Hugging Face tokenizers, an optional extra: {INSTALL}"
        ) from None
    return tokenizers


class BPETokenizer:
    """Text to token ids and back by byte-level BPE, over a ``tokenizers.Tokenizer``.

    Example:
        >>> tok = BPETokenizer.train("the cat sat on the mat. " * 50, vocab_size=262)
        >>> tok.vocab_size
        262
        >>> tok.decode(tok.encode("the cat, naïve"))
        'the cat, naïve'
        >>> len(tok.encode("the cat")) < len("the cat")   # merges learnt from the text
        True
        >>> BPETokenizer.from_json(tok.to_json()) == tok
        True
    """

    kind = "bpe"

    def __init__(self, tokenizer: Any) -> None:
        if type(tokenizer).__name__ != "Tokenizer":
            raise UserTypeError(f"expected a tokenizers.Tokenizer, got {type(tokenizer).__name__}")
        self.tokenizer = tokenizer

    @classmethod
    def train(cls, text: str, vocab_size: int) -> BPETokenizer:
        """Learn up to ``vocab_size - 256`` merges from ``text`` on top of the 256 byte tokens
        (fewer when the text has no more pairs to merge)."""
        check_positive_int("vocab_size", vocab_size)
        if vocab_size < MIN_VOCAB:
            raise UserValueError(
                f"vocab_size must be at least {MIN_VOCAB} for byte-level BPE (one token per "
                f"byte), got {vocab_size}"
            )
        if not text:
            raise UserValueError("cannot train a tokenizer on an empty text")
        # Each merge joins a pair of the text's tokens, so a text of n bytes has at most n - 1
        # to learn: a larger vocab_size learns the same ones, and the library, asked for 10^9,
        # aborts the process while reserving room for them.
        vocab_size = min(vocab_size, MIN_VOCAB + len(text.encode("utf-8")))
        tk = _tokenizers()
        tokenizer = _byte_level(tk, tk.models.BPE())
        trainer = tk.trainers.BpeTrainer(
            vocab_size=vocab_size,
            initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tokenizer.train_from_iterator([text], trainer=trainer)
        return cls(tokenizer)

    @classmethod
    def from_directory(cls, directory: str | os.PathLike[str]) -> BPETokenizer:
        """The tokenizer a Hugging Face model directory carries."""
        d = Path(directory)
        tk = _tokenizers()
        if (d / "tokenizer.json").is_file():
            return cls(_read(d / "tokenizer.json", tk.Tokenizer.from_file))
        if (d / "vocab.json").is_file() and (d / "merges.txt").is_file():
            vocab, merges = str(d / "vocab.json"), str(d / "merges.txt")
            model = _read(d / "vocab.json", lambda _: tk.models.BPE.from_file(vocab, merges))
            return cls(_byte_level(tk, model))
        raise UserFileNotFoundError(
            f"no tokenizer in {d}: expected tokenizer.json, or vocab.json and merges.txt"
        )

    @property
    def vocab_size(self) -> int:
        return int(self.tokenizer.get_vocab_size())

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; every string has some."""
        return list(self.tokenizer.encode(text).ids)

    def decode(self, ids: Sequence[int] | torch.Tensor) -> str:
        """The text of token ids (a list or a 1-D tensor)."""
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise UserValueError(
                f"token ids {bad[:10]} are outside the vocabulary [0, {self.vocab_size})"
            )
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    def unknown(self, text: str) -> list[str]:
        """Characters ``encode`` cannot spell: none, for byte-level BPE."""
        return []

    def to_json(self) -> str:
        return str(self.tokenizer.to_str())

    @classmethod
    def from_json(cls, value: object) -> BPETokenizer:
        """The tokenizer saved by ``to_json``."""
        if not isinstance(value, str):
            raise UserTypeError(f"a saved BPE tokenizer is a JSON string, got {value!r:.80}")
        try:
            return cls(_tokenizers().Tokenizer.from_str(value))
        except Exception as e:  # tokenizers raises its own Exception type for bad JSON
            raise UserValueError(f"not a saved tokenizer ({e})") from None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BPETokenizer) and self.to_json() == other.to_json()

    def __hash__(self) -> int:
        return hash(self.to_json())

    def __repr__(self) -> str:
        return f"BPETokenizer(vocab_size={self.vocab_size})"


def _byte_level(tk: Any, model: Any) -> Any:
    tokenizer = tk.Tokenizer(model)
    tokenizer.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tk.decoders.ByteLevel()
    return tokenizer


def _read(path: Path, read: Callable[[str], Any]) -> Any:
    # A malformed file: the library's own exception, or a panic of its Rust code.
    try:
        return read(str(path))
    except BaseException as e:  # a Rust panic is a BaseException (PanicException)
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UserValueError(f"{path}: not a readable tokenizer ({first:.200})") from None


def tokenizers_of(tokenizer: CharTokenizer | BPETokenizer) -> Any:
    """The ``tokenizers.Tokenizer`` encoding and decoding as ``tokenizer`` does.

    Example:
        >>> tok = CharTokenizer.from_text("hello world")
        >>> hf = tokenizers_of(tok)
        >>> hf.encode("hello").ids == tok.encode("hello"), hf.decode(tok.encode("low hole"))
        (True, 'low hole')
        >>> as_char_tokenizer(BPETokenizer(hf)) == tok
        True
    """
    if isinstance(tokenizer, BPETokenizer):
        return tokenizer.tokenizer
    if not isinstance(tokenizer, CharTokenizer):
        raise UserTypeError(
            f"expected a CharTokenizer or BPETokenizer, got {type(tokenizer).__name__}"
        )
    tk = _tokenizers()
    vocab = {c: i for i, c in enumerate(tokenizer.chars)}
    hf = tk.Tokenizer(tk.models.BPE(vocab=vocab, merges=[]))
    hf.decoder = tk.decoders.Fuse()  # the characters joined, no space between
    return hf


def as_char_tokenizer(tokenizer: BPETokenizer) -> CharTokenizer | None:
    """The ``CharTokenizer`` ``tokenizer`` is, where its file is a character vocabulary as
    ``tokenizers_of`` writes one (and transformers saves it); else None."""
    spec = json.loads(tokenizer.to_json())
    model = spec.get("model") or {}
    plain: dict[str, Any] = {"type": "BPE", "merges": [], "dropout": None, "unk_token": None}
    plain |= {"continuing_subword_prefix": None, "end_of_word_suffix": None}
    post = spec.get("post_processor")
    if not (
        all(model.get(k) == v for k, v in plain.items())
        and not model.get("byte_fallback")
        and spec.get("normalizer") is spec.get("pre_tokenizer") is None
        and not spec.get("added_tokens")
        and spec.get("decoder") == {"type": "Fuse"}
        and (
            post is None
            or (
                post.get("type") == "TemplateProcessing"
                and not post.get("special_tokens")
                and post.get("single") == [{"Sequence": {"id": "A", "type_id": 0}}]
            )
        )
    ):
        return None
    vocab = model.get("vocab") or {}
    chars = sorted(vocab, key=vocab.__getitem__)
    if any(len(c) != 1 for c in chars) or [vocab[c] for c in chars] != list(range(len(chars))):
        return None
    return CharTokenizer(chars)
