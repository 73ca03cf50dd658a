"""Hugging Face's Llama, Mistral and Qwen2 and gptblock's modern GPT, weight for weight.

The three are one block (``GPTConfig(norm="rmsnorm", mlp="swiglu", position="rope",
rope_pairing="halves")``) with different biases: Llama's ``attention_bias`` and ``mlp_bias``,
none in Mistral, q/k/v only in Qwen2; a missing bias is zeros, the same function. q_proj,
k_proj and v_proj stack into ``in_proj_weight``; nothing is transposed. An ``"adjacent"`` GPT
exports with each head's q and k rows permuted to Hugging Face's halves.

What the parts do not compute is refused, naming the field, as the installed transformers reads
the fields (its defaults, ``rope_scaling`` beside ``rope_parameters``).

Shapes: C = hidden_size, F = intermediate_size, V = vocab_size, nh heads, nkv key/value heads.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch

from ..blocks.config import GPTConfig
from ..blocks.rotary import pairing_permutation
from ..errors import UserTypeError, UserValueError
from .hf_fields import check_fields, transformers_module

__all__ = ["FAMILIES", "Layout", "config_from_llama", "config_to_llama", "is_llama", "to_gptblock"]
__all__ += ["to_llama"]

# model_type -> the family's name; transformers' classes are {name}Config, {name}ForCausalLM.
FAMILIES = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2"}


def is_llama(model_type: object) -> bool:
    """Whether ``model_type`` (a config's, of any JSON type) is one of ``FAMILIES``."""
    return isinstance(model_type, str) and model_type in FAMILIES


INT = "a positive int"
REQUIRED = "vocab_size hidden_size intermediate_size num_hidden_layers num_attention_heads"
# Hugging Face's layer under layers.{i}. -> gptblock's under transformer.h.{i}.; q/k/v aside.
LAYERS = {"input_layernorm": "norm1", "post_attention_layernorm": "norm2"}
LAYERS |= {"self_attn.o_proj": "self_attn.out_proj", "mlp.gate_proj": "linear1"}
LAYERS |= {"mlp.up_proj": "linear3", "mlp.down_proj": "linear2"}
PLAIN = [(f"{theirs}.weight", f"{ours}.weight") for theirs, ours in LAYERS.items()]  # as they are
QKV = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
# The linear layers' biases: (Hugging Face's, gptblock's, which Layout flag says it exists).
BIASES = [
    (f"{theirs}.bias", f"{ours}.bias", "o_bias" if theirs.startswith("self_attn") else "mlp_bias")
    for theirs, ours in LAYERS.items() if "layernorm" not in theirs
]  # fmt: skip


class Layout(NamedTuple):
    """Which family a Llama-like checkpoint is, and which of its linear layers have biases."""

    family: str  # "llama", "mistral" or "qwen2"
    qkv_bias: bool  # q_proj, k_proj, v_proj
    o_bias: bool  # o_proj
    mlp_bias: bool  # gate_proj, up_proj, down_proj


def config_from_llama(fields: Mapping[str, Any], where: str = "") -> tuple[GPTConfig, Layout]:
    """The ``GPTConfig`` (and bias layout) of a Llama, Mistral or Qwen2 config's fields; what
    the blocks lack is refused, naming the field, after ``where`` (the file's path and ": ").

    Example:
        >>> fields = dict(model_type="llama", vocab_size=300, hidden_size=64, num_hidden_layers=2,
        ...               num_attention_heads=4, num_key_value_heads=2, intermediate_size=96)
        >>> config, layout = config_from_llama(fields)
        >>> config.n_kv_head, config.norm, config.position, config.rope_pairing, layout.o_bias
        (2, 'rmsnorm', 'rope', 'halves', False)
        >>> config_from_llama(fields | {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
        Traceback (most recent call last):
        ...
        gptblock.errors.UserValueError: Llama config field rope_scaling={'rope_type': 'yarn', 'factor': 4.0}: gptblock's rotary positions are RoFormer's, unscaled (rope_type 'default')
    """
    family = fields.get("model_type")
    if not isinstance(family, str) or family not in FAMILIES:
        raise UserValueError(
            f"{where}field model_type={family!r:.40}: expected one of {sorted(FAMILIES)}"
        )
    name = FAMILIES[family]

    def refuse(field: str, why: str) -> UserValueError:
        return UserValueError(
            f"{where}{name} config field {field}={fields.get(field)!r:.80}: {why}"
        )

    def get(field: str, kind: str, default: Any = ...) -> Any:
        """The field's value, which must be a ``kind``: "a positive int", "a number", "a bool"."""
        if field not in fields and default is ...:
            raise UserValueError(
                f"{where}field {field} is missing, and a model_type={family!r} config needs it"
            )
        value: Any = fields.get(field, default)
        if kind == "a bool":
            ok = isinstance(value, bool)
        else:  # JSON's true is no number here, nor 64.0 a count
            ok = isinstance(value, int if kind == "a positive int" else (int, float))
            ok = ok and not isinstance(value, bool) and (kind == "a number" or value >= 1)
        if not ok:
            raise refuse(field, f"expected {kind}")
        return value

    V, C, F, L, nh = (get(f, INT) for f in REQUIRED.split())
    check_fields(fields, family, where)
    for field in ("num_key_value_heads", "max_position_embeddings"):
        if fields.get(field) is not None:
            get(field, INT)
    if C % nh:
        raise refuse("hidden_size", f"not divisible by num_attention_heads={nh}")
    if fields.get("head_dim") not in (None, C // nh):
        raise refuse(
            "head_dim", f"gptblock's heads are hidden_size / num_attention_heads = {C // nh} wide"
        )
    if fields.get("hidden_act", "silu") != "silu":
        raise refuse("hidden_act", "the blocks' SwiGLU gates with SiLU ('silu')")
    if get("attention_dropout", "a number", 0.0) != 0:
        raise refuse("attention_dropout", "gptblock's dropout also drops the residual branches")
    eps = get("rms_norm_eps", "a number", 1e-6)
    if not eps > 0:  # NaN too
        raise refuse("rms_norm_eps", "expected a positive number")
    _divides(fields.get("num_key_value_heads"), nh, refuse)
    tie = get("tie_word_embeddings", "a bool", False)
    a, m = get("attention_bias", "a bool", False), get("mlp_bias", "a bool", False)
    read = _as_transformers_reads(fields, where)
    nkv: int = read.get("num_key_value_heads") or nh
    _divides(nkv, nh, refuse)  # the field's default, as transformers fills it in
    T = read["max_position_embeddings"]
    theta = _rope_theta(fields, read, refuse)
    if family == "llama":
        layout = Layout(family, a, a, m)
    else:  # Mistral's window slides in every layer; Qwen2's in those layer_types names
        types = read.get("layer_types") if family == "qwen2" else ["sliding_attention"]
        window = read.get("sliding_window")
        if types and "sliding_attention" in types and window is not None and not window >= T:
            raise refuse(
                "sliding_window" if family == "mistral" else "use_sliding_window",
                f"gptblock's attention reads the whole context (max_position_embeddings={T}); "
                f"a sliding window of {window!r:.20} is not computed",
            )
        layout = Layout(family, family == "qwen2", False, False)
    try:
        config = GPTConfig(
            vocab_size=V, block_size=T, n_layer=L, n_head=nh, n_embd=C, dropout=0.0,
            bias=layout.qkv_bias or layout.mlp_bias,
            norm_eps=float(eps),
            tie_embeddings=tie, norm="rmsnorm", mlp="swiglu", d_ff=F, n_kv_head=nkv,
            position="rope", rope_theta=theta, rope_pairing="halves",
        )  # fmt: skip
    except (UserValueError, UserTypeError) as e:
        raise UserValueError(f"{where}{e}") from None
    return config, layout


def _divides(nkv: int | None, nh: int, refuse: Any) -> None:
    if nkv is not None and nh % nkv:
        raise refuse(
            "num_key_value_heads",
            f"does not divide num_attention_heads={nh}: each key/value head serves an equal "
            f"number of query heads",
        )


def _as_transformers_reads(fields: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The fields as the family's transformers config class reads them (its defaults, merged
    rope fields, Qwen2's ``layer_types``), so that a file means here what it means there."""
    tf = transformers_module()
    name = FAMILIES[fields["model_type"]]
    verbosity = tf.logging.get_verbosity()
    tf.logging.set_verbosity_error()  # its warnings are not this refusal's one line
    try:  # a copy: transformers edits the dictionaries it is given
        return dict(getattr(tf, f"{name}Config").from_dict(copy.deepcopy(dict(fields))).to_dict())
    except Exception as e:  # transformers' own validation errors, of several types
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UserValueError(
            f"{where}not a {name} config transformers reads ({first:.200})"
        ) from None
    finally:
        tf.logging.set_verbosity(verbosity)


ROPE_KEYS = {"rope_type", "type", "rope_theta", "partial_rotary_factor"}


def _rope_theta(fields: Mapping[str, Any], read: Mapping[str, Any], refuse: Any) -> float:
    """The rope's base, as transformers reads it (``read``); a scaled or partial rope, or one
    with any other key, is refused, naming the field of ``fields`` that says so."""
    rope = read.get("rope_parameters") or read.get("rope_scaling") or {}
    given = [f for f in ("rope_scaling", "rope_parameters") if fields.get(f) is not None]
    field = given[0] if given else "rope_theta"
    if not isinstance(rope, dict):
        raise refuse(field, "expected an object (or null)")
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default" or set(rope) - ROPE_KEYS:
        raise refuse(
            field, "gptblock's rotary positions are RoFormer's, unscaled (rope_type 'default')"
        )
    partial = rope.get("partial_rotary_factor", read.get("partial_rotary_factor", 1.0))
    if partial != 1:
        top = "partial_rotary_factor" in fields
        raise refuse(
            "partial_rotary_factor" if top else field,
            "Llama-style attention rotates every channel of a head",
        )
    theta = rope.get("rope_theta", read.get("rope_theta", 10000.0))
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
        raise refuse(field if "rope_theta" in rope else "rope_theta", "expected a positive number")
    return float(theta)


def config_to_llama(config: GPTConfig, family: str) -> dict[str, Any]:
    """The keyword arguments of the ``family``'s transformers config computing what ``config``
    does; an option the family cannot express is refused, naming it."""
    name = FAMILIES[family]
    hs = config.n_embd // config.n_head
    lacks = [
        ("position", "rope", "rotary positions"), ("norm", "rmsnorm", "RMSNorm"),
        ("mlp", "swiglu", "a SwiGLU MLP"), ("qk_norm", False, "no norm on q and k"),
        ("parallel_residual", False, "sequential residual branches"),
    ]  # fmt: skip
    for option, wanted, what in lacks:
        if getattr(config, option) != wanted:
            raise UserValueError(
                f"{name}'s format cannot express {option}={getattr(config, option)!r}: it has "
                f"{what} ({option}={wanted!r})"
            )
    if config.rotary_dim not in (None, hs):
        raise UserValueError(
            f"{name}'s format cannot express rotary_dim={config.rotary_dim}: it rotates every "
            f"channel of a head (hs={hs})"
        )
    if family == "mistral" and config.bias:
        raise UserValueError("Mistral's format cannot express bias=True: it has no biases")
    kwargs: dict[str, Any] = dict(
        vocab_size=config.vocab_size, hidden_size=config.n_embd, intermediate_size=config.d_ff,
        num_hidden_layers=config.n_layer, num_attention_heads=config.n_head,
        num_key_value_heads=config.n_kv_head, max_position_embeddings=config.block_size,
        rms_norm_eps=config.norm_eps, hidden_act="silu", tie_word_embeddings=config.tie_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
        attention_dropout=0.0, bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )  # fmt: skip
    if family == "llama":
        kwargs |= {"attention_bias": config.bias, "mlp_bias": config.bias}
    elif family == "mistral":
        kwargs["sliding_window"] = None
    else:
        kwargs["use_sliding_window"] = False
    return kwargs


def to_gptblock(
    state: Mapping[str, torch.Tensor], config: GPTConfig, layout: Layout
) -> dict[str, torch.Tensor]:
    """The gptblock state_dict of a Llama-family state_dict (keys with or without ``model.``)."""
    name = FAMILIES[layout.family]
    hf = {k.removeprefix("model."): v for k, v in state.items()}

    def take(key: str) -> torch.Tensor:
        if key not in hf:
            raise UserValueError(f"the {name} weights have no {key!r}")
        return hf[key]

    def zeros(like: torch.Tensor) -> torch.Tensor:
        return torch.zeros(like.shape[0])  # a bias the family does not have: the same function

    out = {"transformer.wte.weight": take("embed_tokens.weight")}
    out["transformer.ln_f.weight"] = take("norm.weight")
    for i in range(config.n_layer):
        theirs, ours = f"layers.{i}.", f"transformer.h.{i}."
        for hf_name, name_ in PLAIN:
            out[ours + name_] = take(theirs + hf_name)
        qkv = [take(f"{theirs}{p}.weight") for p in QKV]
        out[ours + "self_attn.in_proj_weight"] = torch.cat(qkv)  # (C + 2 nkv hs, C): q; k; v
        if not config.bias:
            continue
        biases = [
            take(f"{theirs}{p}.bias") if layout.qkv_bias else zeros(w)
            for p, w in zip(QKV, qkv, strict=True)
        ]
        out[ours + "self_attn.in_proj_bias"] = torch.cat(biases)
        for hf_name, name_, flag in BIASES:
            weight = out[ours + name_.replace(".bias", ".weight")]
            out[ours + name_] = take(theirs + hf_name) if getattr(layout, flag) else zeros(weight)
    head = hf.get("lm_head.weight", out["transformer.wte.weight"])  # absent when tied
    if config.tie_embeddings and not torch.equal(head, out["transformer.wte.weight"]):
        raise UserValueError("tie_word_embeddings is set but lm_head differs from embed_tokens")
    if not config.tie_embeddings and "lm_head.weight" not in hf:
        raise UserValueError(
            f"the {name} weights have no 'lm_head.weight' (tie_word_embeddings is false)"
        )
    out["lm_head.weight"] = head
    return {k: v.detach().to(torch.float32) for k, v in out.items()}


def to_llama(model: torch.nn.Module, family: str) -> dict[str, torch.Tensor]:
    """The ``family``'s state_dict of a GPT's weights (``config_to_llama`` checked the config)."""
    config: GPTConfig = model.config  # type: ignore[assignment]
    ours = {k: v.detach().to("cpu", torch.float32) for k, v in model.state_dict().items()}
    C, nh, nkv = config.n_embd, config.n_head, config.n_kv_head
    hs = C // nh
    # Hugging Face rotates halves: an adjacent-pairing GPT's q/k rows are reordered per head.
    perm = pairing_permutation(hs) if config.rope_pairing == "adjacent" else None

    def heads(t: torch.Tensor, n: int) -> torch.Tensor:
        if perm is None:
            return t
        return t.view(n, hs, *t.shape[1:])[:, perm].reshape(t.shape)  # (n, hs, ...) -> (n hs, ...)

    out = {"model.embed_tokens.weight": ours["transformer.wte.weight"]}
    out["model.norm.weight"] = ours["transformer.ln_f.weight"]
    for i in range(config.n_layer):
        theirs, mine = f"model.layers.{i}.", f"transformer.h.{i}."
        for hf_name, name in PLAIN:
            out[theirs + hf_name] = ours[mine + name]
        sizes = [C, nkv * hs, nkv * hs]
        for suffix in ("weight", "bias"):
            packed = ours.get(f"{mine}self_attn.in_proj_{suffix}")
            if packed is None:
                continue
            q, k, v = torch.split(packed, sizes)  # rows: q (C), k (nkv hs), v (nkv hs)
            for p, t in zip(QKV, (heads(q, nh), heads(k, nkv), v), strict=True):
                out[f"{theirs}{p}.{suffix}"] = t
        for hf_name, name, _ in BIASES:
            if mine + name in ours:
                out[theirs + hf_name] = ours[mine + name]
    if family == "qwen2":
        _qwen2_biases(out, config)
    out["lm_head.weight"] = ours["lm_head.weight"]
    return {k: v.clone() for k, v in out.items()}


def _qwen2_biases(out: dict[str, torch.Tensor], config: GPTConfig) -> None:
    """Qwen2's biases in ``out``: q/k/v's (zeros without ``bias``), none elsewhere, where a GPT
    with ``bias`` must then have zeros."""
    for i in range(config.n_layer):
        theirs = f"model.layers.{i}."
        for hf_name, _, _ in BIASES:
            b = out.pop(theirs + hf_name, None)
            if b is not None and bool(b.any()):
                raise UserValueError(
                    f"Qwen2's format cannot express this GPT's bias on {hf_name.removesuffix('.bias')} "
                    f"(layer {i}): Qwen2 has biases on q, k and v only"
                )
        for p in QKV:
            rows = out[f"{theirs}{p}.weight"].shape[0]
            out.setdefault(f"{theirs}{p}.bias", torch.zeros(rows))
