"""What a training run shows a person (rank 0): the progress bar and the loss-curve picture."""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from typing import Any

from tqdm.auto import tqdm

from ..files import atomic_write_bytes

__all__ = ["ProgressBar", "save_loss_plot"]


class ProgressBar:
    """A tqdm bar over steps ``initial`` to ``total``: loss, learning rate, tokens per second."""

    def __init__(self, initial: int, total: int, *, enabled: bool = True) -> None:
        self._bar = tqdm(
            initial=initial, total=total, disable=not enabled, unit="step", dynamic_ncols=True
        )

    def advance(self) -> None:
        self._bar.update(1)

    def show(self, loss: float, lr: float, tokens_per_step: int) -> None:
        rate = self._bar.format_dict.get("rate") or 0.0  # steps/s, smoothed by tqdm
        self._bar.set_postfix(
            loss=f"{loss:.4f}",
            lr=f"{lr:.2e}",
            tok_s=f"{rate * tokens_per_step:,.0f}",
            refresh=False,
        )

    def close(self) -> None:
        self._bar.close()


def save_loss_plot(
    losses: Sequence[float], evals: Sequence[dict[str, Any]], path: str | os.PathLike[str]
) -> None:
    """Draw the loss of steps 1, 2, ... and each estimate of ``evals`` into a PNG, atomically
    (matplotlib's object API on Agg: no pyplot state, no display)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    steps = range(1, len(losses) + 1)
    ax.plot(steps, losses, color="tab:blue", alpha=0.35, linewidth=0.8, label="train (each step)")
    if evals:
        at = [e["step"] for e in evals]
        ax.plot(at, [e["train"] for e in evals], "o-", color="tab:blue", label="train (estimate)")
        ax.plot(
            at, [e["val"] for e in evals], "o-", color="tab:orange", label="validation (estimate)"
        )
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy loss (nats per token)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    atomic_write_bytes(path, buf.getvalue())
