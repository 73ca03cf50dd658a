"""The tiny GPT the lessons promise: embeddings, a stack of blocks, a final norm, a tied head.

Model-level names are GPT-2's (``transformer.wte``, ``lm_head``, ...), as in nanoGPT; the blocks
are any of gptblock's three forms. The computation is written once, in ``_run``: ``forward``
calls it on the blocks, generation with a KV cache per block, the lens with a probe.

Shapes: B batch, T time, C = n_embd, V = vocab_size, nh heads, hs = C // nh.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import NamedTuple, cast

import torch
import torch.nn as nn
from torch.nn import functional as F

from ..blocks.attention import KVStore
from ..blocks.checks import check_positions
from ..blocks.config import GPTConfig
from ..blocks.convert import parts_of
from ..blocks.fused import FusedBlock, block_forward, stream_norm
from ..blocks.mha import TransformerBlock
from ..errors import UserTypeError, UserValueError
from ..lesson import Block as LessonBlock
from ..reference.layout import LESSON_RENAMES, LINEAR2, OUT_PROJ
from .embeddings import InputMix
from .footprint import check_model
from .generation import decode
from .generation.sampling import GenerationStep
from .head import soft_cap
from .parts import BlockFn, EmbeddedPositions, GPTParts
from .trace import CachedRun, Hook, Tracer

__all__ = ["GPT", "GPTOutput"]


# The parameters that write into the residual stream at the end of each branch. GPT-2 scales
# their initialisation by 1/sqrt(2 * n_layer): each block adds two branches to the stream, and
# without the scaling the stream's variance grows with depth.
# Named as the packed layout and the lesson's name them (``reference.layout``, their one place).
RESIDUAL_PROJECTIONS = tuple(
    name
    for own in (OUT_PROJ[0], LINEAR2[0])
    for name in (own, {v: k for k, v in LESSON_RENAMES.items()}[own.rpartition(".")[0]] + ".weight")
)  # self_attn.out_proj.weight, sa.proj.weight, linear2.weight, ffwd.net.2.weight


class GPTOutput(NamedTuple):
    """What ``GPT.forward`` returns; unpacks as ``logits, loss = model(idx, targets)``."""

    logits: torch.Tensor  # (B, T, V)
    loss: torch.Tensor | None  # mean cross-entropy over the targets, or None without targets


class GPT(nn.Module):
    """A GPT made of gptblock's blocks: token and position embeddings, ``n_layer`` pre-norm
    blocks, a final norm and an unembedding tied to the token embedding. Initialised as GPT-2:
    normal(0, 0.02), residual output projections scaled by 1/sqrt(2 * n_layer), zero biases.

    Args:
        config: a ``GPTConfig``.

    Shape:
        ``forward``: idx (B, T) int64 or int32 token ids, T <= block_size; targets (B, T)
        int64 (-1: no target) or None; ``positions`` (T,) or (B, T) (default 0 .. T-1).
        Returns logits (B, T, V) and the loss (a scalar) or None.

    Example:
        >>> torch.manual_seed(0) and None
        >>> model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16))
        >>> idx = torch.randint(0, 11, (2, 5))
        >>> logits, loss = model(idx, targets=idx)
        >>> logits.shape
        torch.Size([2, 5, 11])
        >>> model.generate(idx[:, :1], max_new_tokens=4, temperature=0).shape
        torch.Size([2, 5])
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise UserTypeError(f"config must be a GPTConfig, got {type(config).__name__}")
        advice = "a smaller n_embd, n_layer, vocab_size or block_size"
        device, itemsize = torch.get_default_device(), torch.get_default_dtype().itemsize
        check_model(config, "GPT(config)", advice, copies=1, device=device, itemsize=itemsize)
        self.config = config
        C = config.n_embd
        modules: dict[str, nn.Module] = {"wte": nn.Embedding(config.vocab_size, C)}
        if config.bigram or config.smear:  # issue 22's input side (embeddings.py)
            modules["inputs"] = InputMix(config.vocab_size, C, bigram=config.bigram, smear=config.smear)  # fmt: skip
        if config.position == "learned":  # rotary positions live in the blocks' attention
            modules["wpe"] = nn.Embedding(config.block_size, C)
        modules["drop"] = nn.Dropout(config.dropout)
        modules["h"] = nn.ModuleList([_make_block(config) for _ in range(config.n_layer)])
        modules["ln_f"] = stream_norm(config.block_config())
        self.transformer = nn.ModuleDict(modules)
        self.lm_head = nn.Linear(C, config.vocab_size, bias=False)
        # Weight tying: the unembedding reads the stream against the same vectors the embedding
        # writes, which saves V * C parameters and trains better at this size (Press & Wolf 2017).
        if config.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        self._init_weights()
        if "inputs" in modules:  # they start at zero: the model starts as without them
            cast(InputMix, modules["inputs"]).reset_parameters()

    @property
    def wte(self) -> nn.Embedding:
        return cast(nn.Embedding, self.transformer["wte"])

    @property
    def wpe(self) -> nn.Embedding | None:
        """The learned position embedding; None with ``position="rope"`` or ``"none"``."""
        return cast(nn.Embedding, self.transformer["wpe"]) if "wpe" in self.transformer else None

    @property
    def blocks(self) -> list[nn.Module]:
        return list(cast(nn.ModuleList, self.transformer["h"]))

    def _init_weights(self) -> None:
        resid_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        # zero_init_proj (modded-nanogpt): the projections into the stream (and an untied head,
        # named_parameters lists a tied one as wte) start at 0, so each block starts as the identity.
        zero = (*RESIDUAL_PROJECTIONS, "lm_head.weight") if self.config.zero_init_proj else ()
        for name, p in self.named_parameters():
            if name.endswith(zero):
                nn.init.zeros_(p)
            elif name.endswith(RESIDUAL_PROJECTIONS):
                nn.init.normal_(p, mean=0.0, std=resid_std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() >= 2:  # embeddings, q/k/v (packed or per head), MLP input
                nn.init.normal_(p, mean=0.0, std=0.02)
            else:  # LayerNorm gains
                nn.init.ones_(p)

    def num_params(self, exclude_position_embeddings: bool = True) -> int:
        """Number of parameters, the tied embedding/unembedding counted once; the position
        embeddings excluded by default, as nanoGPT reports its sizes."""
        n = sum(p.numel() for p in self.parameters())
        if exclude_position_embeddings and self.wpe is not None:
            return n - self.wpe.weight.numel()
        return n

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None, *,
        positions: torch.Tensor | None = None,
    ) -> GPTOutput:  # fmt: skip
        # Checking the ids' range reads idx.min() / idx.max() on the host: on an accelerator
        # the host waits for the device, and torch.compile breaks the graph. So a training step
        # there, and any compiled call, skips it (a bad id still fails in the embedding).
        compiling = torch.compiler.is_compiling()
        in_range = not compiling and (not self.training or idx.device.type == "cpu")
        B, T = self._check_input(idx, in_range)
        if positions is not None:  # learned ones index wpe's block_size rows
            limit = self.config.block_size if self.wpe is not None else None
            check_positions(positions, B, T, idx.device, limit)
        logits = self._run(idx, self._parts(), positions=positions)  # (B, T, V)
        loss = None
        if targets is not None:
            if targets.shape != idx.shape:
                raise UserValueError(
                    f"targets must have the shape of idx {tuple(idx.shape)}, got {tuple(targets.shape)}"
                )
            check_ids(targets, "targets", self.wte.weight.device)
            if in_range:
                check_range(targets, "targets", self.config.vocab_size, allow_ignore=True)
            # -1 marks positions without a target (padding), as in nanoGPT.
            loss = F.cross_entropy(logits.view(B * T, -1), targets.reshape(B * T), ignore_index=-1)
        return GPTOutput(logits, loss)

    def _check_input(self, idx: torch.Tensor, in_range: bool = True) -> tuple[int, int]:
        """(B, T) of ids the model can read (in the vocabulary unless not ``in_range``)."""
        B, T = check_ids(idx, "idx", self.wte.weight.device)
        if in_range:
            check_range(idx, "idx", self.config.vocab_size)
        if T > self.config.block_size:
            raise UserValueError(
                f"sequence length T={T} exceeds block_size={self.config.block_size}; "
                f"crop the context to the last {self.config.block_size} tokens"
            )
        return B, T

    def _parts(self, blocks: Sequence[BlockFn] | None = None) -> GPTParts:
        """The model's own modules as ``_run``'s parts; ``blocks`` instead of its blocks."""
        return GPTParts(
            self.wte, None if self.wpe is None else EmbeddedPositions(self.wpe),
            self.blocks if blocks is None else blocks, cast(nn.LayerNorm, self.transformer["ln_f"]),
            self.lm_head,
            cast(InputMix, self.transformer["inputs"]) if "inputs" in self.transformer else None,
        )  # fmt: skip

    def _run(
        self, idx: torch.Tensor, parts: GPTParts, *, caches: Sequence[KVStore] | None = None,
        probe: Tracer | None = None, positions: torch.Tensor | None = None,
        before: torch.Tensor | None = None,
    ) -> torch.Tensor:  # fmt: skip
        """The GPT, once: logits (B, T, V) of checked ids (B, T), computed by ``parts``. ``idx``
        continues after the positions ``caches`` hold (default positions); ``before`` (B, k):
        the ids before ``idx`` that ``parts.inputs`` reads."""
        T = idx.shape[1]
        # (B, T, C): the token embedding, with the bigram embedding and the smear where they are on
        x = parts.wte(idx) if parts.inputs is None else parts.inputs(idx, parts.wte, before)
        if parts.wpe is not None:  # learned positions (rotary ones are the attention's)
            start = 0 if caches is None else caches[0].length
            x = x + parts.wpe(start, T, positions)  # + (T, C) or (B, T, C)
        rotary = {} if positions is None or self.config.position != "rope" else {"positions": positions}  # fmt: skip
        if self.training and probe is None:
            x = self.transformer["drop"](x)
        x = x if probe is None else probe.point("embed", x)  # inlined: a call per token
        for i, block in enumerate(parts.blocks):
            if caches is None and probe is None:
                x = block(x, **rotary)  # (B, T, C)
            else:
                cache = None if caches is None else caches[i]
                x = block(x, kv_cache=cache, probe=None if probe is None else probe.block(i), **rotary)  # fmt: skip
        x = parts.ln_f(x)  # (B, T, C)
        x = x if probe is None else probe.point("ln_final", x)
        logits = parts.lm_head(x)  # (B, T, C) @ (C, V) -> (B, T, V)
        return soft_cap(logits, self.config.logit_softcap)  # model.head: the identity by default

    def _probed_blocks(self) -> list[BlockFn]:
        """The blocks as forwards that take a probe: a ``FusedBlock`` itself, another form (whose
        forward has no hook points) as the fused forward on its own weights."""
        return [
            b if isinstance(b, FusedBlock) else functools.partial(block_forward, parts_of(b))
            for b in self.blocks
        ]

    def generate(
        self, idx: torch.Tensor, max_new_tokens: int, *, temperature: float = 1.0,
        top_k: int | None = None, use_cache: bool = True, generator: torch.Generator | None = None,
        weights: str | None = None,
    ) -> torch.Tensor:  # fmt: skip
        """The prompts ``idx`` (B, T) continued by ``max_new_tokens`` sampled tokens: (B, T +
        max_new_tokens) ids. The model reads the last block_size tokens; its mode is restored.

        Args:
            temperature: divides the logits; 0 means greedy (argmax, no sampling).
            top_k: sample only among the k most likely tokens (clamped to the vocabulary).
            use_cache: a step processes one token, not the whole context (the same result).
            generator: the random generator for sampling, for reproducible output.
            weights: "float32" (None), "bfloat16" or "int8" (CPU only): ``generation.weights``.
        """
        steps = self.stream(
            idx, max_new_tokens, temperature=temperature, top_k=top_k, use_cache=use_cache,
            generator=generator, weights=weights,
        )  # fmt: skip
        return torch.cat([idx] + [step.token for step in steps], dim=1)

    def stream(
        self, idx: torch.Tensor, max_new_tokens: int, *, temperature: float = 1.0,
        top_k: int | None = None, use_cache: bool = True, generator: torch.Generator | None = None,
        vocab_size: int | None = None, weights: str | None = None,
    ) -> Iterator[GenerationStep]:  # fmt: skip
        """``generate``, one step at a time: yields each step's logits and sampled tokens.

        ``vocab_size``: sample only ids below it, for a tokenizer smaller than a padded
        embedding (nanoGPT pads 50257 to 50304); the logits are then (B, vocab_size). The model
        is in eval mode until the iterator is exhausted or closed.

        Example:
            >>> torch.manual_seed(0) and None
            >>> model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16))
            >>> [tuple(s.token.shape) for s in model.stream(torch.zeros(2, 1, dtype=torch.long), 3)]
            [(2, 1), (2, 1), (2, 1)]
        """
        check_ids(idx, "idx", self.wte.weight.device)
        check_range(idx, "idx", self.config.vocab_size)
        return decode.stream(
            self, idx, max_new_tokens, temperature=temperature, top_k=top_k, use_cache=use_cache,
            generator=generator, vocab_size=vocab_size, weights=weights,
        )  # fmt: skip

    def run_with_cache(
        self, idx: torch.Tensor, names: Iterable[str] | None = None, *,
        hooks: Mapping[str, Hook] | None = None,
    ) -> CachedRun:  # fmt: skip
        """Logits equal to ``forward``'s and the activations ``names`` (all when None), by the
        names of ``gptblock.lens.trace`` (``embed``, ``blocks.{i}.resid_pre``, ...), with
        ``hooks`` applied as ``run_with_hooks`` does.

        Example:
            >>> model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16))
            >>> logits, cache = model.run_with_cache(torch.tensor([[1, 2, 3]]))
            >>> tuple(cache["blocks.0.head_out"].shape)  # (B, T, nh, C)
            (1, 3, 2, 16)
        """
        tracer = Tracer(names, {} if hooks is None else hooks, self.config.n_layer)
        self._check_input(idx)
        return tracer.result(self._run(idx, self._parts(self._probed_blocks()), probe=tracer))

    def run_with_hooks(self, idx: torch.Tensor, hooks: Mapping[str, Hook]) -> torch.Tensor:
        """Logits (B, T, V) with ``{name: fn}`` applied at ``run_with_cache``'s named activations:
        ``fn(activation)`` returns the activation to continue with."""
        tracer = Tracer((), hooks, self.config.n_layer)
        self._check_input(idx)
        return self._run(idx, self._parts(self._probed_blocks()), probe=tracer)


def _make_block(config: GPTConfig) -> nn.Module:
    if config.block == "fused":
        return FusedBlock.from_config(config.block_config())
    c = config.block_config()  # GPT-2's block: GPTConfig refuses the modern options here
    if config.block == "mha":
        return TransformerBlock(
            c.d_model, c.n_head, dropout=c.dropout, activation=c.activation, bias=c.bias,
            norm_eps=c.norm_eps,
        )  # fmt: skip
    return LessonBlock(c.d_model, c.n_head, config.block_size, c.dropout)


# What a GPT is handed, refused naming the value: PyTorch's messages (an index error deep in an
# embedding) name neither it nor what was expected.
def check_ids(idx: object, name: str, device: torch.device) -> tuple[int, int]:
    """(B, T) of a 2-D tensor of token ids on ``device``: int64 or int32 (``F.embedding``'s), or
    for ``targets`` int64 (``F.cross_entropy``'s); a clear error for anything else.

    Example:
        >>> check_ids(torch.zeros(2, 3, dtype=torch.long), "idx", torch.device("cpu"))
        (2, 3)
    """
    dtypes = (torch.long,) if name == "targets" else (torch.long, torch.int32)
    if not isinstance(idx, torch.Tensor) or idx.dtype not in dtypes:
        got = idx.dtype if isinstance(idx, torch.Tensor) else type(idx).__name__
        allowed = " or ".join(str(d) for d in dtypes)
        raise UserTypeError(
            f"{name} must be a (B, T) tensor of token ids of dtype {allowed}, got {got} "
            f"(convert with .long())"
        )
    if idx.dim() != 2 or idx.numel() == 0:
        raise UserValueError(
            f"{name} must be a non-empty (B, T) tensor of token ids, got shape {tuple(idx.shape)}"
        )
    if idx.device != device:
        raise UserValueError(f"{name} is on {idx.device} but the model is on {device}; move one of them")  # fmt: skip
    return idx.shape[0], idx.shape[1]


def check_range(idx: torch.Tensor, name: str, V: int, allow_ignore: bool = False) -> None:
    """Refuse ids outside [0, V) (-1 allowed for ignored targets): a read on the host."""
    lo, hi = int(idx.min()), int(idx.max())
    if hi >= V or lo < (-1 if allow_ignore else 0):
        bad = lo if lo < 0 else hi
        raise UserValueError(f"{name} contains token id {bad}, outside the vocabulary [0, {V})")
    if allow_ignore and hi == -1:  # the mean over no targets is 0 / 0
        raise UserValueError(
            f"every entry of {name} is -1 (ignored): there is no target to compute a loss "
            f"over; pass targets=None for the logits alone"
        )
