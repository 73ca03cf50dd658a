"""The block's parameter names: the packed layout every form but the lesson's uses, and the lesson's.

*Packed* is ``TransformerBlock``'s layout (and ``FusedBlock``'s and ``nn.TransformerEncoderLayer``'s):
q, k and v of every head in one (3C, C) ``self_attn.in_proj_weight``, the q rows of heads 0..nh-1
first, then the k rows, then the v rows. The lesson's ``Block`` keeps one bias-free ``Linear`` per
head and per q/k/v (``sa.heads.{i}.query.weight``, (hs, C)); stacking them in ``lesson_qkv_keys``
order gives the packed weight. Plain Python (no NumPy): the oracle, ``convert`` and the model
share it.
"""

from __future__ import annotations

from collections.abc import Container

# (weight, bias) keys of each of the block's parameterised modules, in the packed layout.
NORM1 = ("norm1.weight", "norm1.bias")
IN_PROJ = ("self_attn.in_proj_weight", "self_attn.in_proj_bias")  # q, k, v packed: (3C, C), (3C,)
OUT_PROJ = ("self_attn.out_proj.weight", "self_attn.out_proj.bias")
NORM2 = ("norm2.weight", "norm2.bias")
LINEAR1 = ("linear1.weight", "linear1.bias")
LINEAR2 = ("linear2.weight", "linear2.bias")
# Every key, in state_dict order.
PARAM_KEYS = tuple(
    key for pair in (NORM1, IN_PROJ, OUT_PROJ, NORM2, LINEAR1, LINEAR2) for key in pair
)

# The lesson's name for each module other than the q/k/v -> the packed layout's; each has a
# ``.weight`` and a ``.bias`` in both.
LESSON_RENAMES = {
    "ln1": "norm1",
    "sa.proj": "self_attn.out_proj",
    "ln2": "norm2",
    "ffwd.net.0": "linear1",
    "ffwd.net.2": "linear2",
}
LESSON_QKV = ("query", "key", "value")  # the per-head Linears, in the packed order of thirds
LESSON_TRIL = "tril"  # each head's causal-mask buffer: in the state_dict, but not a parameter


def lesson_head(i: int) -> str:
    """The prefix of head ``i``'s keys in the lesson's ``Block``.

    Example:
        >>> lesson_head(1) + "query.weight", lesson_head(1) + LESSON_TRIL
        ('sa.heads.1.query.weight', 'sa.heads.1.tril')
    """
    return f"sa.heads.{i}."


LESSON_ANCHOR = lesson_head(0) + "query.weight"  # a key only the lesson's layout has


def lesson_qkv_keys(n_head: int, kind: str = "weight") -> list[str]:
    """The lesson's per-head q/k/v keys (``kind``: weight or bias) in packed order: q of heads
    0..nh-1, then k, then v. Row block ``j`` of 3 * nh of the packed weight is key ``j``'s.

    Example:
        >>> lesson_qkv_keys(2)  # doctest: +NORMALIZE_WHITESPACE
        ['sa.heads.0.query.weight', 'sa.heads.1.query.weight', 'sa.heads.0.key.weight',
         'sa.heads.1.key.weight', 'sa.heads.0.value.weight', 'sa.heads.1.value.weight']
    """
    return [f"{lesson_head(i)}{name}.{kind}" for name in LESSON_QKV for i in range(n_head)]


def lesson_head_count(keys: Container[str], prefix: str = "") -> int:
    """How many heads a lesson state_dict's ``keys`` (under ``prefix``, e.g. ``"blocks.0."``)
    have: heads 0, 1, ... that have a query weight.

    Example:
        >>> lesson_head_count({"sa.heads.0.query.weight", "sa.heads.1.query.weight"})
        2
        >>> lesson_head_count({"ln1.weight"})
        0
    """
    n = 0
    while f"{prefix}{lesson_head(n)}query.weight" in keys:
        n += 1
    return n
