"""How the zoo injects each mistake: the few lines a learner gets wrong, shared by the styles.

Every style in this package writes its block the way its source does, and asks these helpers
only at the points where a mistake changes a line. A bug is a catalogue id, optionally with
``:how`` when there are several ways to make it (``wrong_scale:1/hs``); the diagnosis expected
for a bug is the id before the colon.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from torch.nn import functional as F

SCALE_BUGS = ("no_scaling", "wrong_scale", "wrong_scale:1/hs", "wrong_scale:sqrt")
MASK_BUGS = ("future_leak", "mask_reversed", "mask_zero", "mask_after_softmax")
WIRING_BUGS = (
    "post_norm",
    "no_residual:attn",
    "no_residual:mlp",
    "no_residual:both",
    "no_residual:normed",
    "shared_norm",
    "inplace",
)
MANUAL_BUGS = (*SCALE_BUGS, *MASK_BUGS, "softmax_dim")  # a naive softmax overflows only post-norm
HEAD_BUGS = ("heads_mixed:split", "heads_mixed:merge", "heads_mixed:order")


def expected(bugs):
    """The catalogue ids a set of bugs should be diagnosed as."""
    return {b.split(":")[0] for b in bugs}


def scale(bugs, correct, hs, C):
    """The factor on the scores: the style's own correct expression unless a scale bug is on."""
    if "no_scaling" in bugs:
        return 1.0
    if "wrong_scale" in bugs:
        return C**-0.5  # the lecture's bug: C is n_embd, not the head size
    if "wrong_scale:1/hs" in bugs:
        return 1.0 / hs
    if "wrong_scale:sqrt" in bugs:
        return hs**0.5
    return correct


def softmax_masked(att, allowed, bugs, fill=float("-inf")):
    """Mask then softmax, as a manual attention does; ``allowed`` is True where j <= i."""
    if "future_leak" in bugs:
        allowed = torch.ones_like(allowed)
    if "mask_reversed" in bugs:
        allowed = ~allowed  # masked_fill(tril == 1, ...): blocks the past, keeps the future
    dim = -2 if "softmax_dim" in bugs else -1
    if "mask_after_softmax" in bugs:
        return F.softmax(att, dim=dim).masked_fill(~allowed, 0.0)
    if "mask_zero" in bugs:
        fill = 0.0
    att = att.masked_fill(~allowed, fill)
    if "nonfinite:softmax" in bugs:
        e = att.exp()  # no max subtracted: overflows for large scores
        return e / e.sum(dim=dim, keepdim=True)
    return F.softmax(att, dim=dim)


def split_heads(t, n_head, bugs):
    """(B, T, C) -> (B, nh, T, hs), the nanoGPT way, or without the transpose."""
    B, T, C = t.shape
    if "heads_mixed:split" in bugs:
        return t.reshape(B, n_head, T, C // n_head)
    return t.view(B, T, n_head, C // n_head).transpose(1, 2)


def merge_heads(y, bugs):
    """(B, nh, T, hs) -> (B, T, C), or without the transpose, or in the wrong order."""
    B, nh, T, hs = y.shape
    if "heads_mixed:merge" in bugs:
        return y.reshape(B, T, nh * hs)
    if "heads_mixed:order" in bugs:
        return y.permute(0, 2, 3, 1).reshape(B, T, nh * hs)
    return y.transpose(1, 2).contiguous().view(B, T, nh * hs)


def residual(x, attn, mlp, ln1, ln2, bugs):
    """The block's wiring: pre-norm residuals, or the wiring bug that is on."""
    if "shared_norm" in bugs:
        ln2 = ln1
    if "post_norm" in bugs:
        x = ln1(x + attn(x))
        return ln2(x + mlp(x))
    if "no_residual:attn" in bugs:
        x = attn(ln1(x))
        return x + mlp(ln2(x))
    if "no_residual:mlp" in bugs:
        x = x + attn(ln1(x))
        return mlp(ln2(x))
    if "no_residual:both" in bugs:
        return mlp(ln2(attn(ln1(x))))
    if "no_residual:normed" in bugs:
        x = ln1(x)
        x = x + attn(x)
        x = ln2(x)
        return x + mlp(x)
    if "inplace" in bugs:
        x += attn(ln1(x))
        x += mlp(ln2(x))
        return x
    x = x + attn(ln1(x))
    return x + mlp(ln2(x))


def finish(y, bugs):
    """The block's return value, or the contract bug that is on."""
    if "shape" in bugs:
        return y[:, -1]  # only the last position
    if "dtype_device" in bugs:
        return y.float() if y.dtype != torch.float32 else y.double()
    return y


def dropout(t, p, training, bugs):
    """A dropout the style applies with F.dropout: on in eval mode when the bug is on."""
    return F.dropout(t, p, training=True if "dropout_in_eval" in bugs else training)


@dataclass(frozen=True)
class Style:
    """One way people write the block: a factory taking ``bugs=``, the bugs it can have.

    Args:
        name: short id, used in test ids.
        source: the source whose style it follows.
        factory: builds the block: ``factory(**kwargs, bugs=frozenset(...))``.
        kwargs: its constructor arguments.
        bugs: the single bugs injected, one block each.
        pairs: pairs (or triples) of bugs injected together.
    """

    name: str
    source: str
    factory: Callable[..., nn.Module]
    kwargs: dict = field(default_factory=dict)
    bugs: tuple[str, ...] = ()
    pairs: tuple[tuple[str, ...], ...] = ()
