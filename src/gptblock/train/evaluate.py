"""How a language model is scored: loss estimates on random batches, and the whole-split loss.

Any module whose ``forward(idx, targets)`` returns ``(logits, loss)``, run in eval mode under
``no_grad``; under DDP each process scores its share and all return the same sum.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn as nn

from ..data.batches import TokenSplits, full_windows, get_batch
from ..distributed import all_reduce_sum, comm_device, dist_info
from ..errors import UserTypeError
from ..model.generation.decode import GenerationModel

__all__ = ["estimate_loss", "eval_mode", "generation_loss", "loss_of", "validation_loss"]


def loss_of(output: object) -> torch.Tensor:
    """The loss in a model's ``(logits, loss)``, checked (``_, loss = logits`` would "work" for a
    batch of two, and fail far from the mistake).

    Example:
        >>> loss_of((torch.zeros(2, 3, 5), torch.tensor(1.5)))
        tensor(1.5000)
        >>> loss_of(torch.zeros(2, 3, 5))
        Traceback (most recent call last):
        ...
        gptblock.errors.UserTypeError: the model's forward(idx, targets) must return (logits, loss), got a torch.float32 tensor of shape (2, 3, 5)
    """
    if not isinstance(output, (tuple, list)) or len(output) != 2:
        raise UserTypeError(
            f"the model's forward(idx, targets) must return (logits, loss), got {_what(output)}"
        )
    loss = output[1]
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0 or not loss.is_floating_point():
        raise UserTypeError(
            f"the loss a model returns in (logits, loss) must be a scalar float tensor (the mean "
            f"cross-entropy), got {_what(loss)}"
        )
    return loss


def _what(x: object) -> str:
    if isinstance(x, torch.Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)}"
    return f"{type(x).__name__} {x!r:.60}"


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """``model`` in eval mode inside the block; its previous mode restored after, even on error."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


@torch.no_grad()
def estimate_loss(
    model: nn.Module,
    data: TokenSplits,
    *,
    block_size: int,
    batch_size: int,
    iters: int,
    seed: int,
    device: torch.device,
    autocast: contextlib.AbstractContextManager[Any] | None = None,
) -> dict[str, float]:
    """Mean loss over ``iters`` global batches of each split: ``{"train": ..., "val": ...}``,
    from generators re-seeded each call, so estimates differ only because the model did."""
    d = dist_info()
    out = {}
    with eval_mode(model):
        for offset, (split, tokens) in enumerate((("train", data.train), ("val", data.val))):
            g = torch.Generator().manual_seed(seed + 1 + offset)
            total = torch.zeros((), dtype=torch.float64, device=device)
            for _ in range(iters):
                x, y = get_batch(
                    tokens, block_size, batch_size, g, rank=d.rank, world_size=d.world_size
                )  # (B, T) each
                with autocast or contextlib.nullcontext():
                    loss = loss_of(model(x.to(device), y.to(device)))
                total += loss.detach()
            summed = all_reduce_sum(total.reshape(1).to(comm_device(device)))
            out[split] = summed.item() / (iters * d.world_size)
    return out


@torch.no_grad()
def validation_loss(
    model: nn.Module,
    tokens: torch.Tensor,
    *,
    block_size: int,
    batch_size: int,
    device: torch.device,
    autocast: contextlib.AbstractContextManager[Any] | None = None,
) -> float:
    """Mean loss per token over ALL of ``tokens``: each token after the first predicted once.

    Example:
        >>> from gptblock import GPT, GPTConfig
        >>> _ = torch.manual_seed(0)
        >>> model = GPT(GPTConfig(vocab_size=5, block_size=8, n_layer=1, n_head=1, n_embd=8))
        >>> tokens = torch.arange(100) % 5
        >>> loss = validation_loss(model, tokens, block_size=8, batch_size=4, device=torch.device("cpu"))
        >>> abs(loss - torch.log(torch.tensor(5.0)).item()) < 0.1   # untrained: about ln V
        True
    """
    d = dist_info()
    batches = full_windows(tokens, block_size, batch_size)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)  # of loss x targets
    count = 0  # targets scored by this process
    with eval_mode(model):
        for x, y in batches[d.rank :: d.world_size]:  # (B', T') each
            with autocast or contextlib.nullcontext():
                loss = loss_of(model(x.to(device), y.to(device)))
            loss_sum += loss.detach().double() * y.numel()  # the product in float64, as before
            count += y.numel()
    total = torch.stack([loss_sum.cpu(), torch.tensor(float(count), dtype=torch.float64)])
    summed = all_reduce_sum(total.to(comm_device(device))).cpu()
    return summed[0].item() / summed[1].item()


def generation_loss(
    model: nn.Module,
    tokens: torch.Tensor,
    *,
    weights: str | None,
    block_size: int,
    batch_size: int,
    device: torch.device,
) -> float:
    """``validation_loss`` of a ``GPT`` as generation computes it with ``weights`` ("float32",
    "bfloat16", "int8": ``GPT.generate``'s): what reducing the weights costs, as a loss.

    Example:
        >>> from gptblock import GPT, GPTConfig
        >>> _ = torch.manual_seed(0)
        >>> model = GPT(GPTConfig(vocab_size=5, block_size=8, n_layer=1, n_head=1, n_embd=16))
        >>> tokens, cpu = torch.arange(100) % 5, torch.device("cpu")
        >>> full = validation_loss(model, tokens, block_size=8, batch_size=4, device=cpu)
        >>> low = generation_loss(model, tokens, weights="int8", block_size=8, batch_size=4, device=cpu)
        >>> abs(low - full) < 0.01
        True
    """
    view = GenerationModel(model, weights)
    return validation_loss(
        view, tokens, block_size=block_size, batch_size=batch_size, device=device
    )
