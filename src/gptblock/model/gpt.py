"""The tiny GPT the lessons promise: embeddings, a stack of blocks, a final norm, a tied head.

Model-level names are GPT-2's (``transformer.wte``, ``transformer.wpe``, ``transformer.h``,
``transformer.ln_f``, ``lm_head``), as in nanoGPT, so checkpoints line up where the blocks do.
The blocks are any of gptblock's three forms, chosen by ``GPTConfig.block``; the fused one has a
KV cache, which ``generate`` uses.

Shapes: B batch, T time, C = n_embd, V = vocab_size, nh heads, hs = C // nh.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar, NamedTuple, cast

import torch
import torch.nn as nn
from torch.nn import functional as F

from ..blocks.config import GPTConfig
from ..blocks.fused import FusedBlock
from ..blocks.mha import TransformerBlock
from ..errors import UserTypeError, UserValueError
from ..lens import trace
from ..lesson import Block as LessonBlock
from .decode import CachedDecoder, GenerationStep, sample

__all__ = ["GPT", "GPTOutput", "GenerationStep"]

# The parameters that write into the residual stream at the end of each branch. GPT-2 scales
# their initialisation by 1/sqrt(2 * n_layer): each block adds two branches to the stream, and
# without the scaling the stream's variance grows with depth.
RESIDUAL_PROJECTIONS = (
    "self_attn.out_proj.weight",
    "linear2.weight",
    "sa.proj.weight",
    "ffwd.net.2.weight",
)


class GPTOutput(NamedTuple):
    """What ``GPT.forward`` returns; unpacks as ``logits, loss = model(idx, targets)``."""

    logits: torch.Tensor  # (B, T, V)
    loss: torch.Tensor | None  # mean cross-entropy over the targets, or None without targets


class GPT(nn.Module):
    """A GPT made of gptblock's blocks.

    Token and position embeddings, ``n_layer`` pre-norm blocks, a final LayerNorm and an
    unembedding whose weight is the token embedding's (weight tying). Initialised as GPT-2:
    normal(0, 0.02) weights, residual output projections scaled by 1/sqrt(2 * n_layer), zero
    biases.

    Args:
        config: a ``GPTConfig``.

    Shape:
        ``forward``: idx (B, T) int64 or int32 token ids, T <= block_size; targets (B, T)
        int64 (-1: no target) or None.
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
        self.config = config
        C = config.n_embd
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(config.vocab_size, C),
                "wpe": nn.Embedding(config.block_size, C),
                "drop": nn.Dropout(config.dropout),
                "h": nn.ModuleList([_make_block(config) for _ in range(config.n_layer)]),
                "ln_f": nn.LayerNorm(C, eps=config.norm_eps, bias=config.bias),
            }
        )
        self.lm_head = nn.Linear(C, config.vocab_size, bias=False)
        # Weight tying: the unembedding reads the stream against the same vectors the embedding
        # writes, which saves V * C parameters and trains better at this size (Press & Wolf 2017).
        if config.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        self._init_weights()

    @property
    def wte(self) -> nn.Embedding:
        return cast(nn.Embedding, self.transformer["wte"])

    @property
    def wpe(self) -> nn.Embedding:
        return cast(nn.Embedding, self.transformer["wpe"])

    @property
    def blocks(self) -> list[nn.Module]:
        return list(cast(nn.ModuleList, self.transformer["h"]))

    def _init_weights(self) -> None:
        resid_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for name, p in self.named_parameters():
            if name.endswith(RESIDUAL_PROJECTIONS):
                nn.init.normal_(p, mean=0.0, std=resid_std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() >= 2:  # embeddings, q/k/v (packed or per head), MLP input
                nn.init.normal_(p, mean=0.0, std=0.02)
            else:  # LayerNorm gains
                nn.init.ones_(p)

    # --- other tools' files: gptblock.interop --------------------------------------------------
    # The model imports no I/O, so these four shortcuts, documented since 0.3, are the functions
    # of gptblock.interop, which attaches them to the class when it is imported (as `import
    # gptblock` always does): GPT.from_hf(source, block="fused") is interop.hf.from_hf, to_hf()
    # interop.hf.to_hf_model, save_hf(directory, tokenizer=None) interop.hf.save_hf, and
    # from_nanogpt(path, block="fused") interop.nanogpt.from_nanogpt. Declared here for readers
    # and type checkers; gptblock.load reads every source through one call.
    from_hf: ClassVar[Callable[..., GPT]]
    to_hf: ClassVar[Callable[[GPT], Any]]
    save_hf: ClassVar[Callable[..., Path]]
    from_nanogpt: ClassVar[Callable[..., tuple[GPT, Any]]]

    def num_params(self, exclude_position_embeddings: bool = True) -> int:
        """Number of parameters, the tied embedding/unembedding counted once.

        The position embeddings are excluded by default, as nanoGPT reports its sizes; the
        token embedding stays in because, tied, it is also the output layer.
        """
        n = sum(p.numel() for p in self.parameters())
        return n - self.wpe.weight.numel() if exclude_position_embeddings else n

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> GPTOutput:
        B, T = self._check_ids(idx, "idx")
        # Checking the ids' range reads idx.min() / idx.max() on the host. For ids on the CPU
        # that costs microseconds; on an accelerator it makes the host wait for the device, and
        # under torch.compile it breaks the graph. So a training step on an accelerator, and any
        # compiled call, skips it (the trainer's ids come from a tokenizer, and a bad id still
        # fails in the embedding, with PyTorch's message); eval mode and generate always check.
        check_range = not torch.compiler.is_compiling() and (
            not self.training or idx.device.type == "cpu"
        )
        if check_range:
            self._check_range(idx, "idx")
        if T > self.config.block_size:
            raise UserValueError(
                f"sequence length T={T} exceeds block_size={self.config.block_size}; "
                f"crop the context to the last {self.config.block_size} tokens"
            )
        pos = torch.arange(T, device=idx.device)  # (T,)
        x = self.transformer["drop"](self.wte(idx) + self.wpe(pos))  # (B, T, C)
        for block in self.blocks:
            x = block(x)  # (B, T, C)
        logits = self.lm_head(self.transformer["ln_f"](x))  # (B, T, C) @ (C, V) -> (B, T, V)
        loss = None
        if targets is not None:
            if targets.shape != idx.shape:
                raise UserValueError(
                    f"targets must have the shape of idx {tuple(idx.shape)}, got {tuple(targets.shape)}"
                )
            self._check_ids(targets, "targets")
            if check_range:
                self._check_range(targets, "targets", allow_ignore=True)
            # -1 marks positions without a target (padding), as in nanoGPT.
            loss = F.cross_entropy(logits.view(B * T, -1), targets.reshape(B * T), ignore_index=-1)
        return GPTOutput(logits, loss)

    def _check_ids(self, idx: object, name: str) -> tuple[int, int]:
        """(B, T) of a 2-D integer tensor of token ids; a clear error for anything else.

        Ids are int64 or int32 (what ``F.embedding`` indexes with); targets int64 only (what
        ``F.cross_entropy`` reads). They must be on the model's device.
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
        if idx.device != self.wte.weight.device:
            raise UserValueError(
                f"{name} is on {idx.device} but the model is on {self.wte.weight.device}; "
                f"move one of them"
            )
        return idx.shape[0], idx.shape[1]

    def _check_range(self, idx: torch.Tensor, name: str, allow_ignore: bool = False) -> None:
        """Refuse ids outside [0, V) (-1 allowed for ignored targets): a read on the host."""
        V = self.config.vocab_size
        lo, hi = int(idx.min()), int(idx.max())
        if hi >= V or lo < (-1 if allow_ignore else 0):
            bad = lo if lo < 0 else hi
            raise UserValueError(f"{name} contains token id {bad}, outside the vocabulary [0, {V})")
        if allow_ignore and hi == -1:  # the mean over no targets is 0 / 0
            raise UserValueError(
                f"every entry of {name} is -1 (ignored): there is no target to compute a loss "
                f"over; pass targets=None for the logits alone"
            )

    # --- generation ---------------------------------------------------------------------------

    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        top_k: int | None = None,
        use_cache: bool = True,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Continue each prompt in ``idx`` by ``max_new_tokens`` sampled tokens.

        Args:
            idx: (B, T) prompts of equal length, T >= 1. Longer than block_size is cropped to the
                last block_size tokens, as the model only reads that many.
            max_new_tokens: how many tokens to add; 0 returns the prompt unchanged.
            temperature: divides the logits; 0 means greedy (argmax, no sampling).
            top_k: sample only among the k most likely tokens (clamped to the vocabulary).
            use_cache: keep each block's keys and values so a step processes one token rather
                than the whole context (blocks of the "mha" and "lesson" forms run as fused
                copies for this). The result is the same either way: once the context exceeds
                block_size, the window slides, every position embedding shifts, and the cache is
                rebuilt from the cropped window each step.
            generator: the random generator for sampling, for reproducible output.

        Returns:
            (B, T + max_new_tokens) token ids. The model's train/eval mode is restored.
        """
        steps = self.stream(
            idx,
            max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            use_cache=use_cache,
            generator=generator,
        )
        return torch.cat([idx] + [step.token for step in steps], dim=1)

    def stream(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        top_k: int | None = None,
        use_cache: bool = True,
        generator: torch.Generator | None = None,
    ) -> Iterator[GenerationStep]:
        """``generate``, one step at a time: yields each step's logits and sampled tokens.

        Takes ``generate``'s arguments. Useful to print text as it is produced, or to look at
        the distribution each token was drawn from. The model is in eval mode until the
        iterator is exhausted or closed; then its previous mode is restored.

        Example:
            >>> torch.manual_seed(0) and None
            >>> model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16))
            >>> [tuple(s.token.shape) for s in model.stream(torch.zeros(2, 1, dtype=torch.long), 3)]
            [(2, 1), (2, 1), (2, 1)]
        """
        self._check_ids(idx, "idx")
        self._check_range(idx, "idx")
        if (
            isinstance(max_new_tokens, bool)
            or not isinstance(max_new_tokens, int)
            or max_new_tokens < 0
        ):
            raise UserValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
        if (
            isinstance(temperature, bool)
            or not isinstance(temperature, (int, float))
            or not temperature >= 0
            or math.isinf(temperature)
        ):
            raise UserValueError(
                f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}"
            )
        if top_k is not None and (
            isinstance(top_k, bool) or not isinstance(top_k, int) or top_k <= 0
        ):
            raise UserValueError(f"top_k must be a positive int or None, got {top_k!r}")
        if not isinstance(use_cache, bool):
            raise UserTypeError(f"use_cache must be a bool, got {use_cache!r:.40}")
        if generator is not None and (
            not isinstance(generator, torch.Generator) or generator.device.type != idx.device.type
        ):
            got = generator.device if isinstance(generator, torch.Generator) else generator
            raise UserTypeError(
                f"generator must be a torch.Generator on the model's device type "
                f"({idx.device.type}) or None, got {got!r:.60}"
            )
        k = None if top_k is None else min(top_k, self.config.vocab_size)
        # A separate generator function, so the checks above run when stream() is called rather
        # than at the first next().
        return self._steps(idx, max_new_tokens, temperature, k, use_cache, generator)

    def _steps(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float,
        k: int | None,
        use_cache: bool,
        generator: torch.Generator | None,
    ) -> Iterator[GenerationStep]:
        block_size = self.config.block_size
        was_training = self.training
        self.eval()
        try:
            decoder = CachedDecoder(self) if use_cache else None
            for _ in range(max_new_tokens):
                # no_grad inside the loop, not around it: a `with` spanning the yield would leak
                # the grad mode into the caller between steps.
                with torch.no_grad():
                    window = idx[:, -block_size:]  # what the model can read
                    if decoder is None:
                        logits = self(window).logits
                    elif decoder.length in (0, block_size):
                        # The first step, and every step once the window slides: every position
                        # embedding moved, so the cached keys and values are stale.
                        logits = decoder.prefill(window)
                    else:
                        logits = decoder.step(idx[:, -1:])  # only the newest token
                    last = logits[:, -1, :]  # (B, V)
                    token = sample(last, temperature, k, generator)  # (B, 1)
                    idx = torch.cat([idx, token], dim=1)
                yield GenerationStep(last, token)
        finally:
            self.train(was_training)

    # --- looking inside: gptblock.lens -------------------------------------------------------

    def run_with_cache(
        self,
        idx: torch.Tensor,
        names: Iterable[str] | None = None,
        *,
        hooks: Mapping[str, trace.Hook] | None = None,
    ) -> trace.CachedRun:
        """Logits equal to ``forward``'s and the activations ``names`` (all when None), by the
        names of ``gptblock.lens.trace`` (``embed``, ``blocks.{i}.resid_pre``, ``pattern``, ...).

        Example:
            >>> model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16))
            >>> logits, cache = model.run_with_cache(torch.tensor([[1, 2, 3]]))
            >>> tuple(cache["blocks.0.head_out"].shape)  # (B, T, nh, C)
            (1, 3, 2, 16)
        """
        return trace.run_with_cache(self, idx, names, hooks=hooks)

    def run_with_hooks(self, idx: torch.Tensor, hooks: Mapping[str, trace.Hook]) -> torch.Tensor:
        """Logits (B, T, V) with ``{name: fn}`` applied at named activations (``run_with_cache``'s
        names): ``fn(activation)`` returns the activation to continue with. Every block form
        honours every name; the model is not changed. ``gptblock.lens.run_with_hooks``."""
        return trace.run_with_hooks(self, idx, hooks)


def _make_block(config: GPTConfig) -> nn.Module:
    C, nh, p = config.n_embd, config.n_head, config.dropout
    if config.block in ("fused", "mha"):
        cls = FusedBlock if config.block == "fused" else TransformerBlock
        return cls(
            C,
            nh,
            dropout=p,
            activation=config.activation,
            bias=config.bias,
            norm_eps=config.norm_eps,
        )
    return LessonBlock(C, nh, config.block_size, p)
