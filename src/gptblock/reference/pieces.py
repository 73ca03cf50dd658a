"""The block's pieces in float64 NumPy, each forward beside its hand-derived backward.

A backward takes the gradient of the piece's output and returns its input's, storing the
parameters' gradients in ``grads`` under their keys (a module's ``(weight, bias)`` pair).

Shapes: B batch, T time, C channels, F = MLP hidden width; ``in``/``out`` a layer's widths.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

Array = NDArray[np.float64]

Keys = tuple[str, str]  # (weight, bias)


def normalise(x: Array, eps: float, centred: bool = True) -> tuple[Array, Array]:
    """(xhat, rstd) over the last axis: LayerNorm's ``(x - mean) / sqrt(var + eps)`` (biased
    variance, as nn.LayerNorm) or, not ``centred``, RMSNorm's ``x / sqrt(mean(x^2) + eps)``."""
    if centred:
        x = x - x.mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)  # (..., 1)
    return x * rstd, rstd


def affine(xhat: Array, p: dict[str, Array], keys: Keys) -> Array:
    return xhat * p[keys[0]] + p.get(keys[1], 0.0)


def norm_backward(
    dh: Array,
    n: tuple[Array, Array],
    p: dict[str, Array],
    keys: Keys,
    grads: dict[str, Array],
    centred: bool = True,
) -> Array:
    """Backward of ``h = affine(xhat)``, ``(xhat, rstd) = n = normalise(x)``; returns dx.

    With m(.) the mean over the last axis, RMSNorm's ``dx = rstd (dxhat - xhat m(dxhat xhat))``
    (dr/dx_j = -r^3 x_j / C); LayerNorm's, through its mean too, also subtracts ``m(dxhat)``.
    """
    (xhat, rstd), (weight, bias) = n, keys
    C = xhat.shape[-1]
    grads[weight] = (dh * xhat).reshape(-1, C).sum(axis=0)
    if bias in p:
        grads[bias] = dh.reshape(-1, C).sum(axis=0)
    dxhat = dh * p[weight]
    dx = dxhat - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True)
    return rstd * (dx - dxhat.mean(axis=-1, keepdims=True) if centred else dx)


def softmax(z: Any, axis: int = -1, blocked: Any = None) -> Array:
    """Numerically stable softmax; ``blocked`` entries (a bool array broadcastable to ``z``) get
    weight exactly 0, and a row with every entry blocked is all zeros (as gptblock's torch
    blocks give), not NaN.

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


def linear(a: Array, p: dict[str, Array], keys: Keys) -> Array:
    return a @ p[keys[0]].T + p.get(keys[1], 0.0)  # (B, T, in) @ (in, out) -> (B, T, out)


def linear_backward(
    dout: Array, a: Array, p: dict[str, Array], keys: Keys, grads: dict[str, Array]
) -> Array:
    """Backward of ``out = a @ W.T + b``: stores dW and db in ``grads``, returns da."""
    weight, bias = keys
    n_out, n_in = p[weight].shape
    grads[weight] = dout.reshape(-1, n_out).T @ a.reshape(-1, n_in)  # summed over positions
    if bias in p:
        grads[bias] = dout.sum(axis=(0, 1))  # (out,)
    return dout @ p[weight]  # (B, T, out) @ (out, in) -> (B, T, in)


# math.erf, elementwise. A Python call per element is slow, but exact to the last bit or two,
# which a rational approximation (and scipy, not a dependency) would have to earn.
_math_erf = np.frompyfunc(math.erf, 1, 1)
_TANH_K = math.sqrt(2.0 / math.pi)


def _erf(u: Array) -> Array:
    return np.asarray(_math_erf(u), dtype=np.float64)


def gelu(u: Array) -> Array:
    """Exact GELU, u * Phi(u), as F.gelu (not the tanh approximation, which differs by ~1e-3)."""
    return 0.5 * u * (1.0 + _erf(u / math.sqrt(2.0)))


def gelu_grad(u: Array) -> Array:
    """d/du [u * Phi(u)] = Phi(u) + u * phi(u), with phi the standard normal density."""
    cdf = 0.5 * (1.0 + _erf(u / math.sqrt(2.0)))
    return cdf + u * np.exp(-0.5 * u * u) / math.sqrt(2.0 * math.pi)


def gelu_tanh(u: Array) -> Array:
    """GELU's tanh approximation (GPT-2's): 0.5 u (1 + tanh(sqrt(2/pi) (u + 0.044715 u^3)))."""
    return 0.5 * u * (1.0 + np.tanh(_TANH_K * (u + 0.044715 * u**3)))


def gelu_tanh_grad(u: Array) -> Array:
    t = np.tanh(_TANH_K * (u + 0.044715 * u**3))
    return 0.5 * (1.0 + t) + 0.5 * u * (1.0 - t * t) * _TANH_K * (1.0 + 3 * 0.044715 * u * u)


def silu(u: Array) -> Array:
    return np.asarray(u / (1.0 + np.exp(-u)))


def silu_grad(u: Array) -> Array:
    s = 1.0 / (1.0 + np.exp(-u))
    return np.asarray(s * (1.0 + u * (1.0 - s)))


Activation = Callable[[Array], Array]
# The dense MLP's activations by the names gptblock's blocks use: (function, its derivative);
# relu's is 0 at 0, as torch's.
ACTIVATIONS: dict[str, tuple[Activation, Activation]] = {
    "gelu": (gelu, gelu_grad),
    "relu": (lambda u: np.maximum(u, 0.0), lambda u: (u > 0).astype(np.float64)),
    "gelu_tanh": (gelu_tanh, gelu_tanh_grad),
    "relu2": (lambda u: np.maximum(u, 0.0) ** 2, lambda u: 2.0 * np.maximum(u, 0.0)),
}
