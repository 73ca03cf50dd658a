"""The cached path and the generation loop under ``GPT.generate`` / ``GPT.stream``.

``Decoder`` runs ``GPT._run`` with a ``KVCache`` (a block's keys and values so far) per block,
the prompt at once, then a token at a time; every block runs the fused forward on its own
weights (the other forms' forwards have no cache), laid out by ``matvec`` or ``weights.py``.

Shapes: B batch, T time, C = n_embd, V = vocab_size, nh heads, hs = C // nh.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple, Protocol, cast

import torch
import torch.nn as nn
from torch.nn import functional as F

from ...blocks.attention import KVStore, SelfAttention
from ...blocks.config import GPTConfig, check_positive_int
from ...blocks.convert import parts_of
from ...blocks.fused import BlockParts, block_forward
from ...blocks.parts import Dense, LayerNormFn, Linear, Norm
from ...errors import UserTypeError, UserValueError
from ..embeddings import LOOKBACK
from ..parts import BlockFn, GPTParts
from .matvec import RowLinear
from .sampling import GenerationStep, Sampling
from .weights import REDUCED, check_weights

__all__ = ["Decoder", "GenerationModel", "KVCache", "forget_reduced_weights", "stream"]


class KVCache:
    """The keys and values one block has computed so far, preallocated to ``max_len`` positions
    (rather than ``torch.cat`` per step, so a step's cost does not grow with the tokens before).
    A block's forward takes it as ``kv_cache``; its input then holds only the new positions.

    Args:
        batch_size, n_heads, head_size: B, nh, hs.
        max_len: the most positions the cache holds (the model's block_size).
        dtype, device: those of the block's activations.

    Shape:
        ``k``, ``v``: (B, nh, max_len, hs); positions ``[0, length)`` are filled.

    Example:
        >>> from gptblock import FusedBlock
        >>> cache = KVCache(1, 2, max_len=8, head_size=4)
        >>> block = FusedBlock(8, 2).eval()
        >>> _ = block(torch.randn(1, 3, 8), kv_cache=cache)   # prefill 3 positions
        >>> _ = block(torch.randn(1, 1, 8), kv_cache=cache)   # one more
        >>> cache.length
        4
    """

    def __init__(
        self, batch_size: int, n_heads: int, max_len: int, head_size: int, *,
        dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
    ) -> None:  # fmt: skip
        sizes = {"batch_size": batch_size, "n_heads": n_heads, "max_len": max_len}
        for name, value in (sizes | {"head_size": head_size}).items():
            check_positive_int(name, value)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise UserTypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
        shape = (batch_size, n_heads, max_len, head_size)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store (B, nh, T_new, hs) keys and values; return all keys and values so far."""
        start, stop = self.length, self.length + k.shape[2]
        if stop > self.max_len:
            raise UserValueError(
                f"KV cache holds {self.max_len} positions; {start} are filled and "
                f"{k.shape[2]} more do not fit (crop the context or rebuild the cache)"
            )
        if k.shape[:2] != self.k.shape[:2] or k.shape[3] != self.k.shape[3]:
            raise UserValueError(
                f"KV cache expects (B, nh, T, hs) = ({self.k.shape[0]}, {self.k.shape[1]}, T, "
                f"{self.k.shape[3]}), got {tuple(k.shape)}"
            )
        self.k[:, :, start:stop] = k
        self.v[:, :, start:stop] = v
        self.length = stop
        return self.k[:, :, :stop], self.v[:, :, :stop]  # (B, nh, stop, hs) each


class Model(Protocol):
    """What generation needs of a ``GPT`` (``model/gpt.py`` imports this module, not the reverse)."""

    training: bool

    @property
    def config(self) -> GPTConfig: ...
    @property
    def wte(self) -> nn.Embedding: ...
    @property
    def wpe(self) -> nn.Embedding | None: ...
    @property
    def blocks(self) -> list[nn.Module]: ...
    def train(self, mode: bool = True) -> Any: ...
    def parameters(self) -> Iterator[nn.Parameter]: ...
    def _parts(self, blocks: Sequence[BlockFn] | None = None) -> GPTParts: ...
    def _run(
        self, idx: torch.Tensor, parts: GPTParts, *, caches: Sequence[KVStore] | None = None,
        before: torch.Tensor | None = None,
    ) -> torch.Tensor: ...  # fmt: skip


class Decoder:
    """A GPT's forward pass with a ``KVCache`` per block, its weights read when it is made:
    ``weights`` None or ``"float32"``, the model's own; ``"bfloat16"`` or ``"int8"``, copies."""

    def __init__(self, model: Model, weights: str | None = None) -> None:
        self.model = model
        own = model._parts()
        with torch.no_grad():  # a lesson block's q/k/v are concatenated: no graph to keep
            blocks = [parts_of(block) for block in model.blocks]
        self.dtype = blocks[0].attn.in_proj.weight.dtype
        self.weights = check_weights(weights, model.wte.weight.device, self.dtype)
        # The ends as functions of their weights, fetched once.
        ends = GPTParts(
            functools.partial(F.embedding, weight=model.wte.weight),
            None if model.wpe is None else PositionRows(model.wpe.weight),
            [], _norm(own.ln_f), Dense(own.lm_head.weight, own.lm_head.bias), own.inputs,
        )  # fmt: skip
        if self.weights == "float32":
            self.prefill_parts = ends._replace(blocks=[_fn(p) for p in blocks])
            self.step_parts = ends._replace(blocks=[_fn(_relaid(p, RowLinear)) for p in blocks])
        else:  # one form for the prompt and the steps (weights.py says why)
            self.prefill_parts = self.step_parts = _reduced(model, ends, blocks, self.weights)
        self.caches: list[KVCache] = []
        # The last ids cached, which a bigram embedding or a smear reads (embeddings.py).
        self.recent: torch.Tensor | None = None

    @property
    def length(self) -> int:
        """Positions cached so far."""
        return self.caches[0].length if self.caches else 0

    def prefill(self, idx: torch.Tensor) -> torch.Tensor:
        """Fresh caches filled from ``idx`` (B, T); returns its logits (B, T, V)."""
        cfg = self.model.config
        # grouped-query attention caches the key/value heads only
        shape = (idx.shape[0], cfg.n_kv_head, cfg.block_size, cfg.n_embd // cfg.n_head)
        new = functools.partial(KVCache, *shape, dtype=self.dtype, device=idx.device)
        self.caches = [new() for _ in self.prefill_parts.blocks]
        self.recent = idx[:, -LOOKBACK:] if self.prefill_parts.inputs is not None else None
        return self.model._run(idx, self.prefill_parts, caches=self.caches)

    def step(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits (B, 1, V) for one new token (B, 1) at the next position."""
        before = self.recent
        if before is not None:
            self.recent = torch.cat([before, idx], dim=1)[:, -LOOKBACK:]  # (B, <= LOOKBACK)
        return self.model._run(idx, self.step_parts, caches=self.caches, before=before)


class GenerationModel(nn.Module):
    """A GPT as generation computes it with ``weights`` (the ``Decoder``'s parts, no cache),
    returning ``(logits, loss)`` as ``GPT.forward`` does: what reduced weights cost, as a loss.

    Args:
        model: a ``GPT``.
        weights: ``Decoder``'s.

    Shape:
        idx (B, T), targets (B, T) or None (-1: no target) -> logits (B, T, V), loss.

    Example:
        >>> from gptblock import GPT, GPTConfig
        >>> gpt = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16))
        >>> idx = torch.randint(0, 11, (2, 5))
        >>> logits, loss = GenerationModel(gpt, "int8")(idx, idx)
        >>> logits.shape, bool(torch.allclose(logits, gpt(idx).logits, atol=0.05))
        (torch.Size([2, 5, 11]), True)
    """

    def __init__(self, model: nn.Module, weights: str | None) -> None:
        super().__init__()
        self.model = model  # a submodule, so eval()/train() reach it
        self.decoder = Decoder(cast(Model, model), weights)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        logits = self.decoder.model._run(idx, self.decoder.prefill_parts)  # (B, T, V)
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-1)


class PositionRows(NamedTuple):
    """``GPTParts.wpe`` as a slice of the weight (an index tensor and a gather cost two calls)."""

    weight: torch.Tensor  # (block_size, C)

    def __call__(self, start: int, T: int, positions: torch.Tensor | None = None) -> torch.Tensor:
        if positions is not None:
            return self.weight[positions]  # (T, C) or (B, T, C)
        return self.weight[start : start + T]  # (T, C)


class ReducedCopy(NamedTuple):
    """A model's weights in a reduced form, with what they were made from (``_reduced``)."""

    weights: str  # "bfloat16" or "int8"
    sources: Sequence[tuple[torch.Tensor, int, int]]  # each parameter, its version, data_ptr
    parts: GPTParts

    def fits(self, weights: str, params: Sequence[torch.Tensor]) -> bool:
        if weights != self.weights or len(params) != len(self.sources):
            return False
        pairs = zip(params, self.sources, strict=True)
        return all(p is q and p._version == v and p.data_ptr() == ptr for p, (q, v, ptr) in pairs)


REDUCED_COPY = "_generation_weights"  # the model's attribute that keeps its ReducedCopy


def _reduced(model: Model, ends: GPTParts, blocks: list[BlockParts], weights: str) -> GPTParts:
    """``ends`` and ``blocks`` with every weight matrix in ``weights``' form. Quantising took
    longer than generating 100 tokens, so the copy is kept on the model while its parameters are
    the same tensors at the same versions and addresses; a change through ``p.data`` is not
    seen: ``forget_reduced_weights(model)`` after one."""
    params = list(model.parameters())
    kept = getattr(model, REDUCED_COPY, None)
    if isinstance(kept, ReducedCopy) and kept.fits(weights, params):
        return kept.parts
    low = REDUCED[weights]
    head = ends.lm_head
    parts = ends._replace(
        blocks=[_fn(_relaid(p, low)) for p in blocks], lm_head=low(head.weight, head.bias)
    )
    sources = [(p, p._version, p.data_ptr()) for p in params]
    setattr(model, REDUCED_COPY, ReducedCopy(weights, sources, parts))
    return parts


def forget_reduced_weights(model: nn.Module) -> None:
    """Drop the reduced copy of ``model``'s weights that generation keeps (``_reduced``)."""
    if REDUCED_COPY in vars(model):
        delattr(model, REDUCED_COPY)


def _fn(parts: BlockParts) -> BlockFn:
    """The fused form's forward on ``parts``: ``fn(x, kv_cache=..., probe=...)``."""
    return functools.partial(block_forward, parts)


def _relaid(
    parts: BlockParts, linear: Callable[[torch.Tensor, torch.Tensor | None], Linear]
) -> BlockParts:
    """``parts`` with every weight matrix as ``linear(weight, bias)`` and the norms as functions
    (a module call was a tenth of a step's overhead)."""
    attn = parts.attn

    def relay(dense: Linear) -> Linear:
        return linear(dense.weight, dense.bias)

    return BlockParts(
        _norm(parts.norm1),
        SelfAttention(relay(attn.in_proj), relay(attn.out_proj), attn.n_heads, attn.heads),
        None if parts.norm2 is None else _norm(parts.norm2),
        parts.mlp.relaid(relay),
    )


def _norm(norm: Norm) -> Norm:
    """A ``LayerNorm`` module's function on its weights (the module's own ``eps``)."""
    if isinstance(norm, nn.LayerNorm):
        return LayerNormFn(norm.weight, norm.bias, norm.eps)
    return norm


def stream(
    model: Model, idx: torch.Tensor, max_new_tokens: int, *, temperature: float, top_k: int | None,
    use_cache: bool, generator: torch.Generator | None, vocab_size: int | None = None,
    weights: str | None = None,
) -> Iterator[GenerationStep]:  # fmt: skip
    """``GPT.stream`` for checked prompts ``idx`` (B, T): the other arguments are checked when it
    is called, and the steps run as the iterator is read."""
    n = max_new_tokens
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise UserValueError(f"max_new_tokens must be an int >= 0, got {n!r}")
    if not isinstance(use_cache, bool):
        raise UserTypeError(f"use_cache must be a bool, got {use_cache!r:.40}")
    V, v = model.config.vocab_size, vocab_size
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= V):
        raise UserValueError(f"vocab_size must be an int in [1, {V}] or None, got {v!r}")
    V = v or V
    sampling = Sampling.check(temperature, top_k, generator, V, idx.device)
    weights = check_weights(weights, model.wte.weight.device, model.wte.weight.dtype)
    # A separate generator function, so the checks above run now rather than at the first next().
    return _steps(model, idx, max_new_tokens, sampling, use_cache, V, weights)


def _steps(
    model: Model, idx: torch.Tensor, max_new_tokens: int, sampling: Sampling, use_cache: bool,
    V: int, weights: str,
) -> Iterator[GenerationStep]:  # fmt: skip
    """The steps, in eval mode until the iterator is exhausted or closed."""
    block_size = model.config.block_size
    was_training = model.training
    model.train(False)
    try:
        # Without the cache, reduced weights still need the decoder's parts (not its caches).
        decoder = Decoder(model, weights) if use_cache or weights != "float32" else None
        for _ in range(max_new_tokens):
            # no_grad inside the loop, not around it: a `with` spanning the yield would leak
            # the grad mode into the caller between steps.
            with torch.no_grad():
                window = idx[:, -block_size:]  # what the model can read
                if decoder is None or not use_cache:
                    parts = model._parts() if decoder is None else decoder.prefill_parts
                    logits = model._run(window, parts)
                elif decoder.length in (0, block_size):
                    # The first step, and every step once the window slides: every position
                    # embedding moved, so the cached keys and values are stale.
                    logits = decoder.prefill(window)
                else:
                    logits = decoder.step(idx[:, -1:])  # only the newest token
                last = logits[:, -1, :V]  # (B, V): the ids the tokenizer has
                token = sampling(last)  # (B, 1)
                idx = torch.cat([idx, token], dim=1)
            yield GenerationStep(last, token)
    finally:
        model.train(was_training)
