"""Every field a Hugging Face ``config.json`` may hold, and what gptblock does with it.

Per family, a field is **computed** (read into the ``GPTConfig``), **neutral** (accepted only
at the value that changes nothing) or **metadata** (nothing the logits depend on). Any other
field is refused by name: gptblock cannot tell what it changes.

Example:
    >>> check_fields({"model_type": "llama", "hidden_size": 8, "use_cache": True}, "llama")
    >>> check_fields({"model_type": "llama", "num_experts": 8}, "llama")
    Traceback (most recent call last):
    ...
    gptblock.errors.UserValueError: Llama config field num_experts=8: not a field gptblock knows a Llama config to have, so what it changes cannot be computed
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import UserImportError, UserValueError

__all__ = ["COMPUTED", "METADATA", "NEUTRAL", "check_fields", "transformers_module"]

INSTALL = 'pip install "gptblock[hf]"'


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


NAMES = {"gpt2": "GPT-2", "llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2"}
LLAMA = (
    "vocab_size hidden_size intermediate_size num_hidden_layers num_attention_heads "
    "num_key_value_heads max_position_embeddings head_dim hidden_act attention_dropout "
    "rms_norm_eps rope_parameters rope_scaling rope_theta partial_rotary_factor "
    "tie_word_embeddings"
)
COMPUTED: dict[str, frozenset[str]] = {
    "gpt2": _words(
        "vocab_size n_positions n_embd n_layer n_head n_inner activation_function resid_pdrop "
        "embd_pdrop attn_pdrop layer_norm_epsilon scale_attn_weights "
        "scale_attn_by_inverse_layer_idx reorder_and_upcast_attn tie_word_embeddings"
    ),
    "llama": _words(f"{LLAMA} attention_bias mlp_bias"),
    "mistral": _words(f"{LLAMA} sliding_window"),
    "qwen2": _words(f"{LLAMA} sliding_window use_sliding_window max_window_layers layer_types"),
}
# field -> (the values that change nothing, why another is refused)
NEUTRAL: dict[str, tuple[tuple[Any, ...], str]] = {
    "quantization_config": ((None,), "quantized weights are not read, only float ones"),
    "auto_map": ((None,), "a model of custom code is not run, nor guessed at"),
    "pruned_heads": ((None, {}), "gptblock's layers have every head"),
    "add_cross_attention": ((None, False), "the blocks have self-attention only"),
    "is_encoder_decoder": ((None, False), "gptblock's GPT is a decoder alone"),
    "use_mrope": ((None, False), "multimodal rotary positions are not computed"),
}
METADATA = _words(
    # PretrainedConfig's own, in transformers 4 and 5
    "model_type _name_or_path name_or_path architectures transformers_version dtype torch_dtype "
    "use_bfloat16 id2label label2id num_labels _num_labels problem_type finetuning_task "
    "tokenizer_class prefix task_specific_params chunk_size_feed_forward output_attentions "
    "output_hidden_states return_dict use_return_dict torchscript tf_legacy_loss is_decoder "
    "tie_encoder_decoder cross_attention_hidden_size _attn_implementation attn_implementation "
    "_commit_hash _attn_implementation_autoset use_cache initializer_range pretraining_tp n_ctx gradient_checkpointing "
    # token ids: what a tokenizer and generate read, not the model's forward
    "bos_token_id eos_token_id pad_token_id sep_token_id decoder_start_token_id "
    "forced_bos_token_id forced_eos_token_id "
    # generation defaults transformers 4 kept in the config
    "max_length min_length do_sample early_stopping num_beams num_beam_groups diversity_penalty "
    "temperature top_k top_p typical_p repetition_penalty length_penalty no_repeat_ngram_size "
    "encoder_no_repeat_ngram_size bad_words_ids num_return_sequences output_scores "
    "return_dict_in_generate remove_invalid_values exponential_decay_length_penalty "
    "suppress_tokens begin_suppress_tokens "
    # GPT2DoubleHeadsModel's classification head, which a causal LM does not have
    "summary_type summary_use_proj summary_activation summary_proj_to_labels "
    "summary_first_dropout"
)


def check_fields(fields: Mapping[str, Any], family: str, where: str = "") -> None:
    """Refuse, naming it after ``where``, a field of a ``family`` config that gptblock neither
    computes nor knows to change nothing."""
    for field, value in fields.items():
        if field in METADATA or field in COMPUTED[family]:
            continue
        if field in NEUTRAL:
            neutral, why = NEUTRAL[field]
            if any(value == n and type(value) is type(n) for n in neutral):
                continue
        else:
            why = (
                f"not a field gptblock knows a {NAMES[family]} config to have, so what it "
                f"changes cannot be computed"
            )
        raise UserValueError(f"{where}{NAMES[family]} config field {field}={value!r:.80}: {why}")


def transformers_module() -> Any:
    """``transformers``, or a ``UserImportError`` that says how to install it."""
    try:
        import transformers
    except ImportError:
        raise UserImportError(
            f"this needs Hugging Face transformers, an optional extra: {INSTALL}"
        ) from None
    return transformers
