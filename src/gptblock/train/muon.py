"""Muon for the blocks' matrices, AdamW for everything else, as one ``torch.optim.Optimizer``.

Muon (Keller Jordan, 2024) applies, instead of a matrix's SGD momentum, its nearest
semi-orthogonal matrix ``U V^T``, by five Newton-Schulz iterations, so rare directions learn as
fast as common ones. Only hidden 2-D weights; a packed q/k/v (3C, C) has ``split=3``, each third
orthogonalised alone. Each group has ``algorithm`` "muon" or "adamw", its ``lr`` and ``lr_scale``.

Shapes: a Muon parameter is (rows, cols); with ``split = s`` it is (s * r, cols).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

__all__ = ["MuonAdamW", "orthogonalise"]

# The quintic's coefficients from the Muon write-up: chosen so the iteration pushes every
# singular value of a unit-norm matrix into about [0.7, 1.2] in five steps (fast, not exact;
# the exact U V^T is not needed for the optimiser to work).
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def orthogonalise(g: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """Approximately ``U V^T`` for ``g = U S V^T``, by Newton-Schulz; batched over leading dims.

    Example:
        >>> g = torch.randn(3, 16, 8)
        >>> s = torch.linalg.svdvals(orthogonalise(g))
        >>> bool(((s > 0.6) & (s < 1.3)).all())
        True
    """
    a, b, c = NS_COEFFICIENTS
    x = g / (g.norm(dim=(-2, -1), keepdim=True) + 1e-7)  # every singular value now <= 1
    wide = x.shape[-2] > x.shape[-1]
    if wide:
        x = x.mT  # iterate on the side with fewer rows: (r, c) with r <= c
    for _ in range(steps):
        A = x @ x.mT  # (r, r)
        x = a * x + (b * A + c * A @ A) @ x  # (r, c)
    return x.mT if wide else x


def _unwrapped(fn: Callable[..., Any]) -> Callable[..., Any]:
    return getattr(fn, "__wrapped__", fn)


class MuonAdamW(torch.optim.Optimizer):
    """Muon for the groups with ``algorithm="muon"``, AdamW for those with ``"adamw"``.

    Muon's options: ``momentum``, ``nesterov``, ``split``, ``ns_steps``, ``ns_dtype``
    ("bfloat16" is 3-4x faster where the CPU has it); AdamW's: ``betas``, ``eps``; both
    ``weight_decay``. The defaults are ``__init__``'s.

    Example:
        >>> w, b = torch.nn.Parameter(torch.randn(8, 4)), torch.nn.Parameter(torch.zeros(8))
        >>> opt = MuonAdamW([{"params": [w], "algorithm": "muon", "lr": 0.02},
        ...                  {"params": [b], "algorithm": "adamw", "lr": 1e-3}])
        >>> (w.sum() + b.sum()).backward(); opt.step()
        >>> sorted(opt.state[w]), sorted(opt.state[b])
        (['momentum_buffer'], ['exp_avg', 'exp_avg_sq', 'step'])
    """

    def __init__(self, groups: Iterable[dict[str, Any]]) -> None:
        defaults: dict[str, Any] = dict(momentum=0.95, nesterov=True, split=1, ns_steps=5)
        defaults |= dict(ns_dtype="float32")
        defaults |= dict(betas=(0.9, 0.99), eps=1e-8, weight_decay=0.0)
        groups = list(groups)
        for g in groups:
            if g.get("algorithm") not in ("muon", "adamw"):
                raise ValueError(f"a group's algorithm must be 'muon' or 'adamw', got {g!r:.80}")
            if g["algorithm"] == "muon":
                for p in g["params"]:
                    if p.dim() != 2 or p.shape[0] % g.get("split", 1):
                        raise ValueError(
                            f"Muon needs 2-D weights whose rows split {g.get('split', 1)} ways, "
                            f"got shape {tuple(p.shape)}"
                        )
        super().__init__(groups, defaults)

    # torch.optim.Optimizer's add_param_group and zero_grad are wrapped by torch._disable_dynamo,
    # which imports torch._dynamo at their first call, to keep torch.compile out of them: 0.8 s
    # on this project's CPU, as long as `import torch` itself, in a speedrun of 12 s. Nothing
    # compiles this optimizer, so it calls the functions under the wrapper (functools.wraps'
    # __wrapped__; where a torch has none, the wrapped function, as before).
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        _unwrapped(torch.optim.Optimizer.add_param_group)(self, param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        _unwrapped(torch.optim.Optimizer.zero_grad)(self, set_to_none)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if group["algorithm"] == "muon":
                self._muon(group)
            else:
                self._adamw(group)
        return loss

    def _muon(self, group: dict[str, Any]) -> None:
        lr, mu, split = group["lr"], group["momentum"], group["split"]
        # Matrices of one shape are orthogonalised together, as one batch: a dozen small
        # (128, 128) Newton-Schulz iterations cost several times one batched iteration on CPU.
        by_shape: dict[tuple[int, int], list[tuple[torch.Tensor, torch.Tensor]]] = {}
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p)
            buf = state["momentum_buffer"]
            buf.mul_(mu).add_(p.grad)
            g = p.grad.add(buf, alpha=mu) if group["nesterov"] else buf
            rows, cols = p.shape[0] // split, p.shape[1]
            by_shape.setdefault((rows, cols), []).append((p, g.view(split, rows, cols)))
        for (rows, cols), items in by_shape.items():
            stacked = torch.cat([g for _, g in items]).to(getattr(torch, group["ns_dtype"]))
            updates = orthogonalise(stacked, group["ns_steps"]).to(items[0][0].dtype)
            # U V^T has unit singular values; scaled so its RMS matches any shape's.
            scale = math.sqrt(max(1.0, rows / cols))
            for (p, _), update in zip(items, torch.split(updates, split), strict=True):
                if group["weight_decay"]:
                    p.mul_(1 - lr * group["weight_decay"])
                p.add_(update.reshape(p.shape), alpha=-lr * scale)

    def _adamw(self, group: dict[str, Any]) -> None:
        lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if "step" not in state:
                state["step"] = 0  # a Python int: reading it never waits for a device
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
            state["step"] += 1
            t = state["step"]
            state["exp_avg"].lerp_(p.grad, 1 - beta1)
            state["exp_avg_sq"].mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
            if group["weight_decay"]:
                p.mul_(1 - lr * group["weight_decay"])
            denom = (state["exp_avg_sq"] / (1 - beta2**t)).sqrt_().add_(eps)
            p.addcdiv_(state["exp_avg"], denom, value=-lr / (1 - beta1**t))
