"""The sampling step: the next token from a step's logits, and the checks of its settings.

Shapes: B batch, V vocabulary.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch.nn import functional as F

from ...errors import UserTypeError, UserValueError

__all__ = ["GenerationStep", "Sampling"]


class GenerationStep(NamedTuple):
    """One step of ``GPT.stream``."""

    logits: torch.Tensor  # (B, V): next-token logits, before temperature and top-k
    token: torch.Tensor  # (B, 1): the token chosen


class Sampling(NamedTuple):
    """How each token is chosen, checked (``check``) before the first step."""

    temperature: float  # divides the logits; 0: greedy
    top_k: int | None  # sample among the k most likely tokens, at most V
    generator: torch.Generator | None  # for reproducible draws

    @classmethod
    def check(
        cls,
        temperature: object,
        top_k: object,
        generator: object,
        vocab_size: int,
        device: torch.device,
    ) -> Sampling:
        """The settings, or a ``UserError`` naming the one that is wrong."""
        t, k = temperature, top_k
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t < math.inf:
            raise UserValueError(
                f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}"
            )
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k <= 0):
            raise UserValueError(f"top_k must be a positive int or None, got {top_k!r}")
        refuse_top_k_when_greedy(temperature, top_k)
        if generator is not None and (
            not isinstance(generator, torch.Generator) or generator.device.type != device.type
        ):
            got = generator.device if isinstance(generator, torch.Generator) else generator
            raise UserTypeError(
                f"generator must be a torch.Generator on the model's device type "
                f"({device.type}) or None, got {got!r:.60}"
            )
        return cls(float(t), None if k is None else min(k, vocab_size), generator)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """One token per row of ``logits`` (B, V) -> (B, 1): greedy at temperature 0, else
        sampled; where ``logits / temperature`` overflows (1e-45) its limit, the greedy token."""
        # A host read per token: NaN logits (a model with NaN weights) would otherwise give NaN
        # probabilities, which multinomial refuses cryptically, or a silent argmax of garbage.
        if not bool(torch.isfinite(logits).all()):
            raise UserValueError(
                "the model's next-token logits are NaN or infinite: its weights are not finite "
                "(check them with torch.isfinite(p).all() for p in model.parameters())"
            )
        if self.top_k is not None:
            kth = torch.topk(logits, self.top_k, dim=-1).values[:, -1:]  # (B, 1): the k-th largest
            logits = logits.masked_fill(logits < kth, float("-inf"))
        greedy = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
        if self.temperature == 0:
            # Greedy: argmax directly, never multinomial over a degenerate (one-hot) distribution.
            return greedy
        probs = F.softmax(logits / self.temperature, dim=-1)  # (B, V)
        overflowed = probs.isnan().any(dim=-1, keepdim=True)  # (B, 1)
        probs = torch.where(overflowed, F.one_hot(greedy[:, 0], probs.shape[-1]).to(probs), probs)
        return torch.multinomial(probs, num_samples=1, generator=self.generator)  # (B, 1)


def refuse_top_k_when_greedy(temperature: object, top_k: object) -> None:
    """Greedy decoding (temperature 0) takes the likeliest token: a top_k cannot act there."""
    if top_k is not None and temperature == 0:
        raise UserValueError(
            f"top_k={top_k} acts only when sampling (temperature > 0), but temperature is 0 "
            "(greedy): leave top_k out, or give a temperature"
        )
