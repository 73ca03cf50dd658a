"""Generation's machinery under ``GPT.generate`` / ``GPT.stream``: the cached decoder, a sampling step.

``CachedDecoder`` runs a GPT's blocks with a ``KVCache`` each, so a step processes one token
instead of the whole context; ``sample`` picks the next token from a step's logits.

Shapes: B batch, T time, C = n_embd, V = vocab_size, nh heads, hs = C // nh.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, cast

import torch
import torch.nn as nn
from torch.nn import functional as F

from ..blocks.convert import convert
from ..blocks.fused import BlockDecoder, FusedBlock, KVCache
from ..errors import UserValueError

if TYPE_CHECKING:
    from .gpt import GPT

__all__ = ["CachedDecoder", "GenerationStep", "sample"]


class CachedDecoder:
    """A GPT's blocks with a ``KVCache`` each: ``generate``'s cached path.

    Only ``FusedBlock`` has a cache. Models of another block form run here on fused copies of
    their blocks (``convert``: the same function and weights), made once per ``generate`` call,
    so ``use_cache`` works, and agrees with the uncached path, whatever ``GPTConfig.block`` is.
    One-token steps go through ``BlockDecoder``s, which skip the module machinery.
    """

    def __init__(self, model: GPT) -> None:
        self.model = model
        self.blocks = [
            b if isinstance(b, FusedBlock) else cast(FusedBlock, convert(b, "fused"))
            for b in model.blocks
        ]
        self.steppers = [BlockDecoder(b) for b in self.blocks]
        ln_f = cast(nn.LayerNorm, model.transformer["ln_f"])
        self.wte, self.wpe = model.wte.weight, model.wpe.weight
        self.unembed = model.lm_head.weight  # wte's, unless the config unties them
        self.ln_f = (ln_f.weight, ln_f.bias, ln_f.eps)
        self.caches: list[KVCache] = []

    @property
    def length(self) -> int:
        """Positions cached so far."""
        return self.caches[0].length if self.caches else 0

    def prefill(self, idx: torch.Tensor) -> torch.Tensor:
        """Fresh caches filled from ``idx`` (B, T); returns its logits (B, T, V)."""
        cfg = self.model.config
        B, hs = idx.shape[0], cfg.n_embd // cfg.n_head
        self.caches = [
            KVCache(B, cfg.n_head, cfg.block_size, hs, dtype=self.wte.dtype, device=idx.device)
            for _ in self.blocks
        ]
        x = self._embed(idx)
        for block, cache in zip(self.blocks, self.caches, strict=True):
            x = block(x, kv_cache=cache)  # (B, T, C)
        return self._logits(x)

    def step(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits (B, 1, V) for one new token (B, 1) at the next position."""
        x = self._embed(idx)
        for stepper, cache in zip(self.steppers, self.caches, strict=True):
            x = stepper(x, cache)  # (B, 1, C)
        return self._logits(x)

    def _embed(self, idx: torch.Tensor) -> torch.Tensor:
        # Eval mode: the embedding dropout is the identity.
        start = self.length
        return F.embedding(idx, self.wte) + self.wpe[start : start + idx.shape[1]]  # (B, T, C)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        w, b, eps = self.ln_f
        return F.linear(F.layer_norm(x, (x.shape[-1],), w, b, eps), self.unembed)  # (B, T, V)


class GenerationStep(NamedTuple):
    """One step of ``GPT.stream``."""

    logits: torch.Tensor  # (B, V): next-token logits, before temperature and top-k
    token: torch.Tensor  # (B, 1): the token chosen


def sample(
    logits: torch.Tensor, temperature: float, top_k: int | None, generator: torch.Generator | None
) -> torch.Tensor:
    """One token per row of ``logits`` (B, V): greedy at temperature 0, else sampled.

    A temperature so small that ``logits / temperature`` overflows (1e-45: the softmax would be
    NaN) samples its limit, the greedy token, in the rows where it overflows.
    """
    # A host read per token: NaN logits (a model with NaN weights) would otherwise give NaN
    # probabilities, which multinomial refuses cryptically, or a silent argmax of garbage.
    if not bool(torch.isfinite(logits).all()):
        raise UserValueError(
            "the model's next-token logits are NaN or infinite: its weights are not finite "
            "(check them with torch.isfinite(p).all() for p in model.parameters())"
        )
    if top_k is not None:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1): the k-th largest logit
        logits = logits.masked_fill(logits < kth, float("-inf"))
    greedy = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
    if temperature == 0:
        # Greedy: argmax directly, never multinomial over a degenerate (one-hot) distribution.
        return greedy
    probs = F.softmax(logits / temperature, dim=-1)  # (B, V)
    overflowed = probs.isnan().any(dim=-1, keepdim=True)  # (B, 1)
    probs = torch.where(overflowed, F.one_hot(greedy[:, 0], probs.shape[-1]).to(probs), probs)
    return torch.multinomial(probs, num_samples=1, generator=generator)  # (B, 1)
