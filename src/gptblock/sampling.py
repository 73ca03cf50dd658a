"""Text from a trained GPT, in whole characters: ``stream_text`` piece by piece as it is made,
``sample_text`` whole."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import torch

from .blocks.config import check_seed
from .data.batches import Tokenizer
from .devices import native_bfloat16
from .errors import UserValueError, checked
from .model.generation.weights import WEIGHTS
from .model.gpt import GPT

__all__ = ["GENERATION_WEIGHTS", "INT8_MIN_PARAMETERS", "generation_weights", "sample_text"]
__all__ += ["stream_text"]

GENERATION_WEIGHTS = ("auto", *WEIGHTS)  # what `gptblock sample --weights` takes


# Below this many weight-matrix parameters "auto" keeps float32: 4 MiB, the L2 caches of this
# project's two cores, where the weights are not read from memory at each token, so a smaller
# form saves no reading and adds conversions (benchmarks/generation_precision.py).
INT8_MIN_PARAMETERS = 1 << 20


@checked
def generation_weights(name: str, model: GPT) -> str:
    """The weights ``model`` generates with for ``name`` (one of ``GENERATION_WEIGHTS``):
    ``"auto"`` is ``"int8"`` for a float32 model on a CPU with bfloat16 in hardware (the int8
    kernel computes in it) whose weight matrices hold at least ``INT8_MIN_PARAMETERS``, else
    ``"float32"``. On the 6-layer, 384-wide GPT int8 is the fastest form and changes the
    validation loss by less than 0.01 (``benchmarks/generation_precision.py``, LOG.md).

    Example:
        >>> from gptblock import GPTConfig
        >>> small = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16))
        >>> generation_weights("auto", small), generation_weights("bfloat16", small)
        ('float32', 'bfloat16')
    """
    if name not in GENERATION_WEIGHTS:
        raise UserValueError(
            f"weights must be one of {', '.join(GENERATION_WEIGHTS)}, got {name!r:.40}"
        )
    if name != "auto":
        return name
    # What a step reads: every matrix (the tied unembedding once), one row of wpe.
    matrices = sum(p.numel() for p in model.parameters() if p.dim() == 2)
    if model.wpe is not None:
        matrices -= model.wpe.weight.numel()
    w = model.wte.weight
    fast = w.dtype == torch.float32 and w.device.type == "cpu" and native_bfloat16(w.device)
    return "int8" if fast and matrices >= INT8_MIN_PARAMETERS else "float32"


@checked
def stream_text(
    model: GPT, tokenizer: Tokenizer, prompt: str | None = None, *, max_new_tokens: int = 500,
    temperature: float = 0.8, top_k: int | None = None, seed: int = 1337,
    weights: str | None = None,
) -> Iterator[str]:  # fmt: skip
    """``sample_text``, piece by piece: the prompt first, then each piece of text once it ends
    on a whole character (a byte-level BPE token can be one UTF-8 byte of several). Arguments
    are checked when this is called, not at the first ``next``.

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
    if not prompt:  # of another type: refused by @checked
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
        idx, max_new_tokens, temperature=temperature, top_k=top_k, generator=generator,
        vocab_size=V, weights=weights,
    )  # fmt: skip
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


@checked
def sample_text(
    model: GPT, tokenizer: Tokenizer, prompt: str | None = None, *, max_new_tokens: int = 500,
    temperature: float = 0.8, top_k: int | None = None, seed: int = 1337,
    weights: str | None = None,
) -> str:  # fmt: skip
    """The prompt (default a newline, or the vocabulary's first character) and its continuation,
    sampled with a generator seeded by ``seed``; ``weights``: ``GPT.generate``'s.

    Raises:
        ValueError: an empty prompt, characters outside the vocabulary, a bad setting.
    """
    pieces = stream_text(
        model, tokenizer, prompt, max_new_tokens=max_new_tokens, temperature=temperature,
        top_k=top_k, seed=seed, weights=weights,
    )  # fmt: skip
    return "".join(pieces)
