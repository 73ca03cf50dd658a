"""A modern block's KV cache, where its ``forward`` has one the checker knows: driven and compared.

The checker calls ``forward(x)`` on whole sequences, where the positions are 0 ... T-1, so a
block whose *cached* decoding step is rotated as position 0 (the catalogue's
``rope_cache_offset``: ``freqs_cis[:seqlen]`` where ``freqs_cis[start_pos : start_pos +
seqlen]`` was meant) passes that comparison. When the block's ``forward`` takes a cache API
recognised by its signature (``CACHE_APIS``), ``probe_cache`` runs the prefix ``x[:, :T-1]``
and then the last token at its offset through the cache, on a copy of the block, and compares
the step's output with the whole sequence's last position:

* ``start_pos`` (Meta's Llama: ``forward(x, start_pos, ...)``, the cache held by the block);
* ``input_pos`` (gpt-fast: a tensor of the positions the tokens go to);
* ``past_key_value(s)`` / ``layer_past`` / ``kv_cache`` (Hugging Face's older layers, nanoGPT
  forks): the prefix's call (with ``use_cache=True`` where it is an argument) returns
  ``(y, cache)``, and the cache is passed back with the step (``position_ids`` set to the
  offset where it is an argument).

A step that differs from the whole sequence is named ``rope_cache_offset`` when it is the
modern block's output with the step's q and k rotated as position 0 (computed by the caller's
``shifted``, the block rebuilt from the parts read); otherwise the report says so in a note.
A block with none of these arguments is "not probed: no cache API recognised". The drive
runs where the block runs (``loop.drive_cache``) and answers data, judged here
(``judge_cache``); ``Source`` is what the modern comparison asks of a block, in this process or
in the block's.

Shapes: B batch, T time, C channels.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from ..mistakes.report import text
from ..serve.loop import CACHE_APIS, NotCached, cache_api, cached_last, drive_cache
from .trace import Trace, record

__all__ = [
    "CACHE_APIS",
    "CacheProbe",
    "NotCached",
    "Source",
    "cache_api",
    "cached_last",
    "judge_cache",
    "probe_cache",
]  # fmt: skip

Tensor = torch.Tensor


@dataclass(frozen=True)
class CacheProbe:
    """What ``probe_cache`` found: a note for the report, and the label of
    ``rope_cache_offset`` when the cached step is rotated as position 0 (else ``""``)."""

    note: str
    offset: str = ""


def probe_cache(
    module: nn.Module,
    x: Tensor,
    error: Callable[[Tensor, Tensor], float],
    tolerance: float,
    shifted: Callable[[Tensor], Tensor] | None,
) -> CacheProbe:
    """Drive ``module``'s cache (on a copy) on ``x`` (B, T, C) and compare the last step
    (``judge_cache`` of ``loop.drive_cache``, both here).

    Args:
        module: the block, whose whole-sequence ``forward(x)`` the comparison found right.
        x: the traced input.
        error: how far a block's output is from a reference's, relative to the reference.
        tolerance: the largest ``error`` that is a match.
        shifted: the rebuilt block on ``x`` with its tokens rotated at the given positions
            (T,) (None when nothing is rotated).
    """
    return judge_cache(*drive_cache(module, x), x, error, tolerance, shifted)


def judge_cache(
    said: dict[str, Any],
    tensors: dict[str, Tensor],
    x: Tensor,
    error: Callable[[Tensor, Tensor], float],
    tolerance: float,
    shifted: Callable[[Tensor], Tensor] | None,
) -> CacheProbe:
    """What ``loop.drive_cache`` answered (where the block runs: plain data, checked here),
    compared: the cached step with the whole sequence's last position."""
    api = said.get("api")
    if api is None:
        return CacheProbe("cache: not probed: no cache API recognised (" + ", ".join(CACHE_APIS) + ")")  # fmt: skip
    if api not in CACHE_APIS:
        return CacheProbe("cache: not probed: an answer about no cache API the checker knows")
    T = x.shape[1]
    how = {"start_pos": f"start_pos={T - 1}", "input_pos": f"input_pos=[{T - 1}]"}.get(
        api, f"{api} from the prefix's call"
    )
    said_ = f"cache ({api}): one step at position {T - 1} ({how}) after the prefix"
    if "raised" in said:
        return CacheProbe(f"cache: not probed: driving {api} raised {text(said['raised'], 300)}")
    whole, step = tensors.get("whole"), tensors.get("step")
    B, _, C = x.shape
    if not (
        isinstance(whole, Tensor) and isinstance(step, Tensor)
        and whole.shape == step.shape == (B, 1, C)
    ):  # fmt: skip
        return CacheProbe(f"cache: not probed: driving {api} gave no (B, 1, C) outputs")
    whole, step = whole.to(x.device), step.to(x.device)
    far = error(step, whole)
    if far <= tolerance:
        return CacheProbe(f"{said_} equals the whole sequence's last position")
    if shifted is not None:
        at = torch.cat((torch.arange(T - 1), torch.zeros(1, dtype=torch.long)))  # step at 0
        if error(step, shifted(at.to(x.device))[:, -1:]) <= tolerance:
            label = (
                f"a cached decoding step at position {T - 1} ({how}) is rotated as position 0: "
                "its q and k are turned by the angles of the first position, not by those of "
                "its offset in the sequence (whole sequences, at positions 0 ... T-1, are right)"
            )
            return CacheProbe(f"{said_} is rotated as position 0", label)
    return CacheProbe(
        f"{said_} differs from the whole sequence's last position (by {far:.2g} of its scale) "
        "in a way not identified (not counted in the verdict)"
    )


@dataclass(frozen=True)
class Source:
    """What the modern comparison asks of the block: a recorded forward pass (``trace_of``),
    an output (``call``), its cache driven (``cache``, ``loop.drive_cache``'s answer). In this
    process, of a module; in ``gptblock check``, requests to the block's process, whose
    answers are data: every reading is made here, by replaying the traces."""

    trace_of: Callable[[Tensor], Trace]
    call: Callable[[Tensor], object]
    cache: Callable[[Tensor], tuple[dict[str, Any], dict[str, Tensor]]]

    @classmethod
    def of(cls, module: nn.Module) -> Source:
        return cls(
            lambda x: record(module, x),
            lambda x: module(x.clone()),
            lambda x: drive_cache(module, x),
        )
