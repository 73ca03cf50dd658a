"""What ``Trainer.fit`` gives back: a ``TrainResult``, or a ``NonFiniteLossError``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["NonFiniteLossError", "TrainResult"]


class NonFiniteLossError(FloatingPointError):
    """The loss became NaN or infinite; the run stopped without saving that state."""


@dataclass(frozen=True)
class TrainResult:
    """What a call to ``Trainer.fit`` did."""

    step: int  # optimizer steps completed
    interrupted: bool  # stopped early (Ctrl-C or request_stop) after saving "last"
    val_loss: float | None  # mean loss over the whole validation split; None if interrupted
    best_val_loss: float | None  # lowest estimated validation loss of the run
    checkpoint: Path | None  # the "last" checkpoint's JSON file, if an out_dir was given
