"""The block's backward pass, derived by hand: no autograd, no finite differences.

It walks ``block_forward`` (in ``forward.py``) from the output back to the input, one line per
forward line, reading the intermediates from the ``BlockCache``.

Shapes: B batch, T time, C channels, nh heads, hs = C // nh head size, F = MLP hidden width.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .forward import BlockCache
from .layout import IN_PROJ, LINEAR1, LINEAR2, NORM1, NORM2, OUT_PROJ
from .pieces import ACTIVATIONS, Array, affine_normalise_backward, linear_backward


def block_backward(dy: Any, cache: BlockCache) -> tuple[Array, dict[str, Array]]:
    """The block's backward pass, derived by hand: no autograd, no finite differences.

    Args:
        dy: the gradient of a scalar loss with respect to ``y``.
        cache: what ``block_forward`` returned with ``y``.

    Shape:
        dy: (B, T, C). Returns ``dx`` (B, T, C) and ``grads``, one array per key of the
        forward's ``params``, each the shape of its parameter.

    Example:
        See ``gptblock.reference``: the package's overview runs the forward and this backward.
    """
    p, c = cache.params, cache
    dy = np.asarray(dy, dtype=np.float64)
    if dy.shape != c.x.shape:
        raise ValueError(f"dy must have the shape of y, {c.x.shape}, got {dy.shape}")
    B, T, C = c.x.shape
    nh, hs = c.n_head, C // c.n_head
    grads: dict[str, Array] = {}

    # y = x1 + linear2(act(linear1(norm2(x1)))): the residual passes dy to x1 unchanged.
    dg = linear_backward(dy, c.g, p, LINEAR2, grads)  # (B, T, F)
    # ReLU's gradient at exactly 0 is taken as 0, as torch does.
    du = dg * ACTIVATIONS[c.activation][1](c.u)  # (B, T, F)
    dh2 = linear_backward(du, c.h2, p, LINEAR1, grads)  # (B, T, C)
    dx1 = dy + affine_normalise_backward(dh2, c.xhat2, c.rstd2, p, NORM2, grads)

    # x1 = x + out_proj(ctx)
    dctx = linear_backward(dx1, c.ctx, p, OUT_PROJ, grads)  # (B, T, C)
    dctx = dctx.reshape(B, T, nh, hs).transpose(0, 2, 1, 3)  # (B, T, C) -> (B, nh, T, hs)
    dwei = dctx @ c.v.swapaxes(-1, -2)  # (B, nh, T, hs) @ (B, nh, hs, T) -> (B, nh, T, T)
    dv = c.wei.swapaxes(-1, -2) @ dctx  # (B, nh, T, T) @ (B, nh, T, hs) -> (B, nh, T, hs)
    # Softmax: d att_j = w_j (d w_j - sum_i w_i d w_i). Blocked entries and fully blocked rows
    # have w = 0, so no gradient reaches their scores -- the masks need no special case here.
    datt = c.wei * (dwei - (dwei * c.wei).sum(axis=-1, keepdims=True))  # (B, nh, T, T)
    datt = datt / math.sqrt(hs)
    dq = datt @ c.k  # (B, nh, T, T) @ (B, nh, T, hs) -> (B, nh, T, hs)
    dk = datt.swapaxes(-1, -2) @ c.q  # (B, nh, T, T) @ (B, nh, T, hs) -> (B, nh, T, hs)
    # (3, B, nh, T, hs) -> (B, T, 3, nh, hs) -> (B, T, 3C): the forward's split, undone
    dqkv = np.stack([dq, dk, dv]).transpose(1, 3, 0, 2, 4).reshape(B, T, 3 * C)
    dh1 = linear_backward(dqkv, c.h1, p, IN_PROJ, grads)  # (B, T, C)
    dx = dx1 + affine_normalise_backward(dh1, c.xhat1, c.rstd1, p, NORM1, grads)
    return dx, {key: grads[key] for key in p}
