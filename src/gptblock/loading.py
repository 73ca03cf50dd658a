"""One way to load a GPT, from any of the three places one comes from::

    load("out-gptblock")              a `gptblock train` run: its best checkpoint (``load_gpt``)
    load(hf="path/to/dir")            a Hugging Face directory (GPT-2, Llama, Mistral, Qwen2),
                                      with its tokenizer
    load(nanogpt="out/ckpt.pt")       a nanoGPT checkpoint, with the meta.pkl vocabulary beside it

Each returns the same ``Loaded``: the model (eval mode, on ``device``), its tokenizer and the
``Source`` it came from. ``gptblock sample`` and ``gptblock inspect`` load through it, by their
``--out`` / ``--hf`` / ``--nanogpt`` options. Reading each kind of file is the business of the
layers below (``gptblock.runs`` for runs, ``gptblock.interop`` for the others); this module only
picks the reader and gives every answer one shape.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch

from .data.batches import CharTokenizer, Tokenizer
from .data.bpe import BPETokenizer, as_char_tokenizer
from .devices import resolve_device
from .errors import UserValueError
from .interop.hf import from_hf
from .interop.hf_files import family_name
from .interop.nanogpt import from_nanogpt
from .model.gpt import GPT
from .runs.checkpoint import BEST, Checkpoint, load_checkpoint
from .runs.meta import RunMeta
from .runs.statedict import load_model_state
from .train.state import check_fields

__all__ = ["Loaded", "Source", "load", "load_gpt"]

KINDS = ("run", "hf", "nanogpt")


@dataclass(frozen=True)
class Source:
    """Where a loaded model came from.

    Example:
        >>> print(Source("run", Path("out-gptblock/best.json"), step=150))
        out-gptblock/best.json (step 150)
    """

    kind: str  # "run" (a gptblock train directory), "hf" (Hugging Face) or "nanogpt"
    path: Path  # the run's checkpoint (its JSON file), the Hugging Face directory, the ckpt.pt
    step: int | None = None  # the optimizer steps a run's checkpoint had taken; None otherwise
    family: str = "GPT-2"  # a Hugging Face model's: "GPT-2", "Llama", "Mistral" or "Qwen2"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise UserValueError(f"kind must be one of {KINDS}, got {self.kind!r}")

    @property
    def what(self) -> str:
        """The kind, in words: ``"step 150"``, ``"Hugging Face Llama"`` or ``"nanoGPT"``."""
        names = {
            "run": f"step {self.step}",
            "hf": f"Hugging Face {self.family}",
            "nanogpt": "nanoGPT",
        }
        return names[self.kind]

    def __str__(self) -> str:
        return f"{self.path} ({self.what})"


class Loaded(NamedTuple):
    """What ``load`` returns; unpacks as ``model, tokenizer, source = load(...)``."""

    model: GPT  # in eval mode, on the device asked for
    tokenizer: Tokenizer | None  # None only for a nanoGPT checkpoint with no meta.pkl beside it
    source: Source


def load(
    out_dir: str | os.PathLike[str] | None = None,
    *,
    hf: str | os.PathLike[str] | None = None,
    nanogpt: str | os.PathLike[str] | None = None,
    kind: str = BEST,
    device: str | torch.device = "cpu",
) -> Loaded:
    """The GPT, its tokenizer and its source, from exactly one of three places.

    Args:
        out_dir: a directory ``gptblock train --out`` wrote; its checkpoint ``kind`` is read.
        hf: a Hugging Face GPT-2, Llama, Mistral or Qwen2 directory (``save_pretrained``'s
            config, safetensors and tokenizer), read offline.
        nanogpt: nanoGPT's ``ckpt.pt`` or the out_dir holding it; its character vocabulary is
            the ``meta.pkl`` beside it, if there is one.
        kind: a run's checkpoint: "best" (the lowest validation loss) or "last".
        device: where to put the model ("cpu", "cuda", "auto", ...).

    Raises:
        UserValueError: none of the three or more than one, or a tokenizer with more tokens
            than the model has embeddings; and whatever the reader raises, naming the file.

    Example:
        >>> load(hf="gpt2", nanogpt="ckpt.pt")
        Traceback (most recent call last):
        ...
        gptblock.errors.UserValueError: give one of out_dir (a gptblock train run), hf (a Hugging Face directory) or nanogpt (a nanoGPT checkpoint), got hf and nanogpt
    """
    given = [
        n for n, v in (("out_dir", out_dir), ("hf", hf), ("nanogpt", nanogpt)) if v is not None
    ]
    if len(given) != 1:
        raise UserValueError(
            f"give one of out_dir (a gptblock train run), hf (a Hugging Face directory) "
            f"or nanogpt (a nanoGPT checkpoint), got {' and '.join(given) or 'none'}"
        )
    if out_dir is not None:
        model, run_tokenizer, ckpt = load_gpt(out_dir, kind, device)
        return Loaded(model, run_tokenizer, Source("run", ckpt.path, int(ckpt.meta["step"])))
    tokenizer: Tokenizer | None
    if hf is not None:
        bpe = BPETokenizer.from_directory(hf)
        tokenizer = as_char_tokenizer(bpe) or bpe  # a character run exported by save_hf
        model, source = from_hf(hf), Source("hf", Path(hf), family=family_name(hf))
    else:
        path = Path(nanogpt)  # type: ignore[arg-type]  # not None: exactly one was given
        model, tokenizer = from_nanogpt(path)
        source = Source("nanogpt", path / "ckpt.pt" if path.is_dir() else path)
    if tokenizer is not None and tokenizer.vocab_size > model.config.vocab_size:
        raise UserValueError(
            f"{source.path}: its tokenizer has {tokenizer.vocab_size} tokens, more than the "
            f"model's vocab_size={model.config.vocab_size}"
        )
    target = resolve_device(device) if isinstance(device, str) else device
    return Loaded(model.to(target).eval(), tokenizer, source)


def load_gpt(
    out_dir: str | os.PathLike[str], kind: str = BEST, device: str | torch.device = "cpu"
) -> tuple[GPT, CharTokenizer | BPETokenizer, Checkpoint]:
    """Rebuild the trained GPT and its tokenizer from a ``gptblock train`` output directory:
    ``load``'s run case, with the whole checkpoint in place of its ``Source``.

    Every field of the checkpoint is checked (``RunMeta.from_checkpoint``,
    ``train.state.check_fields``, the weights' shapes, ties and finiteness) before the model
    is returned.

    Args:
        out_dir: the directory ``gptblock train --out`` wrote.
        kind: "best" (lowest validation loss, the default) or "last".
        device: where to put the model.

    Returns:
        The model in eval mode, the tokenizer, and the checkpoint (for its other fields).

    Raises:
        FileNotFoundError, CheckpointError: naming the file and the problem.
    """
    target = resolve_device(device) if isinstance(device, str) else device
    ckpt = load_checkpoint(out_dir, kind)
    meta = RunMeta.from_checkpoint(ckpt)
    check_fields(ckpt)
    model = GPT(meta.model_config)
    load_model_state(model, ckpt)
    return model.to(target).eval(), meta.tokenizer, ckpt
