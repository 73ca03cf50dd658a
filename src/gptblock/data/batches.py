"""Text in, token batches out: a character tokenizer, the 90/10 split and the batches.

nanoGPT's ``shakespeare_char`` flow. Randomness comes only from a ``torch.Generator`` the caller
seeds and owns (never the global RNG), so a resumed run draws the batches an uninterrupted one
would.

Shapes: B batch, T time (``block_size``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from ..blocks.config import check_positive_int
from ..errors import UserTypeError, UserValueError

__all__ = [
    "CharTokenizer",
    "TokenSplits",
    "Tokenizer",
    "full_windows",
    "get_batch",
    "split_text",
    "split_tokens",
    "token_splits",
]

TRAIN_TENTHS = 9  # the first 90% trains, the last 10% validates, as in nanoGPT


class Tokenizer(Protocol):
    """What a run needs of its tokenizer: ``CharTokenizer``, or ``gptblock.data.bpe.BPETokenizer``."""

    kind: str  # "char" or "bpe": how a checkpoint records it

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int] | torch.Tensor) -> str: ...

    def unknown(self, text: str) -> list[str]: ...


class CharTokenizer:
    """Characters to token ids and back: ``chars``, one distinct character per id, saved as a
    JSON list (``to_json`` / ``from_json``).

    Example:
        >>> tok = CharTokenizer.from_text("hello world")
        >>> tok.vocab_size
        8
        >>> tok.encode("hello")
        [3, 2, 4, 4, 5]
        >>> tok.decode(tok.encode("hello"))
        'hello'
        >>> CharTokenizer.from_json(tok.to_json()) == tok
        True
        >>> tok.encode("hi!")
        Traceback (most recent call last):
        ...
        gptblock.errors.UserValueError: text has 2 characters outside the vocabulary: '!', 'i'
    """

    kind = "char"

    def __init__(self, chars: list[str] | tuple[str, ...]) -> None:
        if not isinstance(chars, (list, tuple)) or not all(
            isinstance(c, str) and len(c) == 1 for c in chars
        ):
            raise UserTypeError(f"chars must be a list of single characters, got {chars!r:.80}")
        if not chars:
            raise UserValueError("a tokenizer needs at least one character, got none")
        if len(set(chars)) != len(chars):
            raise UserValueError(f"chars must be distinct, got duplicates in {chars!r:.80}")
        self.chars: tuple[str, ...] = tuple(chars)
        self._ids = {c: i for i, c in enumerate(self.chars)}

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        """The tokenizer whose vocabulary is the sorted set of ``text``'s characters."""
        if not text:
            raise UserValueError("cannot build a vocabulary from an empty text")
        # The code points that occur, in order: sorted(set(text)) without a Python object per
        # character (12 ms for Tiny Shakespeare's 1.1 MB, against 2 ms).
        present = np.flatnonzero(np.bincount(_code_points(text)))  # (V,) sorted code points
        return cls([chr(c) for c in present])

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def unknown(self, text: str) -> list[str]:
        """The characters of ``text`` that are not in the vocabulary, sorted."""
        return sorted(set(text) - self._ids.keys())

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; raises ``ValueError`` listing any unknown characters."""
        missing = self.unknown(text)
        if missing:
            listed = ", ".join(repr(c) for c in missing[:20])
            more = f" (and {len(missing) - 20} more)" if len(missing) > 20 else ""
            raise UserValueError(
                f"text has {len(missing)} characters outside the vocabulary: {listed}{more}"
            )
        return [self._ids[c] for c in text]

    def encode_tensor(self, text: str) -> torch.Tensor:
        """``encode(text)`` as a 1-D int64 tensor: 12 bytes a character at the peak, against a
        list's 36.

        Example:
            >>> tok = CharTokenizer.from_text("hello world")
            >>> tok.encode_tensor("hello").tolist() == tok.encode("hello")
            True
        """
        if not isinstance(text, str):
            raise UserTypeError(f"text must be a str, got {type(text).__name__}")
        codes = _code_points(text)  # (N,)
        # One lookup in a table indexed by code point, -1 where no id (63 ms for Tiny
        # Shakespeare by a binary search per character, 3 ms so): 4 + 8 bytes per character,
        # and 8 per code point up to the largest (9 MB at most, for the last plane).
        vocab = np.array([ord(c) for c in self.chars], dtype=np.int64)  # (V,) in id order
        top = max(int(vocab.max()), int(codes.max()) if codes.size else 0)
        table = np.full(top + 1, -1, dtype=np.int64)  # (top + 1,)
        table[vocab] = np.arange(len(vocab))
        ids = table[codes]  # (N,) int64
        if codes.size and int(ids.min()) < 0:
            self.encode(text)  # raises, listing the unknown characters
        return torch.from_numpy(ids)  # (N,)

    def decode(self, ids: list[int] | torch.Tensor) -> str:
        """The text of token ids (a list or a 1-D integer tensor), each in [0, vocab_size)."""
        if isinstance(ids, torch.Tensor):
            if ids.dim() > 1 or ids.is_floating_point() or ids.dtype == torch.bool:
                raise UserTypeError(
                    f"decode takes a 1-D integer tensor of token ids, got {ids.dtype} of shape "
                    f"{tuple(ids.shape)} (decode one row at a time: tok.decode(out[0]))"
                )
            ids = ids.tolist()
        if not isinstance(ids, (list, tuple)) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in ids
        ):
            raise UserTypeError(f"decode takes a list of int token ids, got {ids!r:.80}")
        # Python would read a negative id from the end of the vocabulary: refuse it instead.
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise UserValueError(
                f"token ids {bad[:10]} are outside the vocabulary [0, {self.vocab_size})"
            )
        return "".join(self.chars[i] for i in ids)

    def to_json(self) -> list[str]:
        return list(self.chars)

    @classmethod
    def from_json(cls, value: object) -> CharTokenizer:
        """The tokenizer saved by ``to_json``; ``ValueError``/``TypeError`` if malformed."""
        if not isinstance(value, list):
            raise UserTypeError(f"a saved vocabulary is a list of characters, got {value!r:.80}")
        return cls(value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CharTokenizer) and self.chars == other.chars

    def __hash__(self) -> int:
        return hash(self.chars)

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"


@dataclass(frozen=True)
class TokenSplits:
    """Token ids of the training and validation parts of one text: 1-D int64 tensors."""

    train: torch.Tensor  # (N_train,) the first 90% of the text
    val: torch.Tensor  # (N_val,) the rest

    def __post_init__(self) -> None:
        for name in ("train", "val"):
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor) or t.dtype != torch.long or t.dim() != 1:
                got = f"{t.dtype} of shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else t
                raise UserTypeError(
                    f"TokenSplits.{name} must be a 1-D int64 tensor of token ids, got {got!r:.80}"
                    " (torch.tensor(ids, dtype=torch.long))"
                )


def _n_train(n: int) -> int:
    # Integer arithmetic: int(0.9 * n) rounds differently for some n.
    return n * TRAIN_TENTHS // 10


def split_tokens(ids: list[int] | torch.Tensor, block_size: int) -> TokenSplits:
    """Split token ids 90% / 10%, checking each part holds a window of ``block_size + 1``.

    Example:
        >>> s = split_tokens(list(range(100)), block_size=8)
        >>> s.train.shape, s.val.shape, int(s.val[0])
        (torch.Size([90]), torch.Size([10]), 90)
        >>> split_tokens(list(range(50)), block_size=8)
        Traceback (most recent call last):
        ...
        gptblock.errors.UserValueError: the text is too short for block_size=8: its validation part (the last 10%) has 5 tokens, and a window needs 9; use a longer text (at least 81 characters) or a smaller --block-size
    """
    data = torch.as_tensor(ids, dtype=torch.long)
    n = _n_train(len(data))
    return token_splits(data[:n], data[n:], block_size)


def split_text(text: str) -> tuple[str, str]:
    """The first 90% of ``text``'s characters and the rest, for BPE to learn from the first.

    Example:
        >>> split_text("abcdefghij")
        ('abcdefghi', 'j')
    """
    n = _n_train(len(text))
    return text[:n], text[n:]


def token_splits(
    train: list[int] | torch.Tensor, val: list[int] | torch.Tensor, block_size: int
) -> TokenSplits:
    """``TokenSplits`` of two parts' ids, checking each holds at least one training window."""
    check_positive_int("block_size", block_size)
    train, val = torch.as_tensor(train, dtype=torch.long), torch.as_tensor(val, dtype=torch.long)
    need = block_size + 1
    for name, part in (
        ("training part (the first 90%)", train),
        ("validation part (the last 10%)", val),
    ):
        if len(part) < need:
            # The shortest text of m tokens whose parts both hold a window: the validation
            # part, m - floor(9m / 10) = ceil(m / 10) tokens, needs m >= 10 * need - 9, the
            # training part 9m // 10 >= need (for need = 1, m = 2). A formula, not a search:
            # a search takes minutes for block_size=10^9.
            at_least = max(10 * need - 9, -(-10 * need // TRAIN_TENTHS), need)
            raise UserValueError(
                f"the text is too short for block_size={block_size}: its {name} has "
                f"{len(part)} tokens, and a window needs {need}; use a longer text "
                f"(at least {at_least} characters) or a smaller --block-size"
            )
    return TokenSplits(train, val)


def get_batch(
    data: torch.Tensor,
    block_size: int,
    batch_size: int,
    generator: torch.Generator,
    *,
    rank: int = 0,
    world_size: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's share of ``batch_size`` random windows: ``x``, ``y`` (B, T), ``y`` the next
    tokens. Every rank draws the same global batch (one ``generator`` draw) and keeps its rows,
    so N processes see the batch one would (nanoGPT's ``seed + rank`` cannot).

    Example:
        >>> data = torch.arange(100)
        >>> x, y = get_batch(data, 8, 4, torch.Generator().manual_seed(0))
        >>> x.shape, bool((y == x + 1).all())
        (torch.Size([4, 8]), True)
        >>> x1, _ = get_batch(data, 8, 4, torch.Generator().manual_seed(0), rank=1, world_size=2)
        >>> torch.equal(x1, x[2:])
        True
    """
    if batch_size % world_size != 0:
        raise UserValueError(
            f"batch_size={batch_size} must be divisible by the number of processes {world_size}"
        )
    ix = torch.randint(len(data) - block_size, (batch_size,), generator=generator)  # (global B,)
    per_rank = batch_size // world_size
    ix = ix[rank * per_rank : (rank + 1) * per_rank]  # (B,)
    # One gather, no Python loop over the rows (and nothing read on the host).
    window = ix[:, None] + torch.arange(block_size)  # (B, 1) + (T,) -> (B, T) positions
    return data[window], data[window + 1]  # (B, T) each: inputs, and the next tokens


def full_windows(
    data: torch.Tensor, block_size: int, batch_size: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(x, y)`` batches (B', T) of windows at 0, T, 2T, ..., then (1, T') for the leftover:
    every token after the first predicted once (a sliding window would cost T times more).

    Example:
        >>> [tuple(x.shape) for x, _ in full_windows(torch.arange(14), 4, batch_size=2)]
        [(2, 4), (1, 4), (1, 1)]
    """
    check_positive_int("block_size", block_size)
    check_positive_int("batch_size", batch_size)
    n = len(data) - 1  # the number of (input, target) pairs
    if n < 1:
        raise UserValueError(f"need at least 2 tokens to predict one, got {len(data)}")
    n_full = n // block_size
    x = data[: n_full * block_size].view(n_full, block_size)  # (N, T)
    y = data[1 : n_full * block_size + 1].view(n_full, block_size)  # (N, T)
    out = [(x[i : i + batch_size], y[i : i + batch_size]) for i in range(0, n_full, batch_size)]
    if n_full * block_size < n:
        start = n_full * block_size
        out.append((data[None, start:n], data[None, start + 1 : n + 1]))  # (1, T')
    return out


def _code_points(text: str) -> np.ndarray:
    # (N,) uint32, a lone surrogate too, as ``ord`` gives it.
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
