"""The names people give the parts of a transformer block, by role.

Collected from the sources learners copy: the lessons (``query``, ``proj``, ``ffwd``, ``ln1``),
nanoGPT / minGPT / GPT-2 (``c_attn``, ``c_proj``, ``c_fc``, ``ln_1``), PyTorch
(``self_attn``, ``in_proj_weight``, ``out_proj``, ``linear1``, ``norm1``), the Annotated
Transformer (``linears``, ``w_1``, ``sublayer``), Llama-style code (``q_proj``, ``o_proj``,
``wq``, ``wo``, ``w1``, ``attention_norm``, ``ffn_norm``, ``feed_forward``), BERT / GPT-NeoX
(``query_key_value``, ``dense``, ``dense_h_to_4h``, ``input_layernorm``) and einops-style code
(``to_qkv``, ``to_out``). A name only ever adds evidence for a role: shapes, the order of
registration and the forward pass decide together with it (``gptblock.check.roles.mapping``).
"""

from __future__ import annotations

__all__ = ["ATTENTION", "LN1", "LN2", "MLP", "ROLE_NAMES", "norm_hint", "role_hint", "scope_hint"]


def _variants(*stems: str) -> set[str]:
    """Each stem as written and with the usual prefixes and suffixes: q, wq, w_q, to_q, q_proj..."""
    forms = "{} w{} w_{} to_{} {}_proj {}_lin {}_linear linear_{} proj_{} {}_net {}w {}_w"
    return {form.format(s) for s in stems for form in forms.split()}


def _words(text: str) -> set[str]:
    return set(text.split())


ROLE_NAMES: dict[str, set[str]] = {
    "q": _variants("q", "query", "queries"),
    "k": _variants("k", "key", "keys"),
    "v": _variants("v", "value", "values"),
    "qkv": _variants("qkv", "c_attn", "in_proj", "query_key_value", "pack")
    | _words("in_proj_weight c_qkv qkv_layer attn_in"),
    "proj": _words(
        "proj out_proj c_proj o_proj wo w_o out to_out dense o output proj_out out_lin "
        "linear_out o_linear attn_out resid_proj projection out_linear o_lin"
    ),
    "fc1": _words(
        "fc1 c_fc linear1 w1 w_1 fc up up_proj dense_h_to_4h lin1 ff1 fc_in w_in expand "
        "linear_1 layer1 l1 fc_1 in_layer hidden"
    ),
    "fc2": _words(
        "fc2 c_proj linear2 w2 w_2 down down_proj dense_4h_to_h lin2 ff2 fc_out w_out contract "
        "linear_2 layer2 l2 fc_2 out_layer proj out dense output"
    ),
}
"""Role -> the module or parameter names that suggest it (lower case, the nearest component of
the name that is not an index). Some names suggest two roles (``c_proj`` is the attention's
output projection under ``attn`` and the MLP's second layer under ``mlp``); the scope decides."""

ATTENTION = _words(
    "attn attention sa self_attn self_attention mha multihead multi_head multihead_attn heads "
    "sa_heads msa att attn_block causal_attn mhsa self_attn_layer attention_block"
)
MLP = _words(
    "mlp ffwd ff ffn net feed_forward feedforward ffd mlp_block mlpf positionwise pwff pff ffnet "
    "ffn_block fwd intermediate feedforward_block ff_block"
)
LN1 = _words(
    "ln1 ln_1 norm1 norm_1 attention_norm attn_norm input_layernorm ln_attn norm_attn "
    "pre_attn_norm attn_ln ln_a norm_a layernorm1 layer_norm1 layer_norm_1 sa_norm norm_sa ln_sa "
    "lna attn_layernorm self_attn_layer_norm pre_norm1"
)
LN2 = _words(
    "ln2 ln_2 norm2 norm_2 ffn_norm ff_norm mlp_norm ln_mlp post_attention_layernorm norm_mlp "
    "norm_ff pre_mlp_norm ln_b norm_b layernorm2 layer_norm2 layer_norm_2 ffwd_norm mlp_ln ln_ff "
    "lnb ffn_layernorm final_layer_norm mlp_layernorm pre_norm2"
)


def role_hint(own_name: str) -> set[str]:
    """The roles a part's own name suggests (empty: the name says nothing).

    Example:
        >>> sorted(role_hint("c_proj")), sorted(role_hint("query")), role_hint("net")
        (['fc2', 'proj'], ['q'], set())
    """
    return {role for role, names in ROLE_NAMES.items() if own_name in names}


def scope_hint(path: tuple[str, ...]) -> str | None:
    """``"attn"`` or ``"mlp"`` from the nearest enclosing module whose name says which, if any.

    Example:
        >>> scope_hint(("ffwd", "net", "0")), scope_hint(("attn", "c_proj")), scope_hint(("l1",))
        ('mlp', 'attn', None)
    """
    for component in reversed(path[:-1]):
        word = component.lower()
        if word in ATTENTION:
            return "attn"
        if word in MLP:
            return "mlp"
    return None


def norm_hint(path: tuple[str, ...]) -> int | None:
    """1 or 2 when a norm's name says which branch it belongs to.

    Example:
        >>> norm_hint(("ln_1",)), norm_hint(("post_attention_layernorm",)), norm_hint(("ln",))
        (1, 2, None)
    """
    for component in reversed(path):
        word = component.lower()
        if word in LN1:
            return 1
        if word in LN2:
            return 2
    return None
