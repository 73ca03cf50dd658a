"""The files of a Hugging Face ``save_pretrained`` directory, checked before a weight is read:
``config.json``, and every tensor's name and shape in the safetensors headers
(``expected_shapes``, ``llama_shapes``); a tensor the config has no place for is refused, never
skipped, as is one holding NaN or infinities.

Shapes: C = n_embd, V = vocab_size, T = n_positions.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import safetensors
import torch

from ..blocks.config import GPTConfig
from ..errors import UserFileNotFoundError, UserValueError
from .llama import FAMILIES, Layout, is_llama

# Shapes by tensor name; None: a buffer that is not read (any shape).
Shapes = dict[str, tuple[int, ...] | None]


def read_safetensors(
    directory: Path, expected: Shapes, prefix: str = "transformer."
) -> dict[str, torch.Tensor]:
    """Every tensor of the directory's safetensors file(s), each header checked against
    ``expected`` (shapes by name, without ``prefix``) first; a shape None is a buffer older
    transformers saved and recompute (the causal mask, the rotary frequencies): not read."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        files = _shards(index)
    elif (directory / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        pickled = (directory / "pytorch_model.bin").is_file()
        why = (
            "; it has only pytorch_model.bin, which gptblock does not unpickle: re-save it with "
            "save_pretrained(..., safe_serialization=True)"
            if pickled
            else ""
        )
        raise UserFileNotFoundError(f"no model.safetensors in {directory}{why}")
    state: dict[str, torch.Tensor] = {}
    for name in files:
        path = directory / name
        try:
            with safetensors.safe_open(path, framework="pt") as f:
                keys = list(f.keys())
                for key in keys:
                    _check_header(path, key, tuple(f.get_slice(key).get_shape()), expected, prefix)
                for key in keys:
                    if expected[key.removeprefix(prefix)] is None:
                        continue  # a buffer transformers recomputes: not read, here or there
                    if key in state or prefix + key in state or key.removeprefix(prefix) in state:
                        raise UserValueError(f"{path}: {key} is given twice")
                    state[key] = _finite(path, key, f.get_tensor(key))
        except UserValueError:
            raise
        except Exception as e:  # safetensors raises its own SafetensorError, and OSError
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UserValueError(f"{path}: not a readable safetensors file ({first})") from None
    return state


def _check_header(
    path: Path, key: str, shape: tuple[int, ...], expected: Shapes, prefix: str
) -> None:
    """Refuse a tensor config.json's model has no place for, or one of another shape."""
    name = key.removeprefix(prefix)
    if name not in expected:
        raise UserValueError(
            f"{path}: holds {key}, which config.json's model has no place for (every tensor "
            f"is read or refused, none skipped)"
        )
    want = expected[name]
    if want is not None and shape != want:
        raise UserValueError(
            f"{path}: {key} has shape {shape}, but config.json's model needs {want}"
        )


def _finite(path: Path, key: str, t: torch.Tensor) -> torch.Tensor:
    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
        bad = int((~torch.isfinite(t)).sum())
        raise UserValueError(f"{path}: {key} holds {bad:,} NaN or infinite values")
    return t


def read_config_json(directory: Path) -> dict[str, Any]:
    """The fields of ``directory/config.json``, a JSON object, or a one-line error naming it."""
    path = directory / "config.json"
    if not path.is_file():
        raise UserFileNotFoundError(
            f"no config.json in {directory}: a save_pretrained directory holds one, and the "
            f"model's shape cannot be guessed"
        )
    try:
        fields = json.loads(path.read_bytes())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise UserValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(fields, dict):
        raise UserValueError(f"{path}: expected a JSON object, got {type(fields).__name__}")
    return fields


def family_name(directory: str | os.PathLike[str]) -> str:
    """The model family of a directory ``from_hf`` read: "GPT-2", "Llama", "Mistral" or "Qwen2"."""
    model_type = read_config_json(Path(directory)).get("model_type")
    return FAMILIES[str(model_type)] if is_llama(model_type) else "GPT-2"


@contextlib.contextmanager
def naming(directory: Path) -> Iterator[None]:
    """A missing or untied weight's error, naming the directory."""
    try:
        yield
    except UserValueError as e:
        raise UserValueError(f"{directory}: {e}") from None


def _shards(index: Path) -> list[str]:
    """The file names ``model.safetensors.index.json``'s ``weight_map`` lists, each checked."""
    try:
        weight_map = json.loads(index.read_bytes()).get("weight_map")
    except (OSError, UnicodeDecodeError, ValueError, RecursionError, AttributeError) as e:
        raise UserValueError(f"{index}: not a JSON object with a 'weight_map' ({e})") from None
    if not isinstance(weight_map, dict) or not weight_map:
        raise UserValueError(
            f"{index}: field weight_map must map tensor names to file names, got {weight_map!r:.60}"
        )
    files = set(weight_map.values())
    for name in files:
        # A shard lies beside the index: a path elsewhere, or no file, is refused.
        if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
            raise UserValueError(f"{index}: field weight_map names {name!r:.60}, not a file name")
        if not (index.parent / name).is_file():
            raise UserFileNotFoundError(f"{index}: its weight_map names {name}, which is missing")
    return sorted(files)


def expected_shapes(config: GPTConfig) -> Shapes:
    """The shape of every tensor of a GPT-2 ``config``'s weights, by GPT-2's names (without
    ``transformer.``; ``Conv1D`` weights are (in, out)).

    Example:
        >>> shapes = expected_shapes(GPTConfig(11, 8, n_layer=1, n_head=2, n_embd=4))
        >>> shapes["h.0.attn.c_attn.weight"], shapes["lm_head.weight"]
        ((4, 12), (11, 4))
    """
    V, T, C = config.vocab_size, config.block_size, config.n_embd
    shapes: Shapes = {"wte.weight": (V, C), "wpe.weight": (T, C), "lm_head.weight": (V, C)}
    shapes |= {"ln_f.weight": (C,), "ln_f.bias": (C,)}
    # (in, out) per layer; a LayerNorm's is its gain's and bias's (C,)
    layers = {"ln_1": (C,), "attn.c_attn": (C, 3 * C), "attn.c_proj": (C, C), "ln_2": (C,)}
    layers |= {"mlp.c_fc": (C, 4 * C), "mlp.c_proj": (4 * C, C)}
    per_block: Shapes = {"attn.bias": None, "attn.masked_bias": None}  # GPT2Attention's mask
    for name, shape in layers.items():
        per_block |= {f"{name}.weight": shape, f"{name}.bias": shape[-1:]}
    for i in range(config.n_layer):
        shapes |= {f"h.{i}.{k}": v for k, v in per_block.items()}
    return shapes


def llama_shapes(config: GPTConfig, layout: Layout) -> Shapes:
    """The shape of every tensor of a Llama-family checkpoint of ``config``, by Hugging Face's
    names without ``model.``; biases where the ``layout`` has them.

    Example:
        >>> config = GPTConfig(11, 8, n_layer=1, n_head=4, n_embd=8, n_kv_head=2, d_ff=12)
        >>> shapes = llama_shapes(config, Layout("qwen2", True, False, False))
        >>> shapes["layers.0.self_attn.k_proj.bias"], shapes["layers.0.mlp.down_proj.weight"]
        ((4,), (8, 12))
        >>> "layers.0.self_attn.o_proj.bias" in shapes
        False
    """
    V, C, F = config.vocab_size, config.n_embd, config.d_ff
    kv = config.n_kv_head * (C // config.n_head)  # nkv * hs
    shapes: Shapes = {"embed_tokens.weight": (V, C), "norm.weight": (C,), "lm_head.weight": (V, C)}
    per_block: Shapes = {
        "input_layernorm.weight": (C,),
        "post_attention_layernorm.weight": (C,),
        "self_attn.rotary_emb.inv_freq": None,  # transformers before 4.31 saved it
    }
    qkv, o, mlp = layout.qkv_bias, layout.o_bias, layout.mlp_bias
    # name -> (out, in, has a bias)
    linears = {"self_attn.q_proj": (C, C, qkv), "self_attn.k_proj": (kv, C, qkv)}
    linears |= {"self_attn.v_proj": (kv, C, qkv), "self_attn.o_proj": (C, C, o)}
    linears |= {"mlp.gate_proj": (F, C, mlp), "mlp.up_proj": (F, C, mlp)}
    linears |= {"mlp.down_proj": (C, F, mlp)}
    for name, (n_out, n_in, bias) in linears.items():
        per_block[f"{name}.weight"] = (n_out, n_in)
        if bias:
            per_block[f"{name}.bias"] = (n_out,)
    for i in range(config.n_layer):
        shapes |= {f"layers.{i}.{k}": v for k, v in per_block.items()}
    return shapes
