"""The block in float64 NumPy: one forward pass, with options, and its hand-derived backward.

GPT-2's block with Llama's, Qwen's and GPT-J's parts as options (``ModernOptions``), named and
laid out as ``FusedBlock``'s state_dict::

    h1  = norm1(x)                                   # LayerNorm or RMSNorm
    q, k, v = split(h1 @ in_proj_weight.T + in_proj_bias)   # q: nh heads; k, v: nkv heads
    q, k = q_norm(q), k_norm(k)                      # qk_norm: RMSNorm over each head's hs
    q, k = rotate(q, pos), rotate(k, pos)            # rope: the first rotary_dim channels
    att = softmax(q @ repeat(k).T / sqrt(hs), causal)   # key/value head j // (nh / nkv)
    x1  = x + (att @ repeat(v)) @ out_proj.weight.T + out_proj.bias
    y   = x1 + mlp(norm2(x1))                        # parallel_residual: y = x1 + mlp(h1)
    mlp = linear2(act(linear1 h))  or  linear2(silu(linear1 h) * linear3 h)   # "swiglu"

Each backward line undoes one forward line. The lessons' block (``block_forward``) is this one
with the default options.

Shapes: B batch, T time, C channels, nh heads, nkv key/value heads, hs = C // nh, F = MLP width.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from . import pieces
from .layout import IN_PROJ, LINEAR1, LINEAR2, NORM1, NORM2, OUT_PROJ, PARAM_KEYS
from .pieces import ACTIVATIONS, Array, linear, linear_backward, norm_backward, normalise, softmax

Q_NORM, K_NORM = ("self_attn.q_norm.weight", ""), ("self_attn.k_norm.weight", "")
LINEAR3 = ("linear3.weight", "linear3.bias")


@dataclass(frozen=True)
class ModernOptions:
    """The block's options, named as ``gptblock.BlockConfig``'s (without dropout and bias: a
    bias absent from ``params`` counts as zero; ``position`` matters only as ``"rope"``)."""

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


BlockCache = ModernCache  # what ``block_backward`` needs of ``block_forward``


def modern_forward(
    params: dict[str, Any], x: Any, o: ModernOptions, positions: Any = None, mask: Any = None
) -> tuple[Array, ModernCache]:
    """The block's forward pass in float64: x (B, T, C) -> y (B, T, C) and the cache for
    ``modern_backward``. ``params`` are named as ``FusedBlock``'s state_dict (absent biases are
    zero); ``positions`` (T,) or (B, T), default 0 .. T-1, are for the rotary angles only (the
    causal mask follows the rows' order); ``mask`` is ``block_forward``'s.

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
    layer = o.norm == "layernorm"
    n1 = normalise(x, o.norm_eps, layer)
    h1 = pieces.affine(n1[0], p, NORM1)  # (B, T, C)
    qkv = linear(h1, p, IN_PROJ)  # (B, T, C + 2 nkv hs)
    q = qkv[..., :C].reshape(B, T, nh, hs).transpose(0, 2, 1, 3)  # (B, nh, T, hs)
    k = qkv[..., C : C + nkv * hs].reshape(B, T, nkv, hs).transpose(0, 2, 1, 3)  # (B, nkv, T, hs)
    v = qkv[..., C + nkv * hs :].reshape(B, T, nkv, hs).transpose(0, 2, 1, 3)  # (B, nkv, T, hs)
    qn = kn = rot = None
    if o.qk_norm:
        qn, kn = normalise(q, o.norm_eps, False), normalise(k, o.norm_eps, False)
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
    n2 = None if o.parallel_residual else normalise(x1, o.norm_eps, layer)
    h2 = h1 if n2 is None else pieces.affine(n2[0], p, NORM2)  # (B, T, C)
    u = linear(h2, p, LINEAR1)  # (B, T, F)
    up = None
    if o.mlp == "swiglu":
        up = linear(h2, p, LINEAR3)  # (B, T, F)
        g = pieces.silu(u) * up
    else:
        g = ACTIVATIONS[o.activation][0](u)
    y = x1 + linear(g, p, LINEAR2)  # (B, T, C)
    cache = ModernCache(o, p, x, n1, h1, qn, kn, rot, q, k, v, wei, ctx, n2, h2, u, up, g)
    return y, cache


def modern_backward(dy: Any, c: ModernCache) -> tuple[Array, dict[str, Array]]:
    """The hand-derived backward of ``modern_forward``: ``dx`` and a gradient per parameter."""
    o, p = c.o, c.params
    dy = np.asarray(dy, dtype=np.float64)
    B, T, C = c.x.shape
    nh = o.n_head
    nkv = o.n_kv_head or nh
    hs = C // nh
    layer = o.norm == "layernorm"
    grads: dict[str, Array] = {}

    dg = linear_backward(dy, c.g, p, LINEAR2, grads)  # (B, T, F)
    if c.up is not None:  # g = silu(u) * up
        dh2 = linear_backward(dg * pieces.silu(c.u), c.h2, p, LINEAR3, grads)
        dh2 = dh2 + linear_backward(dg * c.up * pieces.silu_grad(c.u), c.h2, p, LINEAR1, grads)
    else:
        dh2 = linear_backward(dg * ACTIVATIONS[o.activation][1](c.u), c.h2, p, LINEAR1, grads)
    dx1 = dy  # y = x1 + mlp(...)
    dh1 = np.zeros_like(c.x)
    if c.n2 is None:  # parallel: the MLP read h1
        dh1 = dh1 + dh2
    else:
        dx1 = dx1 + norm_backward(dh2, c.n2, p, NORM2, grads, layer)

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
        dq = norm_backward(dq, c.qn, p, Q_NORM, grads, centred=False)
        dk = norm_backward(dk, c.kn, p, K_NORM, grads, centred=False)
    dqkv = np.concatenate(
        [t.transpose(0, 2, 1, 3).reshape(B, T, -1) for t in (dq, dk, dv)], axis=-1
    )  # (B, T, C + 2 nkv hs)
    dh1 = dh1 + linear_backward(dqkv, c.h1, p, IN_PROJ, grads)
    dx = dx1 + norm_backward(dh1, c.n1, p, NORM1, grads, layer)
    return dx, {key: grads[key] for key in p}


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


# --- the lessons' block: the default options, its arguments checked ------------------------


def causal_head(q: Any, k: Any, v: Any) -> tuple[Array, Array]:
    """One causal attention head (lesson 1, exercise 2) on q, k, v (..., T, hs): ``out`` (..., T,
    hs) and the weights ``wei`` (..., T, T), 0 above the diagonal, scaled by ``1 / sqrt(hs)``.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> q, k, v = rng.standard_normal((3, 5, 4))
        >>> out, wei = causal_head(q, k, v)
        >>> out.shape, bool(np.allclose(wei.sum(-1), 1)), bool((np.triu(wei, 1) == 0).all())
        ((5, 4), True, True)
    """
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    T = q.shape[-2]
    wei = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1])  # (..., T, T)
    wei = softmax(wei, blocked=np.triu(np.ones((T, T), dtype=bool), k=1))  # 0 above the diagonal
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
    """The lessons' pre-norm block's forward pass, in float64 NumPy: ``modern_forward`` with
    the default options, its arguments checked.

    ``params`` are named as ``TransformerBlock``'s state_dict (``PARAM_KEYS``; absent biases are
    zero): ``params_from_state_dict``'s. ``activation`` is "gelu" (exact), "relu", "gelu_tanh"
    or "relu2"; ``mask`` (T, T) or (B, T, T), ``True`` = blocked, blocks more than the causal
    mask (a row left with nothing gets zero weights). x (B, T, C) -> y (B, T, C) and the cache.
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
    """``block_forward``'s backward (``modern_backward``), derived by hand: ``dx`` (B, T, C)
    and ``grads``, one array per key of the forward's ``params``, of its shape. ``dy``, the
    gradient of a scalar loss with respect to ``y``, is (B, T, C). The package's overview,
    ``gptblock.reference``, runs the forward and this backward."""
    dy = np.asarray(dy, dtype=np.float64)
    if dy.shape != cache.x.shape:
        raise ValueError(f"dy must have the shape of y, {cache.x.shape}, got {dy.shape}")
    return modern_backward(dy, cache)


def _check_params(params: Mapping[str, Any], C: int, n_head: int) -> dict[str, Array]:
    if isinstance(n_head, bool) or not isinstance(n_head, int) or n_head < 1 or C % n_head:
        raise ValueError(f"n_head must be a positive int dividing C={C}, got {n_head!r}")
    unknown = sorted(set(params) - set(PARAM_KEYS))
    if unknown:
        raise ValueError(f"unexpected parameter names {unknown}; expected names from {PARAM_KEYS}")
    p = {key: np.asarray(params[key], dtype=np.float64) for key in PARAM_KEYS if key in params}
    F = p[LINEAR1[0]].shape[0] if LINEAR1[0] in p else 4 * C
    # In PARAM_KEYS' order: norm1, in_proj, out_proj, norm2, linear1, linear2 (weight, bias).
    shapes = [
        (C,),
        (C,),
        (3 * C, C),
        (3 * C,),
        (C, C),
        (C,),
        (C,),
        (C,),
        (F, C),
        (F,),
        (C, F),
        (C,),
    ]
    for key, shape in zip(PARAM_KEYS, shapes, strict=True):
        if key in p and p[key].shape != shape:
            raise ValueError(f"{key} must have shape {shape} for C={C}, got {p[key].shape}")
        if key not in p and key.endswith("weight"):
            raise ValueError(f"params has no {key!r} (expected shape {shape})")
    return p
