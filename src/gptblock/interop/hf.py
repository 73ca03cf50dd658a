"""Hugging Face's models and gptblock's GPT, weight for weight: ``from_hf``, ``to_hf``, ``save_hf``.

GPT-2 is gptblock's GPT with other names (``LAYERS``), ``Conv1D`` weights transposed; ``c_attn``
packs q, k and v as ``nn.MultiheadAttention`` does; ``gelu_new`` is ``"gelu_tanh"``. Llama,
Mistral and Qwen2 are ``interop.llama``'s. A config the blocks cannot compute is refused, naming
the field; nothing is approximated, downloaded or unpickled.

Shapes: C = n_embd, V = vocab_size, nh heads.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from ..blocks.config import GPTConfig
from ..blocks.convert import convert
from ..data.bpe import tokenizers_of
from ..errors import UserFileNotFoundError, UserTypeError, UserValueError
from ..files import make_directory
from ..model.embeddings import refuse_inputs
from ..model.footprint import check_model
from ..model.gpt import GPT
from . import hf_files, llama
from .hf_fields import check_fields, transformers_module

__all__ = ["config_from_hf", "config_to_hf", "from_hf", "read_hf", "save_hf", "to_hf"]

FORMATS = ("gpt2", *llama.FAMILIES)  # what to_hf writes

# Hugging Face's activation names -> the blocks'. gelu_new and gelu_pytorch_tanh are one function.
ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
ACTIVATIONS |= {"relu": "relu"}
TO_HF_ACTIVATION = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}
# GPT-2's (and nanoGPT's) layer under h.{i}. -> gptblock's under transformer.h.{i}.
LAYERS = {"ln_1": "norm1", "attn.c_attn": "self_attn.in_proj", "attn.c_proj": "self_attn.out_proj"}
LAYERS |= {"ln_2": "norm2", "mlp.c_fc": "linear1", "mlp.c_proj": "linear2"}


def block_tensors(kinds: tuple[str, ...] = ("weight", "bias")) -> list[tuple[str, str, bool]]:
    """(GPT-2's tensor, gptblock's, transposed?) per tensor of a block: a ``Conv1D`` weight is."""
    return [
        # nn.MultiheadAttention's packed projection is a parameter pair, not a Linear.
        (f"{theirs}.{kind}", f"{ours}_{kind}" if ours.endswith("in_proj") else f"{ours}.{kind}",
         kind == "weight" and not theirs.startswith("ln_"))
        for theirs, ours in LAYERS.items() for kind in kinds
    ]  # fmt: skip


BLOCK_TENSORS = block_tensors()
MODEL_TENSORS = ["wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"]


def config_from_hf(hf: Any) -> GPTConfig:
    """The ``GPTConfig`` of a ``GPT2Config``; refuses, naming the field, what the blocks lack.

    Example:
        >>> from transformers import GPT2Config
        >>> config_from_hf(GPT2Config(n_layer=2, n_head=2, n_embd=8, vocab_size=11)).activation
        'gelu_tanh'
        >>> config_from_hf(GPT2Config(scale_attn_by_inverse_layer_idx=True))
        Traceback (most recent call last):
        ...
        gptblock.errors.UserValueError: GPT-2 config field scale_attn_by_inverse_layer_idx=True: gptblock's blocks scale every layer's attention by 1/sqrt(hs) alone
    """
    c = hf.to_dict() if hasattr(hf, "to_dict") else dict(hf)
    check_fields(c, "gpt2")

    def refuse(field: str, why: str) -> UserValueError:
        return UserValueError(f"GPT-2 config field {field}={c.get(field)!r}: {why}")

    if c.get("model_type", "gpt2") != "gpt2":
        raise refuse("model_type", "only GPT-2 models convert")
    if c.get("n_inner") not in (None, 4 * c["n_embd"]):
        raise refuse("n_inner", f"the blocks' MLP is 4 * n_embd = {4 * c['n_embd']} wide")
    if c.get("activation_function") not in ACTIVATIONS:
        raise refuse("activation_function", f"the blocks support {sorted(ACTIVATIONS)}")
    rules = [
        ("scale_attn_weights", True, "the blocks always scale the scores by 1/sqrt(hs)"),
        ("scale_attn_by_inverse_layer_idx", False, "gptblock's blocks scale every layer's attention by 1/sqrt(hs) alone"),
        ("reorder_and_upcast_attn", False, "the blocks compute attention in the model's dtype"),
        ("add_cross_attention", False, "the blocks have self-attention only"),
        ("is_encoder_decoder", False, "gptblock's GPT is a decoder alone"),
    ]  # fmt: skip
    for field, wanted, why in rules:
        if bool(c.get(field, wanted)) != wanted:
            raise refuse(field, why)
    eps = c.get("layer_norm_epsilon", 1e-5)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise refuse("layer_norm_epsilon", "one epsilon for every LayerNorm is expected")
    drops = {c.get(k, 0.1) for k in ("resid_pdrop", "embd_pdrop", "attn_pdrop")}
    if len(drops) != 1:
        raise refuse("attn_pdrop", "gptblock's GPT has one dropout probability for all three")
    return GPTConfig(
        vocab_size=c["vocab_size"], block_size=c["n_positions"], n_layer=c["n_layer"],
        n_head=c["n_head"], n_embd=c["n_embd"], dropout=float(drops.pop()), bias=True,
        activation=ACTIVATIONS[c["activation_function"]], norm_eps=float(eps),
        tie_embeddings=bool(c.get("tie_word_embeddings", True)),
    )  # fmt: skip


def config_to_hf(config: GPTConfig) -> Any:
    """The ``GPT2Config`` computing what ``config`` does; refuses what GPT-2 cannot express."""
    # The modern block's options (issue 20) are not GPT-2's; Llama's format is their future home.
    modern = [name for name in config.block_config().modern if name != "position"]
    if config.position != "learned":
        modern.append("position")
    if config.activation not in TO_HF_ACTIVATION:
        modern.append("activation")
    if modern:
        name = modern[0]
        raise UserValueError(
            f"GPT-2's format cannot express {name}={getattr(config, name)!r}: only GPT-2's "
            f"block (norm='layernorm', mlp='dense', learned positions, ...) saves as GPT-2"
        )
    if not config.bias:
        raise UserValueError("GPT-2 has biases in every layer; this GPT has bias=False")
    p = config.dropout
    return transformers_module().GPT2Config(
        vocab_size=config.vocab_size, n_positions=config.block_size, n_embd=config.n_embd,
        n_layer=config.n_layer, n_head=config.n_head, n_inner=None,
        activation_function=TO_HF_ACTIVATION[config.activation], resid_pdrop=p, embd_pdrop=p,
        attn_pdrop=p, layer_norm_epsilon=config.norm_eps,
        tie_word_embeddings=config.tie_embeddings,
        # A character-level model has no end-of-text token; GPT-2's 50256 would not exist.
        bos_token_id=None, eos_token_id=None,
    )  # fmt: skip


def read_hf(source: Any) -> tuple[GPTConfig, dict[str, torch.Tensor]]:
    """The ``GPTConfig`` and gptblock state_dict of a Hugging Face model or saved directory
    (what ``from_hf`` builds the model from).

    ``source``: a ``transformers`` ``GPT2LMHeadModel``, ``LlamaForCausalLM``,
    ``MistralForCausalLM`` or ``Qwen2ForCausalLM``, or a local directory holding its
    ``config.json`` and ``model.safetensors`` (or shards and their index); a hub name is not
    read. A config the blocks cannot compute, or weights of other shapes, are refused.
    """
    tf = transformers_module()
    layout: llama.Layout | None = None
    if isinstance(source, (str, os.PathLike)):
        directory = Path(source)
        if not directory.is_dir():
            raise UserFileNotFoundError(
                f"{directory} is not a directory; from_hf reads a local save_pretrained "
                f"directory (nothing is downloaded: a hub name is not a directory)"
            )
        path = directory / "config.json"
        fields = hf_files.read_config_json(directory)
        if llama.is_llama(fields.get("model_type")):
            config, layout = llama.config_from_llama(fields, f"{path}: ")
        else:
            config = _gpt2_config(fields, path, tf)
        advice = "this directory's model does not fit in this machine's memory"
        check_model(config, f"{path}: a model", advice, cache=True)  # before the shapes' table
        if layout is None:
            shapes, prefix = hf_files.expected_shapes(config), "transformer."
        else:
            shapes, prefix = hf_files.llama_shapes(config, layout), "model."
        state = hf_files.read_safetensors(directory, shapes, prefix)
        with hf_files.naming(directory):
            return config, _to_gptblock(state, config, layout)
    if isinstance(source, nn.Module) and hasattr(source, "config"):
        if llama.is_llama(getattr(source.config, "model_type", None)):
            fields = source.config.to_dict()  # type: ignore[union-attr, operator]
            config, layout = llama.config_from_llama(fields)
        else:
            config = config_from_hf(source.config)
        return config, _to_gptblock(source.state_dict(), config, layout)
    raise UserTypeError(
        f"expected a GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM or "
        f"a directory, got {type(source).__name__}"
    )


def _gpt2_config(fields: dict[str, Any], path: Path, tf: Any) -> GPTConfig:
    """A GPT-2 ``config.json``'s ``GPTConfig``, checked field by field."""
    if fields.get("model_type", "gpt2") != "gpt2":  # GPT2Config would overwrite it with its own
        raise UserValueError(
            f"{path}: field model_type={fields['model_type']!r:.40}: only GPT-2, Llama, "
            f"Mistral and Qwen2 models convert"
        )
    for field in ("vocab_size", "n_positions", "n_layer", "n_head", "n_embd"):
        value = fields.get(field)
        if field in fields and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise UserValueError(f"{path}: field {field} must be a positive int, got {value!r:.40}")
    check_fields(fields, "gpt2", f"{path}: ")
    try:
        return config_from_hf(tf.GPT2Config.from_dict(fields))
    except UserValueError as e:
        raise UserValueError(f"{path}: {e}") from None
    except (TypeError, ValueError, KeyError) as e:
        raise UserValueError(f"{path}: not a GPT-2 config ({e})") from None


def from_hf(source: Any, *, block: str = "fused") -> GPT:
    """A GPT, in eval mode, float32, on the CPU, whose logits are those of ``read_hf``'s
    ``source``; ``block``: ``"fused"`` or ``"mha"`` (GPT-2 only: the modern options need
    ``"fused"``)."""
    if block not in ("fused", "mha"):
        raise UserValueError(f"block must be 'fused' or 'mha' (GPT-2 is GELU), got {block!r}")
    config, state = read_hf(source)
    model = GPT(dataclasses.replace(config, block=block))
    model.load_state_dict(state, strict=True)
    return model.eval()


def to_hf(model: nn.Module, family: str | None = None) -> Any:
    """A ``transformers`` model computing what the GPT ``model`` computes (eval, float32).

    ``family``: ``"gpt2"``, ``"llama"``, ``"mistral"`` or ``"qwen2"``; None: Llama for Llama's
    block, else GPT-2. An option the family cannot express is refused, naming it."""
    config: GPTConfig = model.config  # type: ignore[assignment]
    refuse_inputs(config, "Hugging Face's formats (GPT-2's and Llama's embed each token alone)")
    if config.logit_softcap is not None:  # GPT-2's and Llama's heads are plain linear maps
        raise UserValueError(f"Hugging Face's formats have no logit_softcap={config.logit_softcap}")
    tf = transformers_module()
    if family is None:
        llama_block = (config.norm, config.mlp, config.position) == ("rmsnorm", "swiglu", "rope")
        family = "llama" if llama_block else "gpt2"
    if family not in FORMATS:
        raise UserValueError(f"family must be one of {FORMATS} or None, got {family!r:.40}")
    if family == "gpt2":
        hf, state = tf.GPT2LMHeadModel(config_to_hf(config)), _gpt2_state(model)
    else:
        name = llama.FAMILIES[family]
        hf_config = getattr(tf, f"{name}Config")(**llama.config_to_llama(config, family))
        state = llama.to_llama(model, family)
        hf = getattr(tf, f"{name}ForCausalLM")(hf_config).to(torch.float32)
    missing, unexpected = hf.load_state_dict(state, strict=False)
    # Only the head may be absent, where it is tied to the embedding (and so loaded with it).
    left = [k for k in missing if not (k == "lm_head.weight" and config.tie_embeddings)]
    if left or unexpected:
        raise RuntimeError(f"{family} layout mismatch: missing {left}, unexpected {unexpected}")
    return hf.eval()


def save_hf(
    model: nn.Module, directory: str | os.PathLike[str], tokenizer: Any = None, *,
    family: str | None = None,
) -> Path:  # fmt: skip
    """Write the GPT ``model`` (of ``family``, as ``to_hf``) as a new Hugging Face directory,
    with ``tokenizer`` (a run's, or a ``transformers`` one) beside it. Nothing is written for
    what the family cannot express, nor into a directory that is not empty."""
    hf = to_hf(model, family)  # first: a model the family refuses leaves no directory
    if tokenizer is not None and getattr(tokenizer, "kind", None) in ("char", "bpe"):
        tokenizer = _hf_tokenizer(tokenizer, model.config)  # type: ignore[arg-type]
    if Path(directory).is_dir() and any(Path(directory).iterdir()):
        raise UserValueError(
            f"cannot write into {directory}: it is not empty (save_hf writes a new directory, "
            f"not over another one's files)"
        )
    # save_pretrained, given a file, logs an error and writes nothing: refuse instead.
    directory = make_directory(directory)
    bars = transformers_module().utils.logging
    shown = bars.is_progress_bar_enabled()
    bars.disable_progress_bar()  # a bar for writing one small file is noise on a terminal
    try:
        hf.save_pretrained(directory, safe_serialization=True)
    finally:
        if shown:
            bars.enable_progress_bar()
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)
    return directory


def _hf_tokenizer(tokenizer: Any, config: GPTConfig) -> Any:
    """A run's tokenizer as a ``transformers`` one (``data.bpe.tokenizers_of``)."""
    if tokenizer.vocab_size > config.vocab_size:
        raise UserValueError(
            f"the tokenizer has {tokenizer.vocab_size} tokens, more than the model's "
            f"vocab_size={config.vocab_size}"
        )
    return transformers_module().PreTrainedTokenizerFast(
        tokenizer_object=tokenizers_of(tokenizer),
        clean_up_tokenization_spaces=False,  # the text decodes as it was, spaces and all
        model_max_length=config.block_size,
    )


def _to_gptblock(
    state: Mapping[str, torch.Tensor], config: GPTConfig, layout: llama.Layout | None = None
) -> dict[str, torch.Tensor]:
    if layout is not None:
        return llama.to_gptblock(state, config, layout)
    # GPT2LMHeadModel's keys start with "transformer."; a bare GPT2Model's (the original
    # openai-community checkpoints) do not.
    hf = {k.removeprefix("transformer."): v for k, v in state.items()}
    out = {f"transformer.{k}": _take(hf, k) for k in MODEL_TENSORS}
    for i in range(config.n_layer):
        for theirs, ours, transposed in BLOCK_TENSORS:
            t = _take(hf, f"h.{i}.{theirs}")
            out[f"transformer.h.{i}.{ours}"] = t.t().contiguous() if transposed else t
    head = hf.get("lm_head.weight", out["transformer.wte.weight"])  # absent when tied
    if config.tie_embeddings and not torch.equal(head, out["transformer.wte.weight"]):
        raise UserValueError("tie_word_embeddings is set but lm_head differs from wte")
    out["lm_head.weight"] = head
    return {k: v.detach().to(torch.float32) for k, v in out.items()}


def _take(state: Mapping[str, torch.Tensor], key: str) -> torch.Tensor:
    if key not in state:
        raise UserValueError(f"the GPT-2 weights have no {key!r}")
    return state[key]


def _gpt2_state(model: nn.Module) -> dict[str, torch.Tensor]:
    ours = model.state_dict()
    out = {f"transformer.{k}": ours[f"transformer.{k}"] for k in MODEL_TENSORS}
    for i, block in enumerate(model.transformer["h"]):  # type: ignore[index]
        # Any block form, described in the packed layout (the lesson's per-head q/k/v stacked).
        packed = convert(block, "fused").state_dict()
        for theirs, mine, transposed in BLOCK_TENSORS:
            t = packed[mine]
            out[f"transformer.h.{i}.{theirs}"] = t.t().contiguous() if transposed else t
    out["lm_head.weight"] = ours["lm_head.weight"]
    return {k: v.detach().to("cpu", torch.float32).clone() for k, v in out.items()}
