"""How much memory a GPT run needs, estimated before anything is allocated, and how much there is.

An absurd ``--batch-size`` is refused with a number, not the out-of-memory killer.
``train_memory`` adds up one training step's peak: parameters (counted from the shape: even a
``meta`` model takes minutes to build for an absurd ``--n-layer``), gradients, AdamW's moments,
the activations and the text. The per-block counts (``PER_BLOCK``, ``DROPOUT``) were measured
(the profiler's peak at two depths, PyTorch 2.13, CPU); ``tests/test_footprint.py`` holds the
estimate within -20% / +35% of it. A GPU's flash attention keeps no (T, T) weights: it errs high.

Shapes: B batch, T time (block_size), C = n_embd, V = vocab_size, nh = n_head, L = n_layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..blocks.config import GPTConfig
from ..devices import available_memory
from ..errors import UserValueError
from .embeddings import SMEAR_CHANNELS, bigram_rows

__all__ = ["MemoryEstimate", "check_available", "check_memory", "check_model", "parameter_count"]
__all__ += ["train_memory"]

FLOAT = 4  # bytes of a float32 parameter or activation
# Per block form: the (B, T, C) and (B, nh, T, T) float32 tensors a block keeps for its backward
# pass, and what dropout adds (its masks are kept as floats, and attention with dropout
# materialises its weights).
PER_BLOCK = {"fused": (15, 0.0), "mha": (15, 0.0), "lesson": (10, 1.25)}
DROPOUT = {"fused": (6, 3.0), "mha": (8, 3.0), "lesson": (2, 2.0)}
STREAM = 5  # (B, T, C) tensors outside the blocks: embeddings, final LayerNorm
LOGITS = 4  # (B, T, V) tensors: the logits, their log-softmax, and gradients
ENCODING_BYTES = 12  # per character at the peak of CharTokenizer.encode_tensor


@dataclass(frozen=True)
class MemoryEstimate:
    """The bytes a training run needs at its peak, by part."""

    parameters: int  # the number of parameters
    weights: int  # parameters, their gradients, and buffers
    optimizer: int  # AdamW's exp_avg and exp_avg_sq
    activations: int  # what one training step keeps for its backward pass
    data: int  # the text's token ids, and encoding them

    @property
    def total(self) -> int:
        # AdamW's update temporaries (one float per parameter) exist after the backward pass
        # has freed the activations: only the larger of the two is held at once.
        update = self.parameters * FLOAT
        return self.weights + self.optimizer + max(self.activations, update) + self.data

    def describe(self) -> str:
        """The parts in GiB, for a message."""
        return (
            f"{gib(self.weights)} for {self.parameters:,} parameters and their gradients, "
            f"{gib(self.optimizer)} for AdamW, {gib(self.activations)} for the activations of "
            f"one step, {gib(self.data)} for the text"
        )


def gib(n: int) -> str:
    """``n`` bytes in GiB (MiB, KiB below one), for messages.

    Example:
        >>> gib(3 * 2**30 // 2), gib(5 * 2**20), gib(2048)
        ('1.5 GiB', '5.0 MiB', '2.0 KiB')
    """
    for unit, size in (("GiB", 2**30), ("MiB", 2**20)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n / 2**10:,.1f} KiB"


def parameter_count(config: GPTConfig) -> int:
    """The number of parameters of ``GPT(config)``, the tied head counted once.

    Example:
        >>> parameter_count(GPTConfig(65, 64, n_layer=4, n_head=4, n_embd=128))
        809856
    """
    V, T, C, F = config.vocab_size, config.block_size, config.n_embd, config.d_ff
    b = 1 if config.bias else 0
    norm = (2 if config.bias and config.norm == "layernorm" else 1) * C  # gain (and bias)
    if config.block == "lesson":  # bias-free per-head q/k/v; biases elsewhere; 2 LayerNorms
        per_block = 12 * C * C + 10 * C
    else:
        hs = C // config.n_head
        qkv = C + 2 * config.n_kv_head * hs  # q rows, then the key/value heads' k and v
        attn = qkv * (C + b) + C * (C + b) + (2 * hs if config.qk_norm else 0)
        n_in = 2 if config.mlp == "swiglu" else 1  # SwiGLU's gate and linear branch
        mlp = n_in * F * (C + b) + C * (F + b)
        per_block = attn + mlp + (1 if config.parallel_residual else 2) * norm
    positions = T * C if config.position == "learned" else 0
    head = 0 if config.tie_embeddings else V * C
    # embeddings.InputMix: the pair table; the smear's gate and scale
    inputs = bigram_rows(V) * C * config.bigram + (min(SMEAR_CHANNELS, C) + 1) * config.smear
    return V * C + positions + config.n_layer * per_block + norm + head + inputs


def train_memory(config: GPTConfig, batch_size: int, characters: int = 0) -> MemoryEstimate:
    """The memory a float32 training run of a GPT of ``config`` needs at its peak.

    Args:
        batch_size: B, sequences per step.
        characters: the length of the text it trains on (0: leave the data out).

    Example:
        >>> est = train_memory(GPTConfig(65, 64, n_layer=4, n_head=4, n_embd=128), 16)
        >>> est.parameters, est.optimizer == 8 * est.parameters, gib(est.total)
        (809856, True, '45.9 MiB')
    """
    n = parameter_count(config)
    B, T, C, V, nh = batch_size, config.block_size, config.n_embd, config.vocab_size, config.n_head
    stream, weights = PER_BLOCK[config.block]
    if config.dropout > 0:
        stream, weights = stream + DROPOUT[config.block][0], weights + DROPOUT[config.block][1]
    per_block = stream * B * T * C + weights * B * nh * T * T  # floats
    floats = config.n_layer * per_block + STREAM * B * T * C + LOGITS * B * T * V
    # The lesson's heads each keep a (T, T) lower-triangular mask as a float buffer.
    buffers = config.n_layer * nh * T * T * FLOAT if config.block == "lesson" else 0
    return MemoryEstimate(
        parameters=n, weights=2 * n * FLOAT + buffers, optimizer=2 * n * FLOAT,
        activations=int(floats * FLOAT), data=characters * (8 + ENCODING_BYTES),
    )  # fmt: skip


def check_memory(
    config: GPTConfig, batch_size: int, characters: int, device: str | torch.device
) -> MemoryEstimate:
    """``train_memory``, refused (naming its parts) when it exceeds what ``device`` has
    available; on a GPU the text stays on the host, so only the model's part counts."""
    estimate = train_memory(config, batch_size, characters)
    on_cpu = torch.device(device).type == "cpu"
    check_available(
        estimate.total if on_cpu else estimate.total - estimate.data, device, "a run of this size",
        f"lower --batch-size (batch_size={batch_size}), --n-embd, --n-layer or --block-size",
        detail=estimate.describe(),
    )  # fmt: skip
    return estimate


def check_model(
    config: GPTConfig, what: str, advice: str, copies: int = 2, cache: bool = False,
    device: str | torch.device = "cpu", itemsize: int = FLOAT,
) -> None:  # fmt: skip
    """Refuse, before anything is allocated, a GPT of ``config`` whose ``copies`` of the weights
    (and with ``cache`` the KV cache generating from it holds) do not fit on ``device``."""
    n = parameter_count(config)
    hs = config.n_embd // config.n_head
    kv = 2 * config.n_layer * config.n_kv_head * config.block_size * hs * FLOAT if cache else 0
    shape = f"n_layer={config.n_layer}, n_embd={config.n_embd}, vocab_size={config.vocab_size}"
    shape += f", block_size={config.block_size}"
    with_cache = f" with a KV cache of {config.block_size:,} positions" if cache else ""
    needed = copies * n * itemsize + kv
    check_available(needed, device, f"{what} of {n:,} parameters ({shape}){with_cache}", advice)


def check_available(
    needed: int, device: str | torch.device, what: str, advice: str, detail: str = ""
) -> None:
    """Refuse ``needed`` bytes (``detail``: of what) for ``what`` when ``device`` has less
    available, with the ``advice``; nothing is refused where that is unknown.

    Example:
        >>> check_available(2**80, "cpu", "a yobibyte", "buy more memory")
        Traceback (most recent call last):
        ...
        gptblock.errors.UserValueError: a yobibyte needs about 1,125,899,906,842,624.0 GiB but cpu has ... available; buy more memory
    """
    device = torch.device(device)
    available = available_memory(device)
    if available is not None and needed > available:
        parts = f" ({detail})" if detail else ""
        raise UserValueError(
            f"{what} needs about {gib(needed)}{parts} but {device.type} has {gib(available)} "
            f"available; {advice}"
        )
