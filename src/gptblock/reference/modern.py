"""The modern block in float64 NumPy: its forward and a hand-derived backward.

GPT-2's block (``block_forward``) with the parts of Llama, Mistral, Qwen and GPT-J swapped in,
each one an option (``ModernOptions``), named and laid out as ``FusedBlock``'s state_dict::

    h1  = norm1(x)                                   # LayerNorm or RMSNorm
    q, k, v = split(h1 @ in_proj_weight.T + in_proj_bias)   # q: nh heads; k, v: nkv heads
    q, k = q_norm(q), k_norm(k)                      # qk_norm: RMSNorm over each head's hs
    q, k = rotate(q, pos), rotate(k, pos)            # rope: the first rotary_dim channels
    att = softmax(q @ repeat(k).T / sqrt(hs), causal)   # key/value head j // (nh / nkv)
    x1  = x + (att @ repeat(v)) @ out_proj.weight.T + out_proj.bias
    y   = x1 + mlp(norm2(x1))                        # parallel_residual: y = x1 + mlp(h1)
    mlp = linear2(act(linear1 h))  or  linear2(silu(linear1 h) * linear3 h)   # "swiglu"

Each backward line undoes one forward line: RMSNorm's ``dx = r (dxhat - xhat m(dxhat xhat))``,
a rotation's transpose is the rotation by minus the angle, and a repeated key/value head
collects the gradients of the query heads it served. NumPy and the standard library only.

Shapes: B batch, T time, C channels, nh heads, nkv key/value heads, hs = C // nh, r rotated
channels, F = MLP hidden width.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .layout import IN_PROJ, LINEAR1, LINEAR2, NORM1, NORM2, OUT_PROJ
from .pieces import ACTIVATIONS, Array, affine_normalise_backward, linear, linear_backward, softmax
from .pieces import normalise as layer_normalise

__all__ = ["ModernCache", "ModernOptions", "modern_backward", "modern_forward"]

Q_NORM, K_NORM = ("self_attn.q_norm.weight", ""), ("self_attn.k_norm.weight", "")
LINEAR3 = ("linear3.weight", "linear3.bias")


@dataclass(frozen=True)
class ModernOptions:
    """The block's options, named as ``gptblock.BlockConfig``'s and ``GPTConfig``'s (without
    dropout and bias: a bias absent from ``params`` counts as zero; ``position`` rotates the
    queries and keys as ``"rope"``, and is the model's business otherwise)."""

    n_head: int
    n_kv_head: int | None = None  # None: n_head
    norm: str = "layernorm"  # or "rmsnorm"
    mlp: str = "dense"  # or "swiglu"
    activation: str = "gelu"  # the dense MLP's: "gelu", "relu", "gelu_tanh", "relu2"
    norm_eps: float = 1e-5
    qk_norm: bool = False
    parallel_residual: bool = False
    position: str = "learned"  # or "rope" (or "none")
    rotary_dim: int | None = None  # None: hs
    rope_theta: float = 10000.0
    rope_pairing: str = "halves"  # or "adjacent"


@dataclass(frozen=True)
class ModernCache:
    """What ``modern_backward`` needs of ``modern_forward``."""

    o: ModernOptions
    params: dict[str, Array]
    x: Array  # (B, T, C)
    n1: tuple[Array, Array]  # norm1's xhat (B, T, C) and 1 / scale (B, T, 1)
    h1: Array  # (B, T, C)
    qn: tuple[Array, Array] | None  # q_norm's xhat and 1 / rms, (B, nh, T, hs), (.., 1)
    kn: tuple[Array, Array] | None  # k_norm's, (B, nkv, T, hs), (.., 1)
    rot: tuple[Array, Array] | None  # cos, sin (T, r/2) or (B, 1, T, r/2)
    q: Array  # (B, nh, T, hs): normalised and rotated
    k: Array  # (B, nh, T, hs): repeated for the query heads
    v: Array  # (B, nh, T, hs): repeated
    wei: Array  # (B, nh, T, T)
    ctx: Array  # (B, T, C)
    n2: tuple[Array, Array] | None  # norm2's (None with parallel_residual)
    h2: Array  # (B, T, C): the MLP's input
    u: Array  # (B, T, F): linear1's output (the gate, with SwiGLU)
    up: Array | None  # (B, T, F): linear3's output (SwiGLU)
    g: Array  # (B, T, F): linear2's input


def modern_forward(
    params: dict[str, Any], x: Any, o: ModernOptions, positions: Any = None, mask: Any = None
) -> tuple[Array, ModernCache]:
    """The modern block's forward pass in float64.

    Args:
        params: arrays named as ``FusedBlock``'s state_dict; absent biases are zero.
        x: the input.
        o: the options.
        positions: the rows' token positions for the rotary angles, (T,) or (B, T); default
            0 .. T-1 (the causal mask follows the rows' order whatever their positions).
        mask: optional bool (T, T) or (B, T, T), ``True`` = blocked, combined with the causal
            mask. A query row with nothing left to attend to gets zero attention weights.

    Shape:
        x (B, T, C) -> y (B, T, C), and the cache for ``modern_backward``.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> C, F = 8, 12
        >>> shapes = {"norm1.weight": (C,), "self_attn.in_proj_weight": (C + 2 * 4, C),
        ...           "self_attn.out_proj.weight": (C, C), "linear1.weight": (F, C),
        ...           "linear3.weight": (F, C), "linear2.weight": (C, F)}
        >>> p = {key: rng.standard_normal(shape) for key, shape in shapes.items()}
        >>> o = ModernOptions(n_head=2, n_kv_head=1, norm="rmsnorm", mlp="swiglu",
        ...                   parallel_residual=True, position="rope")
        >>> y, cache = modern_forward(p, rng.standard_normal((1, 3, C)), o)
        >>> dx, grads = modern_backward(np.ones_like(y), cache)
        >>> y.shape, dx.shape, sorted(grads) == sorted(p)
        ((1, 3, 8), (1, 3, 8), True)
    """
    p = {key: np.asarray(value, dtype=np.float64) for key, value in params.items()}
    x = np.asarray(x, dtype=np.float64)
    B, T, C = x.shape
    nh = o.n_head
    nkv = o.n_kv_head or nh
    hs = C // nh
    n1 = _normalise(x, o.norm, o.norm_eps)
    h1 = _affine(n1[0], p, NORM1)  # (B, T, C)
    qkv = linear(h1, p, IN_PROJ)  # (B, T, C + 2 nkv hs)
    q = qkv[..., :C].reshape(B, T, nh, hs).transpose(0, 2, 1, 3)  # (B, nh, T, hs)
    k = qkv[..., C : C + nkv * hs].reshape(B, T, nkv, hs).transpose(0, 2, 1, 3)  # (B, nkv, T, hs)
    v = qkv[..., C + nkv * hs :].reshape(B, T, nkv, hs).transpose(0, 2, 1, 3)  # (B, nkv, T, hs)
    qn = kn = rot = None
    if o.qk_norm:
        qn, kn = _normalise(q, "rmsnorm", o.norm_eps), _normalise(k, "rmsnorm", o.norm_eps)
        q, k = qn[0] * p[Q_NORM[0]], kn[0] * p[K_NORM[0]]
    if o.position == "rope":
        r = hs if o.rotary_dim is None else o.rotary_dim
        inv_freq = o.rope_theta ** (-np.arange(0, r, 2) / r)  # (r/2,)
        pos = np.arange(T) if positions is None else np.asarray(positions, dtype=np.float64)
        angles = pos[..., None] * inv_freq  # (T, r/2) or (B, T, r/2)
        angles = angles[:, None] if angles.ndim == 3 else angles  # (B, 1, T, r/2): every head
        rot = (np.cos(angles), np.sin(angles))
        q, k = _rotate(q, rot, o.rope_pairing, 1.0), _rotate(k, rot, o.rope_pairing, 1.0)
    k, v = np.repeat(k, nh // nkv, axis=1), np.repeat(v, nh // nkv, axis=1)  # (B, nh, T, hs)
    att = q @ k.swapaxes(-1, -2) / math.sqrt(hs)  # (B, nh, T, T)
    wei = softmax(att, blocked=_blocked(mask, B, T))  # (B, nh, T, T)
    ctx = (wei @ v).transpose(0, 2, 1, 3).reshape(B, T, C)  # (B, nh, T, hs) -> (B, T, C)
    x1 = x + linear(ctx, p, OUT_PROJ)  # (B, T, C)
    n2 = None if o.parallel_residual else _normalise(x1, o.norm, o.norm_eps)
    h2 = h1 if n2 is None else _affine(n2[0], p, NORM2)  # (B, T, C)
    u = linear(h2, p, LINEAR1)  # (B, T, F)
    up = None
    if o.mlp == "swiglu":
        up = linear(h2, p, LINEAR3)  # (B, T, F)
        g = _silu(u) * up
    else:
        g = _activation(o.activation)[0](u)
    y = x1 + linear(g, p, LINEAR2)  # (B, T, C)
    cache = ModernCache(o, p, x, n1, h1, qn, kn, rot, q, k, v, wei, ctx, n2, h2, u, up, g)
    return y, cache


def modern_backward(dy: Any, c: ModernCache) -> tuple[Array, dict[str, Array]]:
    """The hand-derived backward of ``modern_forward``: ``dx`` and a gradient per parameter.

    Shape:
        dy (B, T, C) -> dx (B, T, C) and ``{key: (shape of params[key])}``.
    """
    o, p = c.o, c.params
    dy = np.asarray(dy, dtype=np.float64)
    B, T, C = c.x.shape
    nh = o.n_head
    nkv = o.n_kv_head or nh
    hs = C // nh
    grads: dict[str, Array] = {}

    dg = linear_backward(dy, c.g, p, LINEAR2, grads)  # (B, T, F)
    if c.up is not None:  # g = silu(u) * up
        dh2 = linear_backward(dg * _silu(c.u), c.h2, p, LINEAR3, grads)
        dh2 = dh2 + linear_backward(dg * c.up * _silu_grad(c.u), c.h2, p, LINEAR1, grads)
    else:
        dh2 = linear_backward(dg * _activation(o.activation)[1](c.u), c.h2, p, LINEAR1, grads)
    dx1 = dy  # y = x1 + mlp(...)
    dh1 = np.zeros_like(c.x)
    if c.n2 is None:  # parallel: the MLP read h1
        dh1 = dh1 + dh2
    else:
        dx1 = dx1 + _norm_backward(dh2, c.n2, p, NORM2, o.norm, grads)

    dctx = linear_backward(dx1, c.ctx, p, OUT_PROJ, grads)
    dctx = dctx.reshape(B, T, nh, hs).transpose(0, 2, 1, 3)  # (B, nh, T, hs)
    dwei = dctx @ c.v.swapaxes(-1, -2)  # (B, nh, T, T)
    dv = c.wei.swapaxes(-1, -2) @ dctx  # (B, nh, T, hs)
    datt = c.wei * (dwei - (dwei * c.wei).sum(axis=-1, keepdims=True)) / math.sqrt(hs)
    dq = datt @ c.k  # (B, nh, T, hs)
    dk = datt.swapaxes(-1, -2) @ c.q  # (B, nh, T, hs)
    # A repeated key/value head served nh / nkv query heads: their gradients add up.
    dk, dv = (t.reshape(B, nkv, nh // nkv, T, hs).sum(axis=2) for t in (dk, dv))
    if c.rot is not None:  # the transpose of a rotation is the rotation backwards
        dq, dk = _rotate(dq, c.rot, o.rope_pairing, -1.0), _rotate(dk, c.rot, o.rope_pairing, -1.0)
    if c.qn is not None and c.kn is not None:
        dq = _rms_backward(dq, c.qn, p, Q_NORM[0], grads)
        dk = _rms_backward(dk, c.kn, p, K_NORM[0], grads)
    dqkv = np.concatenate(
        [t.transpose(0, 2, 1, 3).reshape(B, T, -1) for t in (dq, dk, dv)], axis=-1
    )  # (B, T, C + 2 nkv hs)
    dh1 = dh1 + linear_backward(dqkv, c.h1, p, IN_PROJ, grads)
    dx = dx1 + _norm_backward(dh1, c.n1, p, NORM1, o.norm, grads)
    return dx, {key: grads[key] for key in p}


# --- pieces --------------------------------------------------------------------------------


def _normalise(x: Array, kind: str, eps: float) -> tuple[Array, Array]:
    """(xhat, 1 / scale) over the last axis: LayerNorm's, or RMSNorm's ``x / sqrt(m(x^2) + eps)``."""
    if kind == "layernorm":
        return layer_normalise(x, eps)
    rstd = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)  # (..., 1)
    return x * rstd, rstd


def _affine(xhat: Array, p: dict[str, Array], keys: tuple[str, str]) -> Array:
    return xhat * p[keys[0]] + p.get(keys[1], 0.0)


def _norm_backward(
    dh: Array,
    n: tuple[Array, Array],
    p: dict[str, Array],
    keys: tuple[str, str],
    kind: str,
    grads: dict[str, Array],
) -> Array:
    if kind == "layernorm":
        return affine_normalise_backward(dh, n[0], n[1], p, keys, grads)
    if keys[1] in p:
        grads[keys[1]] = dh.sum(axis=(0, 1))
    return _rms_backward(dh, n, p, keys[0], grads)


def _rms_backward(
    dh: Array, n: tuple[Array, Array], p: dict[str, Array], weight: str, grads: dict[str, Array]
) -> Array:
    """Backward of h = xhat * w, xhat = x r, r = 1 / sqrt(m(x^2) + eps) (m: mean over the
    last axis): dr/dx_j = -r^3 x_j / n, so dx = r (dxhat - xhat m(dxhat xhat))."""
    xhat, rstd = n
    grads[weight] = (dh * xhat).reshape(-1, xhat.shape[-1]).sum(axis=0)
    dxhat = dh * p[weight]
    return rstd * (dxhat - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))


def _rotate(x: Array, rot: tuple[Array, Array], pairing: str, sign: float) -> Array:
    """Rotate each channel pair of x (..., T, hs) by ``sign`` times the angles of ``rot``."""
    cos, sin = rot[0], sign * rot[1]  # (T, r/2) or (B, 1, T, r/2)
    half = cos.shape[-1]
    first = np.arange(half) if pairing == "halves" else np.arange(0, 2 * half, 2)
    second = first + half if pairing == "halves" else first + 1
    x1, x2 = x[..., first], x[..., second]  # (..., T, r/2)
    out = x.copy()
    out[..., first] = x1 * cos - x2 * sin
    out[..., second] = x1 * sin + x2 * cos
    return out


def _silu(u: Array) -> Array:
    return np.asarray(u / (1.0 + np.exp(-u)))


def _silu_grad(u: Array) -> Array:
    s = 1.0 / (1.0 + np.exp(-u))
    return np.asarray(s * (1.0 + u * (1.0 - s)))


def _relu2(u: Array) -> Array:
    return np.asarray(np.maximum(u, 0.0) ** 2)


def _relu2_grad(u: Array) -> Array:
    return np.asarray(2.0 * np.maximum(u, 0.0))


def _activation(name: str) -> Any:
    """(function, derivative) of a dense MLP's activation."""
    return (_relu2, _relu2_grad) if name == "relu2" else ACTIVATIONS[name]


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
