"""What a training run shows a person: the progress bar and the loss-curve picture.

Kept apart from the loop so ``train.py`` reads as the algorithm. Both are for rank 0 only; the
trainer decides who calls them.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from typing import Any

from tqdm.auto import tqdm

from ..files import atomic_write_bytes

__all__ = ["ProgressBar", "save_loss_plot"]


class ProgressBar:
    """A tqdm bar over optimizer steps showing loss, learning rate and tokens per second.

    Args:
        initial: steps already done (a resumed run starts part way).
        total: the step the run ends at.
        enabled: False makes every method a no-op (other ranks, tests).
    """

    def __init__(self, initial: int, total: int, *, enabled: bool = True) -> None:
        self._bar = tqdm(
            initial=initial, total=total, disable=not enabled, unit="step", dynamic_ncols=True
        )

    def advance(self) -> None:
        """Count one more step."""
        self._bar.update(1)

    def show(self, loss: float, lr: float, tokens_per_step: int) -> None:
        """Show the latest loss read, the learning rate and the smoothed token rate."""
        rate = self._bar.format_dict.get("rate") or 0.0  # steps/s, smoothed by tqdm
        self._bar.set_postfix(
            loss=f"{loss:.4f}",
            lr=f"{lr:.2e}",
            tok_s=f"{rate * tokens_per_step:,.0f}",
            refresh=False,
        )

    def close(self) -> None:
        """Finish the bar's line."""
        self._bar.close()


def save_loss_plot(
    losses: Sequence[float], evals: Sequence[dict[str, Any]], path: str | os.PathLike[str]
) -> None:
    """Draw the training loss per step and the estimates at each evaluation into a PNG.

    Written atomically (a reader never sees half a picture). Uses matplotlib's object API on
    the Agg canvas, never ``pyplot``: no global figure state, no display needed.

    Args:
        losses: the training loss of steps 1, 2, ...
        evals: ``{"step", "train", "val"}`` for each loss estimate.
        path: the PNG file to write.
    """
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
