"""A GPT trained on a text, end to end: ``prepare_run`` and ``train_gpt``.

Where the pieces of a run meet, so the command line and Python do the same by the same call:
text -> tokenizer -> ``TokenSplits``; preset + settings -> ``GPTConfig`` + ``TrainConfig``;
``RunMeta`` + ``GPT`` -> ``Trainer`` -> checkpoints, which ``gptblock.loading.load_gpt`` reads.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, cast

import torch

from ..data.batches import CharTokenizer, TokenSplits, split_text, split_tokens, token_splits
from ..data.bpe import BPETokenizer
from ..data.text import load_corpus
from ..devices import resolve_device, resolve_dtype
from ..distributed import DistInfo, finish_distributed, init_distributed
from ..errors import UserTypeError, UserValueError, checked
from ..model.footprint import check_memory
from ..model.gpt import GPT
from ..runs.meta import CorpusInfo, RunMeta
from ..runs.rundir import check_run_dir, make_run_dir
from ..sampling import sample_text
from .config import TrainConfig
from .loop import Trainer
from .presets import DEFAULT_PRESET, preset_settings
from .result import TrainResult

__all__ = ["GPTRun", "prepare_run", "train_gpt"]


@dataclass
class GPTRun:
    """A GPT run ready to train (``prepare_run``'s); a context manager, so that a distributed
    run leaves its process group."""

    model: GPT
    tokenizer: CharTokenizer | BPETokenizer
    splits: TokenSplits
    meta: RunMeta
    corpus: CorpusInfo  # where the text came from, its size and fingerprint
    train_config: TrainConfig
    trainer: Trainer
    dist: DistInfo
    resume: bool
    val_characters: int  # the characters the validation targets spell (for per-character loss)
    result: TrainResult | None = field(default=None)  # set by fit

    def per_character(self, loss: float) -> float:
        """A loss per validation token (nats) as nats per character: comparable across
        tokenizers. Divide by ln 2 for bits per character."""
        return loss * (len(self.splits.val) - 1) / self.val_characters

    def fit(self) -> TrainResult:
        """Train (or continue the run, if ``resume``); see ``Trainer.fit``."""
        self.result = self.trainer.fit(resume=self.resume)
        return self.result

    def sample(self, prompt: str | None = None, **kwargs: Any) -> str:
        """``sample_text`` from the model as it is now."""
        return sample_text(self.model, self.tokenizer, prompt, **kwargs)

    def close(self, *, wait: bool = True) -> None:
        """Leave the process group of a distributed run (``wait``: for the others first)."""
        finish_distributed(wait=wait)

    def __enter__(self) -> GPTRun:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # On an error the other processes may never arrive at the barrier: do not wait.
        self.close(wait=kind is None)


@checked
def prepare_run(
    data: str | os.PathLike[str] | None = None,
    *,
    text: str | None = None,
    out_dir: str | os.PathLike[str] | None = "out-gptblock",
    preset: str = DEFAULT_PRESET,
    resume: bool = False,
    allow_other_data: bool = False,
    progress: bool = True,
    **settings: Any,
) -> GPTRun:
    """Build a GPT run on ``data`` (a built-in corpus, "shakespeare" when None, or a UTF-8
    file) or ``text``: tokenizer, splits, model and trainer, from ``preset`` with ``settings``
    (``RunSettings`` fields; None keeps the preset's) put over it.

    The output directory, the settings and the memory a step needs are checked before the
    model is built. A run in ``out_dir`` is continued with ``resume``, never overwritten;
    ``allow_other_data`` lets it continue on another text.
    """
    if data is not None and text is not None:
        raise UserValueError("give data (a file) or text, not both")
    for name, flag in (("resume", resume), ("allow_other_data", allow_other_data)):
        if not isinstance(flag, bool):
            raise UserTypeError(f"{name} must be a bool, got {flag!r:.40}")
    if out_dir is not None:
        # Before anything is read or built; the trainer checks again under the directory's
        # lock when it starts, so the rule holds for every caller.
        check_run_dir(out_dir, resume=resume)
    s = preset_settings(preset, settings)
    device = resolve_device(s.device)
    train_config = s.train_config(device=device, dtype=resolve_dtype(s.dtype, device))
    if text is not None:
        if not isinstance(text, str):
            raise UserTypeError(f"text must be a str, got {type(text).__name__}")
        source = "text given in Python"
    else:
        text, source = load_corpus(data)  # a built-in corpus's name, a file, or the default
    tok, splits, val_characters = _tokenize(text, s.tokenizer, s.vocab_size, s.block_size)
    model_config = s.model_config(tok.vocab_size)
    check_memory(model_config, train_config.batch_size, len(text), train_config.device)
    corpus = CorpusInfo.of(text, source)
    meta = RunMeta(model_config, tok, corpus, allow_other_data=allow_other_data)
    if out_dir is not None:
        make_run_dir(out_dir)  # a place where no directory can be made fails here, not later
    dist, device = init_distributed(train_config.device)
    try:
        train_config = dataclasses.replace(train_config, device=device)
        torch.manual_seed(s.seed)  # the same initial weights on every process
        model = GPT(model_config)
        trainer = Trainer(
            model, splits, train_config, out_dir=out_dir, meta=meta, progress=progress
        )
    except BaseException:
        finish_distributed(wait=False)
        raise
    return GPTRun(
        model, tok, splits, meta, corpus, train_config, trainer, dist, resume, val_characters
    )


def _tokenize(
    text: str, kind: str, vocab_size: int | None, block_size: int
) -> tuple[CharTokenizer | BPETokenizer, TokenSplits, int]:
    # The tokenizer, the splits, and the characters the validation targets spell (all but
    # the first validation token are targets).
    if kind == "char":
        char = CharTokenizer.from_text(text)
        splits = split_tokens(char.encode_tensor(text), block_size)
        return char, splits, len(splits.val) - 1
    train_text, val_text = split_text(text)
    bpe = BPETokenizer.train(train_text, cast(int, vocab_size))  # the validation text is unseen
    splits = token_splits(bpe.encode(train_text), bpe.encode(val_text), block_size)
    first = bpe.decode(splits.val[:1].tolist())
    return bpe, splits, len(val_text) - len(first)


def train_gpt(data: str | os.PathLike[str] | None = None, **kwargs: Any) -> GPTRun:
    """``prepare_run(data, **kwargs)``, then ``fit``: the trained run, its ``result`` set.

    Example:
        >>> import tempfile
        >>> from gptblock.data.text import default_corpus
        >>> run = train_gpt(text=default_corpus()[:5000], out_dir=tempfile.mkdtemp(),
        ...                 n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=4,
        ...                 max_iters=4, eval_interval=2, eval_iters=1, progress=False)
        >>> run.result.step, run.sample("The ", max_new_tokens=8)[:4]
        (4, 'The ')
    """
    with prepare_run(data, **kwargs) as run:
        run.fit()
    return run
