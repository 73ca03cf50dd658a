"""The block's pieces in float64 NumPy, each forward next to its hand-derived backward.

LayerNorm (split into the normalisation and its affine part, as the backward needs them), a
linear layer, the exact GELU and the softmax (whose backward is written where it is used). Each
backward takes the gradient of the piece's output and returns that of its input, storing the
parameters' gradients in ``grads`` under their keys.

Shapes: B batch, T time, C channels, F = MLP hidden width; ``in``/``out`` a layer's widths.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

Array = NDArray[np.float64]


def normalise(x: Array, eps: float) -> tuple[Array, Array]:
    """LayerNorm without its affine part: (x - mean) / sqrt(biased var + eps), as nn.LayerNorm."""
    mu = x.mean(axis=-1, keepdims=True)  # (B, T, 1)
    rstd = 1.0 / np.sqrt(((x - mu) ** 2).mean(axis=-1, keepdims=True) + eps)  # (B, T, 1)
    return (x - mu) * rstd, rstd


def affine(xhat: Array, p: dict[str, Array], keys: tuple[str, str]) -> Array:
    weight, bias = keys
    return xhat * p[weight] + p.get(bias, 0.0)


def affine_normalise_backward(
    dh: Array,
    xhat: Array,
    rstd: Array,
    p: dict[str, Array],
    keys: tuple[str, str],
    grads: dict[str, Array],
) -> Array:
    """Backward of h = xhat * w + b with xhat = (x - mean) * rstd; returns dx.

    d xhat = dh * w. Through the mean and the variance (both over C), with m(.) the mean over C:
    dx = rstd * (d xhat - m(d xhat) - xhat * m(d xhat * xhat)).
    """
    weight, bias = keys
    grads[weight] = (dh * xhat).sum(axis=(0, 1))  # (C,)
    if bias in p:
        grads[bias] = dh.sum(axis=(0, 1))  # (C,)
    dxhat = dh * p[weight]  # (B, T, C)
    return rstd * (
        dxhat
        - dxhat.mean(axis=-1, keepdims=True)
        - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True)
    )


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


def linear(a: Array, p: dict[str, Array], keys: tuple[str, str]) -> Array:
    weight, bias = keys
    return a @ p[weight].T + p.get(bias, 0.0)  # (B, T, in) @ (in, out) -> (B, T, out)


def linear_backward(
    dout: Array, a: Array, p: dict[str, Array], keys: tuple[str, str], grads: dict[str, Array]
) -> Array:
    """Backward of out = a @ W.T + b: stores dW and db in ``grads``, returns da."""
    weight, bias = keys
    n_out, n_in = p[weight].shape
    # (out, B*T) @ (B*T, in) -> (out, in): every position contributes to the one weight
    grads[weight] = dout.reshape(-1, n_out).T @ a.reshape(-1, n_in)
    if bias in p:
        grads[bias] = dout.sum(axis=(0, 1))  # (out,)
    return dout @ p[weight]  # (B, T, out) @ (out, in) -> (B, T, in)


# math.erf, elementwise. A Python call per element is slow, but exact to the last bit or two,
# which a rational approximation (and scipy, not a dependency) would have to earn.
_math_erf = np.frompyfunc(math.erf, 1, 1)


def _erf(u: Array) -> Array:
    return np.asarray(_math_erf(u), dtype=np.float64)


def gelu(u: Array) -> Array:
    """Exact GELU, u * Phi(u), as F.gelu (not the tanh approximation, which differs by ~1e-3)."""
    return 0.5 * u * (1.0 + _erf(u / math.sqrt(2.0)))


def gelu_tanh(u: Array) -> Array:
    """GELU's tanh approximation (GPT-2's): 0.5 u (1 + tanh(sqrt(2/pi) (u + 0.044715 u^3)))."""
    return 0.5 * u * (1.0 + np.tanh(_TANH_K * (u + 0.044715 * u**3)))


def gelu_tanh_grad(u: Array) -> Array:
    """d/du of ``gelu_tanh``: 0.5 (1 + t) + 0.5 u (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 u^2)."""
    t = np.tanh(_TANH_K * (u + 0.044715 * u**3))
    return 0.5 * (1.0 + t) + 0.5 * u * (1.0 - t * t) * _TANH_K * (1.0 + 3 * 0.044715 * u * u)


_TANH_K = math.sqrt(2.0 / math.pi)


def gelu_grad(u: Array) -> Array:
    """d/du [u * Phi(u)] = Phi(u) + u * phi(u), with phi the standard normal density."""
    cdf = 0.5 * (1.0 + _erf(u / math.sqrt(2.0)))
    return cdf + u * np.exp(-0.5 * u * u) / math.sqrt(2.0 * math.pi)


def relu(u: Array) -> Array:
    return np.maximum(u, 0.0)


def relu_grad(u: Array) -> Array:
    return (u > 0).astype(np.float64)  # 0 at u = 0, as torch's relu backward


# The MLP's activations by the names gptblock's blocks use: (function, its derivative).
ACTIVATIONS = {
    "gelu": (gelu, gelu_grad),
    "relu": (relu, relu_grad),
    "gelu_tanh": (gelu_tanh, gelu_tanh_grad),
}
