"""The block's forward pass in float64 NumPy, and the softmax and causal head it is built from.

``block_forward`` returns, with its output, a ``BlockCache`` of the intermediates that
``block_backward`` (in ``backward.py``) needs.

Shapes: B batch, T time, C channels, nh heads, hs = C // nh head size, F = MLP hidden width.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .layout import IN_PROJ, LINEAR1, LINEAR2, NORM1, NORM2, OUT_PROJ, PARAM_KEYS
from .pieces import ACTIVATIONS, Array, affine, linear, normalise


def softmax(z: Any, axis: int = -1, blocked: Any = None) -> Array:
    """Numerically stable softmax; blocked entries get weight exactly 0.

    The row maximum is subtracted before ``exp`` so huge scores cannot overflow. A row in which
    every entry is blocked has no distribution to normalise: it comes back as all zeros (what
    gptblock's torch blocks give), not NaN.

    Args:
        z: scores.
        axis: the axis to normalise over.
        blocked: optional bool array broadcastable to ``z``; ``True`` = weight forced to 0.

    Example:
        >>> softmax([[1.0, 1.0], [0.0, 1000.0]]).round(6).tolist()
        [[0.5, 0.5], [0.0, 1.0]]
        >>> softmax([[1.0, 2.0], [3.0, 4.0]], blocked=[[False, True], [True, True]]).tolist()
        [[1.0, 0.0], [0.0, 0.0]]
    """
    z = np.asarray(z, dtype=np.float64)
    if blocked is not None:
        z = np.where(blocked, -np.inf, z)
    m = z.max(axis=axis, keepdims=True)
    # A fully blocked row has max -inf, and -inf - -inf is NaN; shifting it by 0 instead keeps
    # every exp(-inf) an exact 0.
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(over="ignore"):  # z - m < -1.8e308 rounds to -inf, and exp(-inf) = 0: right
        e = np.exp(z - m)
    s = e.sum(axis=axis, keepdims=True)
    return np.asarray(e / np.where(s > 0, s, 1.0))


def causal_head(q: Any, k: Any, v: Any) -> tuple[Array, Array]:
    """One causal attention head on given queries, keys and values (lesson 1, exercise 2).

    Position t attends to positions <= t, with scores scaled by ``1 / sqrt(hs)``.

    Args:
        q, k, v: queries, keys and values; leading batch dimensions are allowed.

    Shape:
        q, k, v: (..., T, hs). Returns ``out`` (..., T, hs) and the weights ``wei`` (..., T, T),
        each row a distribution, exactly 0 above the diagonal.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> q, k, v = rng.standard_normal((3, 5, 4))
        >>> out, wei = causal_head(q, k, v)
        >>> out.shape, bool(np.allclose(wei.sum(-1), 1)), bool((np.triu(wei, 1) == 0).all())
        ((5, 4), True, True)
    """
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    T, hs = q.shape[-2:]
    wei = q @ k.swapaxes(-1, -2) / math.sqrt(hs)  # (..., T, hs) @ (..., hs, T) -> (..., T, T)
    future = np.triu(np.ones((T, T), dtype=bool), k=1)  # (T, T), True above the diagonal
    wei = softmax(wei, blocked=future)
    return wei @ v, wei  # (..., T, T) @ (..., T, hs) -> (..., T, hs)


@dataclass(frozen=True)
class BlockCache:
    """Everything ``block_backward`` needs from ``block_forward``: inputs and intermediates."""

    params: dict[str, Array]  # float64 copies of the parameters used
    n_head: int  # nh
    activation: str  # "gelu", "relu" or "gelu_tanh"
    x: Array  # (B, T, C) the input
    xhat1: Array  # (B, T, C) x normalised, before norm1's affine
    rstd1: Array  # (B, T, 1) 1 / sqrt(var + eps) of x
    h1: Array  # (B, T, C) norm1(x)
    q: Array  # (B, nh, T, hs)
    k: Array  # (B, nh, T, hs)
    v: Array  # (B, nh, T, hs)
    wei: Array  # (B, nh, T, T) attention weights; 0 where blocked, all 0 on fully blocked rows
    ctx: Array  # (B, T, C) the heads' outputs, concatenated
    xhat2: Array  # (B, T, C) x1 normalised, before norm2's affine
    rstd2: Array  # (B, T, 1)
    h2: Array  # (B, T, C) norm2(x1)
    u: Array  # (B, T, F) linear1's output, before the activation
    g: Array  # (B, T, F) act(u)


def block_forward(
    params: Mapping[str, Any],
    x: Any,
    n_head: int,
    *,
    activation: str = "gelu",
    eps: float = 1e-5,
    mask: Any = None,
) -> tuple[Array, BlockCache]:
    """The pre-norm block's forward pass, in float64 NumPy.

    Args:
        params: arrays named as ``TransformerBlock``'s state_dict (see ``PARAM_KEYS``); bias keys
            may be absent (zero). ``params_from_state_dict`` builds this from any block form.
        x: the input.
        n_head: nh, the number of heads; must divide C.
        activation: ``"gelu"`` (exact, erf-based, as ``F.gelu``), ``"relu"`` or ``"gelu_tanh"``
            (the tanh approximation, GPT-2's).
        eps: both LayerNorms' epsilon.
        mask: optional bool (T, T) or (B, T, T), ``True`` = blocked, combined with the causal
            mask. A query row with nothing left to attend to gets zero attention weights.

    Shape:
        x: (B, T, C). Returns ``y`` (B, T, C) and the cache for ``block_backward``.

    Example:
        A query row that may attend to nothing gets zero weights in every head (the package's
        overview, ``gptblock.reference``, runs a forward with its backward):

        >>> rng = np.random.default_rng(0)
        >>> C, F = 4, 16
        >>> shapes = {"norm1.weight": (C,), "self_attn.in_proj_weight": (3 * C, C),
        ...           "self_attn.out_proj.weight": (C, C), "norm2.weight": (C,),
        ...           "linear1.weight": (F, C), "linear2.weight": (C, F)}
        >>> params = {key: rng.standard_normal(shape) for key, shape in shapes.items()}
        >>> mask = np.zeros((3, 3), dtype=bool)
        >>> mask[1] = True  # query row 1 is blocked from every key
        >>> y, cache = block_forward(params, rng.standard_normal((1, 3, C)), n_head=2, mask=mask)
        >>> y.shape, cache.wei[0, :, 1].tolist()
        ((1, 3, 4), [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 3 or 0 in x.shape:
        raise ValueError(f"x must be a non-empty (B, T, C) array, got shape {x.shape}")
    B, T, C = x.shape
    p = _check_params(params, C, n_head)
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {tuple(ACTIVATIONS)}, got {activation!r}")
    # eps <= 0 divides a constant row by sqrt(0) (or of a negative): NaN, not an error, in NumPy.
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not 0 < eps < math.inf:
        raise ValueError(f"eps must be a finite float > 0, got {eps!r}")
    nh, hs = n_head, C // n_head
    blocked = _blocked(mask, B, T)  # (B or 1, 1, T, T)

    xhat1, rstd1 = normalise(x, eps)
    h1 = affine(xhat1, p, NORM1)  # (B, T, C)
    qkv = linear(h1, p, IN_PROJ)  # (B, T, C) @ (C, 3C) -> (B, T, 3C), packed q;k;v
    # (B, T, 3C) -> (B, T, 3, nh, hs) -> (3, B, nh, T, hs): head i owns channels i*hs:(i+1)*hs
    q, k, v = qkv.reshape(B, T, 3, nh, hs).transpose(2, 0, 3, 1, 4)
    att = q @ k.swapaxes(-1, -2) / math.sqrt(hs)  # (B, nh, T, hs) @ (B, nh, hs, T) -> (B, nh, T, T)
    wei = softmax(att, blocked=blocked)  # (B, nh, T, T)
    ctx = (wei @ v).transpose(0, 2, 1, 3).reshape(B, T, C)  # (B, nh, T, hs) -> (B, T, C)
    x1 = x + linear(ctx, p, OUT_PROJ)  # (B, T, C)

    xhat2, rstd2 = normalise(x1, eps)
    h2 = affine(xhat2, p, NORM2)  # (B, T, C)
    u = linear(h2, p, LINEAR1)  # (B, T, C) @ (C, F) -> (B, T, F)
    g = ACTIVATIONS[activation][0](u)
    y = x1 + linear(g, p, LINEAR2)  # (B, T, F) @ (F, C) -> (B, T, C)

    cache = BlockCache(
        p, nh, activation, x, xhat1, rstd1, h1, q, k, v, wei, ctx, xhat2, rstd2, h2, u, g
    )
    return y, cache


# --- inputs -------------------------------------------------------------------------------


def _check_params(params: Mapping[str, Any], C: int, n_head: int) -> dict[str, Array]:
    if isinstance(n_head, bool) or not isinstance(n_head, int) or n_head < 1 or C % n_head:
        raise ValueError(f"n_head must be a positive int dividing C={C}, got {n_head!r}")
    unknown = sorted(set(params) - set(PARAM_KEYS))
    if unknown:
        raise ValueError(f"unexpected parameter names {unknown}; expected names from {PARAM_KEYS}")
    p = {key: np.asarray(params[key], dtype=np.float64) for key in PARAM_KEYS if key in params}
    F = p[LINEAR1[0]].shape[0] if LINEAR1[0] in p else 4 * C
    expected = {
        NORM1[0]: (C,), NORM1[1]: (C,), NORM2[0]: (C,), NORM2[1]: (C,),
        IN_PROJ[0]: (3 * C, C), IN_PROJ[1]: (3 * C,),
        OUT_PROJ[0]: (C, C), OUT_PROJ[1]: (C,),
        LINEAR1[0]: (F, C), LINEAR1[1]: (F,),
        LINEAR2[0]: (C, F), LINEAR2[1]: (C,),
    }  # fmt: skip
    for key, shape in expected.items():
        if key in p and p[key].shape != shape:
            raise ValueError(f"{key} must have shape {shape} for C={C}, got {p[key].shape}")
        if key not in p and key.endswith("weight"):
            raise ValueError(f"params has no {key!r} (expected shape {shape})")
    return p


def _blocked(mask: Any, B: int, T: int) -> NDArray[np.bool_]:
    """The causal mask OR-ed with ``mask``: (B or 1, 1, T, T), True = blocked."""
    blocked = np.triu(np.ones((T, T), dtype=bool), k=1)  # (T, T)
    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype != np.bool_:
            raise TypeError(f"mask must be a bool array (True = blocked), got dtype {mask.dtype}")
        if mask.shape not in ((T, T), (B, T, T)):
            raise ValueError(
                f"mask must have shape (T, T) = ({T}, {T}) or (B, T, T) = ({B}, {T}, {T}), "
                f"got {mask.shape}"
            )
        blocked = blocked | mask  # (T, T) or (B, T, T)
    return blocked.reshape(-1, 1, T, T)  # broadcast over the nh heads
