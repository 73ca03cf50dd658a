"""The files of a Hugging Face ``save_pretrained`` directory, checked before a weight is read.

``interop.hf`` and ``interop.llama`` map the weights onto gptblock's; this module only finds and
reads them: the safetensors file, or the shards a ``model.safetensors.index.json`` lists (each a
file beside the index), every tensor's shape checked against the config's (GPT-2's
``expected_shapes``, or ``llama_shapes``) from the file's header, so a wrong file is
refused with its name before its tensors are loaded.

Shapes: C = n_embd, V = vocab_size, T = n_positions.
"""

from __future__ import annotations

import json
from pathlib import Path

import safetensors
import torch

from ..blocks.config import GPTConfig
from ..errors import UserFileNotFoundError, UserValueError


def read_safetensors(
    directory: Path, expected: dict[str, tuple[int, ...]], prefix: str = "transformer."
) -> dict[str, torch.Tensor]:
    """Every tensor of the directory's safetensors file(s), each file's header (names, shapes)
    checked against ``expected`` (shapes by name, without the base model's ``prefix``: GPT-2's
    ``transformer.``, Llama's ``model.``) before its tensors are read."""
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
                for key in f.keys():  # noqa: SIM118 - safe_open is no Mapping
                    shape = tuple(f.get_slice(key).get_shape())
                    want = expected.get(key.removeprefix(prefix))
                    if want is not None and shape != want:
                        raise UserValueError(
                            f"{path}: {key} has shape {shape}, but config.json's model needs {want}"
                        )
                state.update({key: f.get_tensor(key) for key in f.keys()})  # noqa: SIM118
        except UserValueError:
            raise
        except Exception as e:  # safetensors raises its own SafetensorError, and OSError
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UserValueError(f"{path}: not a readable safetensors file ({first})") from None
    return state


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


def expected_shapes(config: GPTConfig) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor of a GPT-2 ``config``'s weights, by GPT-2's names (without
    ``transformer.``; ``Conv1D`` weights are (in, out)).

    Example:
        >>> shapes = expected_shapes(GPTConfig(11, 8, n_layer=1, n_head=2, n_embd=4))
        >>> shapes["h.0.attn.c_attn.weight"], shapes["lm_head.weight"]
        ((4, 12), (11, 4))
    """
    V, T, C = config.vocab_size, config.block_size, config.n_embd
    shapes: dict[str, tuple[int, ...]] = {
        "wte.weight": (V, C),
        "wpe.weight": (T, C),
        "ln_f.weight": (C,),
        "ln_f.bias": (C,),
        "lm_head.weight": (V, C),
    }
    per_block = {
        "ln_1.weight": (C,),
        "ln_1.bias": (C,),
        "attn.c_attn.weight": (C, 3 * C),
        "attn.c_attn.bias": (3 * C,),
        "attn.c_proj.weight": (C, C),
        "attn.c_proj.bias": (C,),
        "ln_2.weight": (C,),
        "ln_2.bias": (C,),
        "mlp.c_fc.weight": (C, 4 * C),
        "mlp.c_fc.bias": (4 * C,),
        "mlp.c_proj.weight": (4 * C, C),
        "mlp.c_proj.bias": (C,),
    }
    for i in range(config.n_layer):
        shapes |= {f"h.{i}.{k}": v for k, v in per_block.items()}
    return shapes


def llama_shapes(config: GPTConfig) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor of a Llama-family checkpoint of ``config``, by Hugging Face's
    names without ``model.`` (biases included: checked where a file has them).

    Example:
        >>> config = GPTConfig(11, 8, n_layer=1, n_head=4, n_embd=8, n_kv_head=2, d_ff=12)
        >>> shapes = llama_shapes(config)
        >>> shapes["layers.0.self_attn.k_proj.weight"], shapes["layers.0.mlp.down_proj.weight"]
        ((4, 8), (8, 12))
    """
    V, C, F = config.vocab_size, config.n_embd, config.d_ff
    kv = config.n_kv_head * (C // config.n_head)  # nkv * hs
    shapes: dict[str, tuple[int, ...]] = {
        "embed_tokens.weight": (V, C),
        "norm.weight": (C,),
        "lm_head.weight": (V, C),
    }
    per_block = {
        "input_layernorm.weight": (C,),
        "post_attention_layernorm.weight": (C,),
        "self_attn.q_proj.weight": (C, C),
        "self_attn.q_proj.bias": (C,),
        "self_attn.k_proj.weight": (kv, C),
        "self_attn.k_proj.bias": (kv,),
        "self_attn.v_proj.weight": (kv, C),
        "self_attn.v_proj.bias": (kv,),
        "self_attn.o_proj.weight": (C, C),
        "self_attn.o_proj.bias": (C,),
        "mlp.gate_proj.weight": (F, C),
        "mlp.gate_proj.bias": (F,),
        "mlp.up_proj.weight": (F, C),
        "mlp.up_proj.bias": (F,),
        "mlp.down_proj.weight": (C, F),
        "mlp.down_proj.bias": (C,),
    }
    for i in range(config.n_layer):
        shapes |= {f"layers.{i}.{k}": v for k, v in per_block.items()}
    return shapes
