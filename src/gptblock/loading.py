"""One way to load a GPT, from any of the three places one comes from::

    load("out-gptblock")              a `gptblock train` run: its best checkpoint (``load_gpt``)
    load(hf="path/to/dir")            a Hugging Face directory, with its tokenizer
    load(nanogpt="out/ckpt.pt")       a nanoGPT checkpoint, with the meta.pkl vocabulary beside it

Each returns the same ``Loaded`` (model, tokenizer, ``Source``); reading the files is the
business of ``gptblock.runs`` and ``gptblock.interop``.
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
        names = {"run": f"step {self.step}", "hf": f"Hugging Face {self.family}"}
        return names.get(self.kind, "nanoGPT")

    def __str__(self) -> str:
        return f"{self.path} ({self.what})"


class Loaded(NamedTuple):
    """What ``load`` returns; unpacks as ``model, tokenizer, source = load(...)``."""

    model: GPT  # in eval mode, on the device asked for
    tokenizer: Tokenizer | None  # None only for a nanoGPT checkpoint with no meta.pkl beside it
    source: Source


def load(
    out_dir: str | os.PathLike[str] | None = None, *, hf: str | os.PathLike[str] | None = None,
    nanogpt: str | os.PathLike[str] | None = None, kind: str = BEST,
    device: str | torch.device = "cpu",
) -> Loaded:  # fmt: skip
    """The GPT (eval mode, on ``device``), its tokenizer and its source, from exactly one of
    ``out_dir`` (a run, whose checkpoint ``kind`` "best" or "last" is read), ``hf`` (a Hugging
    Face GPT-2, Llama, Mistral or Qwen2 directory, read offline) and ``nanogpt``.

    Raises:
        UserValueError: none of the three or more than one, or a tokenizer with more tokens
            than the model has embeddings; and whatever the reader raises, naming the file.

    Example:
        >>> load(hf="gpt2", nanogpt="ckpt.pt")
        Traceback (most recent call last):
        ...
        gptblock.errors.UserValueError: give one of out_dir (a gptblock train run), hf (a Hugging Face directory) or nanogpt (a nanoGPT checkpoint), got hf and nanogpt
    """
    places = {"out_dir": out_dir, "hf": hf, "nanogpt": nanogpt}
    given = [name for name, value in places.items() if value is not None]
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
    """``load``'s run case, with the whole checkpoint (every field checked) in place of its
    ``Source``; ``FileNotFoundError`` or ``CheckpointError`` name the file and the problem."""
    target = resolve_device(device) if isinstance(device, str) else device
    ckpt = load_checkpoint(out_dir, kind)
    meta = RunMeta.from_checkpoint(ckpt)
    check_fields(ckpt)
    model = GPT(meta.model_config)
    load_model_state(model, ckpt)
    return model.to(target).eval(), meta.tokenizer, ckpt
