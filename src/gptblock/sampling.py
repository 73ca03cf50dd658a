"""Text from a trained GPT: ``stream_text`` piece by piece as it is made, ``sample_text`` whole.

Either tokenizer (``CharTokenizer``, or byte-level BPE, whose tokens can be parts of a
character) gives whole characters.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import torch

from .blocks.config import check_seed
from .data.batches import Tokenizer
from .devices import native_bfloat16
from .errors import UserTypeError, UserValueError
from .model.generation.weights import WEIGHTS
from .model.gpt import GPT

__all__ = ["GENERATION_WEIGHTS", "generation_weights", "sample_text", "stream_text"]

GENERATION_WEIGHTS = ("auto", *WEIGHTS)  # what `gptblock sample --weights` takes


def generation_weights(
    name: str, device: torch.device | str, dtype: torch.dtype = torch.float32
) -> str:
    """The weights generation uses for ``name``, for a model on ``device`` with parameters of
    ``dtype``: ``"auto"`` is ``"int8"`` for a float32 model on a CPU with bfloat16 in hardware
    and ``"float32"`` (the model's own weights) elsewhere; any other name is itself.

    Why int8: on the default run's model, ``benchmarks/generation_precision.py`` measures the
    token rate of each form and the change of its loss over the validation split; int8 is the
    fastest form there, and changes that loss by less than 0.01 (benchmarks/README.md has the
    figures). Its kernel computes in bfloat16, emulated and slow on a CPU without it.

    Example:
        >>> generation_weights("bfloat16", "cpu")
        'bfloat16'
        >>> generation_weights("auto", "cpu") in ("int8", "float32")
        True
    """
    if name not in GENERATION_WEIGHTS:
        raise UserValueError(
            f"weights must be one of {', '.join(GENERATION_WEIGHTS)}, got {name!r:.40}"
        )
    if name != "auto":
        return name
    device = torch.device(device)
    fast = dtype == torch.float32 and device.type == "cpu" and native_bfloat16(device)
    return "int8" if fast else "float32"


def stream_text(
    model: GPT,
    tokenizer: Tokenizer,
    prompt: str | None = None,
    *,
    max_new_tokens: int = 500,
    temperature: float = 0.8,
    top_k: int | None = None,
    seed: int = 1337,
    weights: str | None = None,
) -> Iterator[str]:
    """``sample_text``, piece by piece: the prompt first, then the text as it is made.

    A character tokenizer's tokens are characters, each a piece. A byte-level BPE token can be
    part of a character (one UTF-8 byte of several), so the text is decoded from every token
    so far and a piece is yielded once it ends on a whole character.

    Arguments are checked when this is called, not at the first ``next``.

    Example:
        >>> from gptblock import CharTokenizer, GPTConfig
        >>> tok = CharTokenizer.from_text("ab")
        >>> model = GPT(GPTConfig(tok.vocab_size, block_size=4, n_layer=1, n_head=1, n_embd=4))
        >>> pieces = list(stream_text(model, tok, "a", max_new_tokens=3))
        >>> len(pieces), "".join(pieces) == sample_text(model, tok, "a", max_new_tokens=3)
        (4, True)
    """
    if prompt is None:
        chars = getattr(tokenizer, "chars", ("\n",))  # BPE spells any text
        prompt = "\n" if "\n" in chars else chars[0]
    if not isinstance(prompt, str):
        raise UserTypeError(f"the prompt must be a str, got {type(prompt).__name__}")
    if not prompt:
        raise UserValueError("the prompt must not be empty")
    unknown = tokenizer.unknown(prompt)
    if unknown:
        raise UserValueError(
            f"the prompt has {len(unknown)} character(s) outside the model's vocabulary: "
            f"{', '.join(repr(c) for c in unknown)}"
        )
    check_seed(seed)
    device = next(model.parameters()).device
    idx = torch.tensor([tokenizer.encode(prompt)], dtype=torch.long, device=device)  # (1, T)
    generator = torch.Generator(device=device).manual_seed(seed)
    # A model's embedding may be padded beyond its tokenizer (nanoGPT's 50304 rows for GPT-2's
    # 50257 tokens): the padded ids have no text, so they are never sampled.
    V = min(model.config.vocab_size, getattr(tokenizer, "vocab_size", model.config.vocab_size))
    steps = model.stream(
        idx,
        max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        generator=generator,
        vocab_size=V,
        weights=weights,
    )
    return itertools.chain([prompt], _pieces(tokenizer, (int(s.token[0, 0]) for s in steps)))


def _pieces(tokenizer: Tokenizer, ids: Iterator[int]) -> Iterator[str]:
    """The text of ``ids``, a piece as soon as the tokens since the last one spell whole
    characters (a byte-level token's bytes decode on their own, so only the tail is decoded)."""
    pending: list[int] = []
    for i in ids:
        pending.append(i)
        text = tokenizer.decode(pending)
        if not text.endswith("\ufffd"):  # otherwise a UTF-8 character still lacks bytes
            yield text
            pending = []
    if pending:
        yield tokenizer.decode(pending)


def sample_text(
    model: GPT,
    tokenizer: Tokenizer,
    prompt: str | None = None,
    *,
    max_new_tokens: int = 500,
    temperature: float = 0.8,
    top_k: int | None = None,
    seed: int = 1337,
    weights: str | None = None,
) -> str:
    """The prompt and its continuation, sampled with a generator seeded by ``seed``.

    The default prompt is a newline (or, for a vocabulary without one, its first character).
    A temperature so small that it overflows the logits (1e-45) samples greedily. ``weights``:
    ``GPT.generate``'s (None: the model's own).

    Raises:
        ValueError: an empty prompt, or one with characters outside the vocabulary (listed);
            a bad seed, temperature, top_k or max_new_tokens.
    """
    return "".join(
        stream_text(
            model,
            tokenizer,
            prompt,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            seed=seed,
            weights=weights,
        )
    )
