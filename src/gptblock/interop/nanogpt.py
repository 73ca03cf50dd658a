"""nanoGPT checkpoints: a ``ckpt.pt``'s ``model_args`` and weights as gptblock's GPT.

nanoGPT's model is GPT-2's with ``nn.Linear`` layers (not transposed) and exact GELU. Nothing
runs code from the files: ``torch.load(weights_only=True)``, and an unpickler for ``meta.pkl``
(the character vocabulary) that refuses every class and function.

Shapes: C = n_embd.
"""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
from pathlib import Path
from typing import Any

import torch

from ..blocks.config import GPTConfig
from ..data.batches import CharTokenizer
from ..errors import UserFileNotFoundError, UserValueError
from ..model.footprint import check_model
from ..model.gpt import GPT
from .hf import MODEL_TENSORS, block_tensors
from .hf_files import expected_shapes

__all__ = ["from_nanogpt", "read_meta_pkl", "read_nanogpt"]

PREFIX = "_orig_mod."  # what torch.compile puts in front of every key
MODEL_ARGS = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size")


def read_nanogpt(
    path: str | os.PathLike[str],
) -> tuple[GPTConfig, dict[str, torch.Tensor], CharTokenizer | None]:
    """The config, gptblock state_dict and (if ``meta.pkl`` is beside it) vocabulary of a
    nanoGPT ``ckpt.pt`` or of the ``out_dir`` holding it: what ``from_nanogpt`` builds.

    Raises:
        UserValueError: a file that would run code when unpickled, or no nanoGPT checkpoint.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "ckpt.pt"
    if not path.is_file():
        raise UserFileNotFoundError(f"no nanoGPT checkpoint at {path}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0]
        raise UserValueError(
            f"{path}: refused, it holds objects other than tensors and plain values, which "
            f"unpickling would have to run code to build ({first})"
        ) from None
    except Exception as e:  # the unpickler's KeyError, IndexError, ... on bytes of no pickle
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UserValueError(f"{path}: not a readable PyTorch checkpoint ({first})") from None
    if not isinstance(ckpt, dict) or "model" not in ckpt or "model_args" not in ckpt:
        raise UserValueError(f"{path}: not a nanoGPT checkpoint (no 'model' and 'model_args')")
    args, weights = ckpt["model_args"], ckpt["model"]
    if not isinstance(args, dict) or not isinstance(weights, dict):
        raise UserValueError(f"{path}: 'model_args' and 'model' must be dicts")
    missing = [k for k in MODEL_ARGS if k not in args]
    if missing:
        raise UserValueError(f"{path}: model_args lacks {', '.join(missing)}")
    for k in MODEL_ARGS:
        if isinstance(args[k], bool) or not isinstance(args[k], int) or args[k] < 1:
            raise UserValueError(
                f"{path}: model_args {k} must be a positive int, got {args[k]!r:.40}"
            )
    state = {str(k).removeprefix(PREFIX): v for k, v in weights.items()}
    if not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UserValueError(f"{path}: 'model' must map names to tensors")
    head, wte = state.get("lm_head.weight"), state.get("transformer.wte.weight")
    same = (
        head is not None and wte is not None and head.shape == wte.shape and torch.equal(head, wte)
    )
    try:
        config = GPTConfig(
            **{k: args[k] for k in MODEL_ARGS}, dropout=float(args.get("dropout", 0.0)),
            bias=bool(args.get("bias", True)), activation="gelu",
            tie_embeddings=head is None or same,
        )  # fmt: skip
    except (TypeError, ValueError) as e:
        raise UserValueError(f"{path}: model_args: {e}") from None
    advice = "this checkpoint's model does not fit in this machine's memory"
    check_model(config, f"{path}: a model", advice)
    meta = path.parent / "meta.pkl"
    tokenizer = read_meta_pkl(meta) if meta.is_file() else None
    return config, _to_gptblock(state, config, path), tokenizer


def from_nanogpt(
    path: str | os.PathLike[str], *, block: str = "fused"
) -> tuple[GPT, CharTokenizer | None]:
    """``read_nanogpt``'s GPT (eval mode, float32, on the CPU) and its tokenizer or None."""
    config, state, tokenizer = read_nanogpt(path)
    model = GPT(dataclasses.replace(config, block=block))
    model.load_state_dict(state, strict=True)
    return model.eval(), tokenizer


def _to_gptblock(
    state: dict[str, torch.Tensor], config: GPTConfig, path: Path
) -> dict[str, torch.Tensor]:
    def take(key: str) -> torch.Tensor:
        if key not in state:
            raise UserValueError(f"{path}: the weights have no {key!r}")
        want = shapes.get(key.removeprefix("transformer."))
        if want is not None and key.endswith(".weight") and ".h." in key and len(want) == 2:
            want = want[::-1]  # GPT-2's Conv1D is (in, out); nanoGPT's nn.Linear (out, in)
        if want is not None and tuple(state[key].shape) != want:
            raise UserValueError(
                f"{path}: {key} has shape {tuple(state[key].shape)}, but model_args need {want}"
            )
        return state[key]

    shapes = expected_shapes(config)
    kinds = ("weight", "bias") if config.bias else ("weight",)
    names = [k for k in MODEL_TENSORS if config.bias or not k.endswith(".bias")]
    out = {f"transformer.{k}": take(f"transformer.{k}") for k in names}
    for i in range(config.n_layer):
        for theirs, ours, _ in block_tensors(kinds):  # nn.Linear, as gptblock's: no transpose
            out[f"transformer.h.{i}.{ours}"] = take(f"transformer.h.{i}.{theirs}")
    out["lm_head.weight"] = (
        take("lm_head.weight") if "lm_head.weight" in state else out["transformer.wte.weight"]
    )
    return {k: v.detach().to(torch.float32) for k, v in out.items()}


class _PlainUnpickler(pickle.Unpickler):
    """Builds dicts, lists, strings and numbers; refuses every class or function by name."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused to load {module}.{name}: meta.pkl holds data only")


def read_meta_pkl(path: str | os.PathLike[str]) -> CharTokenizer:
    """nanoGPT's character vocabulary (``itos``: id -> character) as a ``CharTokenizer``; a
    ``UserValueError`` if the file refers to any class or function, or is not a vocabulary."""
    path = Path(path)
    try:
        meta = _PlainUnpickler(io.BytesIO(path.read_bytes())).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as e:
        raise UserValueError(f"{path}: not a plain nanoGPT meta.pkl ({e})") from None
    itos = meta.get("itos") if isinstance(meta, dict) else None
    if not isinstance(itos, dict) or sorted(itos) != list(range(len(itos))):
        raise UserValueError(f"{path}: expected 'itos', a dict from ids 0..V-1 to characters")
    return CharTokenizer([itos[i] for i in range(len(itos))])
