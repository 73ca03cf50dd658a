"""Reading the residual stream: its decomposition, direct logit attribution, the logit lens,
and how sharp and how far back each head attends (docs/look-inside.md).

Direct logit attribution holds the final norm's scale ``s`` at the forward pass's value, so the
components' ``((c - mean(c)) / s * g) . W_U[token]`` plus the biases' add up to the logit exactly
(rejected: each component's own scale, which does not add up). A soft-capped model's is
explained before the cap, which keeps the tokens' ranking and the components' signs.

Shapes: B batch, T time, C = n_embd, V = vocab_size, nh heads, L = n_layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
import torch.nn as nn
from torch.nn import functional as F

from ..blocks.convert import describe
from ..errors import UserTypeError, UserValueError
from ..model.head import soft_cap
from .trace import ActivationCache, CachedRun

if TYPE_CHECKING:
    from ..model.gpt import GPT

__all__ = [
    "HeadSummary",
    "LogitAttribution",
    "LogitLens",
    "attention_entropy",
    "direct_logit_attribution",
    "head_summaries",
    "logit_lens",
    "mean_distance_back",
    "stream_components",
]


def stream_components(cache: ActivationCache) -> dict[str, torch.Tensor]:
    """The (B, T, C) terms whose sum is the final stream, in order: ``embed``, ``L{i} attn``,
    ``L{i} MLP``.

    Example:
        >>> from gptblock import GPT, GPTConfig
        >>> model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16))
        >>> _, cache = model.run_with_cache(torch.tensor([[1, 2, 3]]))
        >>> parts = stream_components(cache)
        >>> list(parts)
        ['embed', 'L0 attn', 'L0 MLP']
        >>> torch.allclose(sum(parts.values()), cache["blocks.0.resid_post"], atol=1e-6)
        True
    """
    parts = {"embed": cache["embed"]}
    for i in range(cache.n_layer):
        parts[f"L{i} attn"] = cache[f"blocks.{i}.attn_out"]
        parts[f"L{i} MLP"] = cache[f"blocks.{i}.mlp_out"]
    return parts


@dataclass(frozen=True)
class LogitAttribution:
    """Each component's direct contribution to one logit: ``values.sum() + bias == logit``.

    Labels ``embed``, ``L{i}H{n}``, ``L{i} MLP``, in stream order; ``logit`` is before any cap.
    """

    token: int  # the token whose logit is attributed
    position: int  # the position (0-based) whose next-token logit it is
    labels: tuple[str, ...]  # one per component
    values: torch.Tensor  # (n_components,) contributions to the logit
    bias: float  # what the biases add: every attention output bias, and ln_f's bias
    logit: float  # the model's logit for the token
    scale: float  # s = sqrt(var(x) + eps) of the final stream, as the forward pass used it
    softcap: float | None = None  # the model's logit_softcap: ``logit`` is then before the cap


def direct_logit_attribution(
    model: GPT, run: CachedRun, token: int, *, position: int = -1, batch: int = 0
) -> LogitAttribution:
    """How much each head, each MLP and the embedding add directly to ``token``'s logit at
    ``position``, from ``model``'s own ``run_with_cache`` result (without hooks).

    Example:
        >>> from gptblock import GPT, GPTConfig
        >>> model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16))
        >>> run = model.run_with_cache(torch.tensor([[1, 2, 3]]))
        >>> a = direct_logit_attribution(model, run, token=4)
        >>> a.labels
        ('embed', 'L0H0', 'L0H1', 'L0 MLP')
        >>> abs(float(a.values.sum()) + a.bias - a.logit) < 1e-5
        True
    """
    with torch.no_grad():  # a read-out: no graph to keep
        return _attribute(model, run, token, position, batch)


def _attribute(
    model: GPT, run: CachedRun, token: int, position: int, batch: int
) -> LogitAttribution:
    cache = run.cache
    C = model.config.n_embd
    if cache.n_layer != model.config.n_layer or cache["embed"].shape[-1] != C:
        raise UserValueError(
            f"run has {cache.n_layer} layer(s) of width {cache['embed'].shape[-1]}, this model "
            f"{model.config.n_layer} of width {C}: pass the model that made the run"
        )
    B, T, V = run.logits.shape
    b, t = _index("batch", batch, B), _index("position", position, T)
    token = _index("token", token, V, negative=False)
    ln_f = cast(nn.LayerNorm, model.transformer["ln_f"])
    x = cache[f"blocks.{cache.n_layer - 1}.resid_post"][b, t]  # (C,): the final stream
    # RMSNorm (norm="rmsnorm") divides by the root mean square and subtracts no mean, so the
    # same identity holds with that scale and without the centring.
    rms = model.config.norm == "rmsnorm"
    scale = torch.sqrt((x.square().mean() if rms else x.var(unbiased=False)) + ln_f.eps)
    direction = ln_f.weight * model.lm_head.weight[token] / scale  # (C,)

    def through(c: torch.Tensor) -> torch.Tensor:  # (..., C) -> (...)
        return (c if rms else c - c.mean(dim=-1, keepdim=True)) @ direction

    labels, parts = ["embed"], [cache["embed"][b, t][None]]  # (1, C)
    bias = torch.zeros((), dtype=x.dtype, device=x.device)
    for i, block in enumerate(model.blocks):
        heads = cache[f"blocks.{i}.head_out"][b, t]  # (nh, C)
        labels += [f"L{i}H{n}" for n in range(heads.shape[0])] + [f"L{i} MLP"]
        parts += [heads, cache[f"blocks.{i}.mlp_out"][b, t][None]]
        b_o = describe(block)[1].get("self_attn.out_proj.bias")
        if b_o is not None:
            bias = bias + through(b_o)
    if getattr(ln_f, "bias", None) is not None:
        bias = bias + ln_f.bias @ model.lm_head.weight[token]
    values = through(torch.cat(parts))  # (n_components,)
    logit, cap = float(run.logits[b, t, token].detach()), model.config.logit_softcap
    total = float(soft_cap(values.sum() + bias, cap))  # a soft cap's slope is at most 1
    # The parts add up to the logit exactly, up to rounding, when ``run`` is this model's own;
    # another model's run (or one with hooks) gives numbers that explain nothing: refused.
    size = float(values.abs().sum()) + abs(float(bias)) + abs(logit)
    if abs(total - logit) > 1e3 * torch.finfo(x.dtype).eps * (1 + size):
        raise UserValueError(
            "run is not this model's own run_with_cache result (without hooks): its logit "
            f"{logit:.4g} is not what this model's parts add up to "
            f"({total:.4g}); pass the model that made it"
        )
    return LogitAttribution(
        token=token,
        position=t,
        labels=tuple(labels),
        values=values,
        bias=float(bias),
        logit=logit if cap is None else float(values.sum() + bias),  # before the cap
        scale=float(scale),
        softcap=cap,
    )


@dataclass(frozen=True)
class LogitLens:
    """The next-token distribution read from the stream after each layer."""

    labels: tuple[str, ...]  # "embed", then "layer 0" ... "layer L-1"
    probs: torch.Tensor  # (L + 1, T, V): ln_f and the unembedding applied to each stage


def logit_lens(
    model: GPT, cache: ActivationCache, *, batch: int = 0, vocab_size: int | None = None
) -> LogitLens:
    """Final LayerNorm and unembedding applied to ``embed`` and every block's ``resid_post``
    (the last row is the model's own); only ids below ``vocab_size``, if given.

    Example:
        >>> from gptblock import GPT, GPTConfig
        >>> model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16))
        >>> logits, cache = model.run_with_cache(torch.tensor([[1, 2, 3]]))
        >>> lens = logit_lens(model, cache)
        >>> lens.labels, tuple(lens.probs.shape)
        (('embed', 'layer 0', 'layer 1'), (3, 3, 11))
        >>> torch.allclose(lens.probs[-1], logits[0].softmax(-1), atol=1e-6)
        True
    """
    n = cache.n_layer
    b = _index("batch", batch, cache["embed"].shape[0])
    stages = [cache["embed"][b]] + [cache[f"blocks.{i}.resid_post"][b] for i in range(n)]
    ln_f = cast(nn.LayerNorm, model.transformer["ln_f"])
    with torch.no_grad():
        logits = model.lm_head(ln_f(torch.stack(stages)))  # (L + 1, T, C) -> (L + 1, T, V)
        logits = soft_cap(logits, model.config.logit_softcap)  # as the model's own head
    V = logits.shape[-1]
    if vocab_size is not None and (
        isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or not 0 < vocab_size <= V
    ):
        raise UserValueError(f"vocab_size must be an int in [1, {V}] or None, got {vocab_size!r}")
    logits = logits[..., :vocab_size]  # (L + 1, T, vocab_size); None keeps all V
    labels = ("embed", *(f"layer {i}" for i in range(n)))
    return LogitLens(labels, F.softmax(logits, dim=-1))


def attention_entropy(pattern: torch.Tensor) -> torch.Tensor:
    """The entropy in bits of each attention row, (..., T, T) -> (..., T), with 0 log 0 = 0.

    Example:
        >>> attention_entropy(torch.tensor([[1.0, 0.0], [0.5, 0.5]]))
        tensor([0., 1.])
    """
    # entr(p) = -p ln p, 0 at p = 0; "+ 0.0" turns the -0.0 of a one-hot row into 0.0
    return torch.special.entr(pattern).sum(dim=-1) / math.log(2) + 0.0


def mean_distance_back(pattern: torch.Tensor) -> torch.Tensor:
    """How far back each query row attends on average, ``sum_j w[t, j] * (t - j)``:
    (..., T, T) -> (..., T).

    Example:
        >>> mean_distance_back(torch.tensor([[1.0, 0.0], [0.5, 0.5]]))
        tensor([0.0000, 0.5000])
    """
    T = pattern.shape[-1]
    steps = torch.arange(T, device=pattern.device, dtype=pattern.dtype)  # (T,)
    back = steps[:, None] - steps[None, :]  # (T, T): t - j
    return (pattern * back).sum(dim=-1)


@dataclass(frozen=True)
class HeadSummary:
    """One head on one prompt: how sharp, how far back, and where the last position looks."""

    layer: int
    head: int
    entropy: float  # bits, the mean over query positions
    distance: float  # mean distance back, the mean over query positions
    top_position: int  # the position the last query attends to most
    top_weight: float  # its weight


def head_summaries(cache: ActivationCache, *, batch: int = 0) -> list[HeadSummary]:
    """A ``HeadSummary`` for every head, layer by layer (means over every query position).

    Example:
        >>> from gptblock import GPT, GPTConfig
        >>> model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16))
        >>> names = ["blocks.0.pattern", "blocks.1.pattern"]
        >>> _, cache = model.run_with_cache(torch.tensor([[1, 2, 3]]), names)
        >>> [(h.layer, h.head) for h in head_summaries(cache)]
        [(0, 0), (0, 1), (1, 0), (1, 1)]
    """
    rows = []
    for i in range(cache.n_layer):
        pattern = cache[f"blocks.{i}.pattern"]
        b = _index("batch", batch, pattern.shape[0])
        p = pattern[b].detach()  # (nh, T, T)
        entropy, distance = attention_entropy(p).mean(-1), mean_distance_back(p).mean(-1)  # (nh,)
        weight, where = p[:, -1].max(dim=-1)  # (nh,) each: the last query's strongest key
        for n in range(p.shape[0]):
            rows.append(
                HeadSummary(
                    i, n, float(entropy[n]), float(distance[n]), int(where[n]), float(weight[n])
                )
            )
    return rows


def _index(name: str, value: object, size: int, *, negative: bool = True) -> int:
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise UserTypeError(f"{name} must be an int, got {value!r}")
    lo = -size if negative else 0
    if not lo <= value < size:
        raise UserValueError(f"{name}={value} is out of range: there are {size}")
    return value % size
