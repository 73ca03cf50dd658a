"""nanoGPT checkpoints: a ``ckpt.pt``'s ``model_args`` and weights as gptblock's GPT.

nanoGPT (``train.py``) saves ``torch.save({"model": state_dict, "model_args": {...}, ...})``.
Its model is GPT-2's with ``nn.Linear`` layers, so the names map as in ``gptblock.interop.hf`` without
the transpose; its MLP is exact GELU (``nn.GELU()``); ``bias=False`` drops every bias, the
LayerNorms' too, as gptblock's ``GPTConfig(bias=False)`` does. A model trained with
``torch.compile`` has every key prefixed ``_orig_mod.``; that prefix is removed. The head is tied
to the token embedding in nanoGPT; a checkpoint whose head differs loads untied.

Nothing runs code from the files. ``torch.load(weights_only=True)`` unpickles tensors, dicts,
lists and numbers only and refuses any other object before creating it; nanoGPT's ``meta.pkl``
(the character vocabulary of ``data/shakespeare_char``: ``{"vocab_size", "itos", "stoi"}``) is
read by an unpickler that refuses every class and function, so only plain dicts, ints and
strings come out of it.

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
from ..model.footprint import FLOAT, check_available, parameter_count
from ..model.gpt import GPT
from .hf import MODEL_TENSORS
from .hf_files import expected_shapes

__all__ = ["from_nanogpt", "read_meta_pkl", "read_nanogpt"]

PREFIX = "_orig_mod."  # what torch.compile puts in front of every key
# nanoGPT's name under transformer.h.{i}. -> gptblock's (both nn.Linear: no transpose).
BLOCK_TENSORS = {
    "ln_1": "norm1",
    "attn.c_attn": "self_attn.in_proj",
    "attn.c_proj": "self_attn.out_proj",
    "ln_2": "norm2",
    "mlp.c_fc": "linear1",
    "mlp.c_proj": "linear2",
}
MODEL_ARGS = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size")


def read_nanogpt(
    path: str | os.PathLike[str],
) -> tuple[GPTConfig, dict[str, torch.Tensor], CharTokenizer | None]:
    """The config, gptblock state_dict and (if ``meta.pkl`` is beside it) vocabulary of a run.

    ``from_nanogpt`` builds the model from them.

    Args:
        path: nanoGPT's ``ckpt.pt``, or the ``out_dir`` holding it.

    Raises:
        UserFileNotFoundError: no such file.
        UserValueError: a file that would run code when unpickled, or that is not a nanoGPT
            checkpoint (the message names what is missing).
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
            vocab_size=args["vocab_size"],
            block_size=args["block_size"],
            n_layer=args["n_layer"],
            n_head=args["n_head"],
            n_embd=args["n_embd"],
            dropout=float(args.get("dropout", 0.0)),
            bias=bool(args.get("bias", True)),
            activation="gelu",
            tie_embeddings=head is None or same,
        )
    except (TypeError, ValueError) as e:
        raise UserValueError(f"{path}: model_args: {e}") from None
    n = parameter_count(config)
    check_available(
        2 * n * FLOAT,  # the weights read, and the model they are copied into
        "cpu",
        f"{path}: a model of {n:,} parameters ({', '.join(f'{k}={args[k]}' for k in MODEL_ARGS)})",
        "this checkpoint's model does not fit in this machine's memory",
    )
    meta = path.parent / "meta.pkl"
    tokenizer = read_meta_pkl(meta) if meta.is_file() else None
    return config, _to_gptblock(state, config, path), tokenizer


def from_nanogpt(
    path: str | os.PathLike[str], *, block: str = "fused"
) -> tuple[GPT, CharTokenizer | None]:
    """The GPT of a nanoGPT ``ckpt.pt`` (or its out_dir), and the character vocabulary of
    the ``meta.pkl`` beside it if there is one; nothing in either file can run code.

    Returns:
        The model in eval mode, float32, on the CPU, and the tokenizer or None.
    """
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
        for theirs, ours in BLOCK_TENSORS.items():
            for kind in kinds:
                # nn.MultiheadAttention's packed projection is a parameter pair, not a Linear.
                name = f"{ours}_{kind}" if ours == "self_attn.in_proj" else f"{ours}.{kind}"
                out[f"transformer.h.{i}.{name}"] = take(f"transformer.h.{i}.{theirs}.{kind}")
    out["lm_head.weight"] = (
        take("lm_head.weight") if "lm_head.weight" in state else out["transformer.wte.weight"]
    )
    return {k: v.detach().to(torch.float32) for k, v in out.items()}


class _PlainUnpickler(pickle.Unpickler):
    """Builds dicts, lists, strings and numbers; refuses every class or function by name."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused to load {module}.{name}: meta.pkl holds data only")


def read_meta_pkl(path: str | os.PathLike[str]) -> CharTokenizer:
    """nanoGPT's character vocabulary (``itos``: id -> character) as a ``CharTokenizer``.

    Raises:
        UserValueError: the file refers to any class or function (it would run code), or is
            not a vocabulary.
    """
    path = Path(path)
    try:
        meta = _PlainUnpickler(io.BytesIO(path.read_bytes())).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as e:
        raise UserValueError(f"{path}: not a plain nanoGPT meta.pkl ({e})") from None
    itos = meta.get("itos") if isinstance(meta, dict) else None
    if not isinstance(itos, dict) or sorted(itos) != list(range(len(itos))):
        raise UserValueError(f"{path}: expected 'itos', a dict from ids 0..V-1 to characters")
    return CharTokenizer([itos[i] for i in range(len(itos))])
