"""One prompt, looked at from every side: ``inspect_prompt``, what ``gptblock inspect`` shows.

One forward pass, every activation cached; the candidates, logit lens, attribution, head table,
figures and page all read from it, so every number shown is of that one pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from ..errors import UserValueError
from .readout import (
    HeadSummary,
    LogitAttribution,
    LogitLens,
    direct_logit_attribution,
    head_summaries,
    logit_lens,
)
from .trace import CachedRun, run_with_cache

if TYPE_CHECKING:
    from ..model.gpt import GPT

__all__ = ["PromptInspection", "Tokenizer", "inspect_prompt", "show_token"]


class Tokenizer(Protocol):
    """What ``inspect_prompt`` needs of a tokenizer (``gptblock.CharTokenizer`` has it)."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


@dataclass(frozen=True)
class PromptInspection:
    """Everything ``gptblock inspect`` prints, plots and puts in its page, for one prompt."""

    prompt: str
    tokens: tuple[str, ...]  # the prompt's tokens as text, one per position
    vocab: tuple[str, ...]  # every token id's text, for reading ids back
    run: CachedRun  # logits (1, T, V) and every activation of the forward pass
    top: tuple[tuple[int, float], ...]  # the likeliest next tokens at the last position
    lens: LogitLens  # the stream read after each layer, at every position
    attribution: LogitAttribution  # of the likeliest next token at the last position
    heads: tuple[HeadSummary, ...]  # every head, layer by layer

    @property
    def n_layer(self) -> int:
        return self.run.cache.n_layer

    @property
    def n_head(self) -> int:
        return int(self.run.cache["blocks.0.pattern"].shape[1])

    def pattern(self, layer: int) -> torch.Tensor:
        """Layer ``layer``'s attention weights on the prompt: (nh, T, T)."""
        return self.run.cache[f"blocks.{layer}.pattern"][0]


def inspect_prompt(
    model: GPT, tokenizer: Tokenizer, prompt: str, *, top_k: int = 5
) -> PromptInspection:
    """Run ``model`` on ``prompt`` (at most ``block_size`` tokens) once, caching everything, and
    read it out, keeping ``top_k`` next-token candidates.

    Example:
        >>> from gptblock import GPT, GPTConfig, CharTokenizer
        >>> tok = CharTokenizer.from_text("abc ")
        >>> model = GPT(GPTConfig(vocab_size=4, block_size=8, n_layer=2, n_head=2, n_embd=16))
        >>> seen = inspect_prompt(model, tok, "ab c")
        >>> len(seen.top), seen.lens.labels, len(seen.heads)
        (4, ('embed', 'layer 0', 'layer 1'), 4)
    """
    if not prompt:  # of another type: refused by the check of gptblock.lens's functions
        raise UserValueError("the prompt must not be empty")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise UserValueError(f"top_k must be a positive int, got {top_k!r}")
    ids = tokenizer.encode(prompt)
    # Only the ids the tokenizer has: an embedding padded beyond it (nanoGPT pads 50257 to
    # 50304) has rows no text stands for, which are neither shown nor counted.
    block_size = model.config.block_size
    V = min(model.config.vocab_size, getattr(tokenizer, "vocab_size", model.config.vocab_size))
    if len(ids) > block_size:
        raise UserValueError(
            f"the prompt is {len(ids)} tokens long and the model reads at most "
            f"block_size={block_size}: shorten it"
        )
    device = model.wte.weight.device
    with torch.no_grad():
        run = run_with_cache(model, torch.tensor([ids], device=device))  # logits (1, T, V)
        probs = torch.softmax(run.logits[0, -1, :V].double(), dim=-1)  # (V,)
        best = torch.topk(probs, min(top_k, V))
        predicted = int(best.indices[0])
        attribution = direct_logit_attribution(model, run, predicted)
        lens = logit_lens(model, run.cache, vocab_size=V)
    return PromptInspection(
        prompt=prompt,
        tokens=tuple(tokenizer.decode([i]) for i in ids),
        vocab=tuple(tokenizer.decode([i]) for i in range(V)),
        run=run,
        top=tuple(zip(best.indices.tolist(), best.values.tolist(), strict=True)),
        lens=lens,
        attribution=attribution,
        heads=tuple(head_summaries(run.cache)),
    )


# Characters that print as nothing, or move the cursor, get a visible stand-in.
_VISIBLE = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"}


def show_token(text: str) -> str:
    """A token's text as a label: whitespace made visible, other control characters escaped.

    Example:
        >>> show_token(" "), show_token("\\n"), show_token("a"), show_token("\\x00")
        ('␣', '↵', 'a', '\\\\x00')
    """
    if text in _VISIBLE:
        return _VISIBLE[text]
    if text.isprintable():
        return text
    return repr(text)[1:-1]
