"""The lessons' block's forward and backward passes in float64 NumPy, and the causal head.

The lessons' pre-norm block is the modern block (``modern``) with its default options:
``block_forward`` checks its arguments and runs ``modern_forward``, whose cache
``block_backward`` (``modern_backward``) walks back. One forward pass, with options, computes
every block the oracle knows.

Shapes: B batch, T time, C channels, nh heads, hs = C // nh head size, F = MLP hidden width.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np

from .layout import IN_PROJ, LINEAR1, LINEAR2, NORM1, NORM2, OUT_PROJ, PARAM_KEYS
from .modern import ModernCache, ModernOptions, modern_backward, modern_forward
from .pieces import ACTIVATIONS, Array, softmax

__all__ = ["BlockCache", "block_backward", "block_forward", "causal_head", "softmax"]

BlockCache = ModernCache  # what ``block_backward`` needs of ``block_forward``


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


def block_forward(
    params: Mapping[str, Any],
    x: Any,
    n_head: int,
    *,
    activation: str = "gelu",
    eps: float = 1e-5,
    mask: Any = None,
) -> tuple[Array, ModernCache]:
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
    p = _check_params(params, x.shape[-1], n_head)
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {tuple(ACTIVATIONS)}, got {activation!r}")
    # eps <= 0 divides a constant row by sqrt(0) (or of a negative): NaN, not an error, in NumPy.
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not 0 < eps < math.inf:
        raise ValueError(f"eps must be a finite float > 0, got {eps!r}")
    options = ModernOptions(n_head, activation=activation, norm_eps=float(eps))
    return modern_forward(p, x, options, mask=mask)


def block_backward(dy: Any, cache: ModernCache) -> tuple[Array, dict[str, Array]]:
    """The block's backward pass, derived by hand: no autograd, no finite differences
    (``modern_backward``, each backward line undoing one forward line).

    Args:
        dy: the gradient of a scalar loss with respect to ``y``.
        cache: what ``block_forward`` returned with ``y``.

    Shape:
        dy: (B, T, C). Returns ``dx`` (B, T, C) and ``grads``, one array per key of the
        forward's ``params``, each the shape of its parameter.

    Example:
        See ``gptblock.reference``: the package's overview runs the forward and this backward.
    """
    dy = np.asarray(dy, dtype=np.float64)
    if dy.shape != cache.x.shape:
        raise ValueError(f"dy must have the shape of y, {cache.x.shape}, got {dy.shape}")
    return modern_backward(dy, cache)


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
