"""The NumPy oracle: the pre-norm block's forward pass and a hand-derived backward pass.

The second lesson promises "the same computation without autograd"; this module is it, and the
project's oracle: every block form is tested against it, outputs and gradients, the way llm.c
checks its hand-written kernels against a reference. It imports NumPy and the standard library
only (a test loads it with torch made unimportable), so it can be copied out and run alone, and
a bug in PyTorch or in gptblock's torch code cannot leak into the answer it gives.

The block, with ``params`` named as ``TransformerBlock``'s (and ``nn.TransformerEncoderLayer``'s)
state_dict::

    h1  = norm1(x)                                    # LayerNorm
    q, k, v = split(h1 @ in_proj_weight.T + in_proj_bias)
    att = softmax(q @ k.T / sqrt(hs), causal + mask)  # per head; a fully blocked row is all 0
    x1  = x + (att @ v) @ out_proj.weight.T + out_proj.bias
    y   = x1 + linear2(act(linear1(norm2(x1))))       # act: exact (erf) GELU or ReLU

Everything is computed in float64 whatever the input dtype: an oracle's job is to be right.
A bias key that is absent (a block built with ``bias=False``) counts as zero and gets no
gradient. Masks are bool with ``True`` = blocked, as everywhere in gptblock.

Shapes: B batch, T time, C channels, nh heads, hs = C // nh head size, F = MLP hidden width.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

Array = NDArray[np.float64]

__all__ = [
    "PARAM_KEYS",
    "BlockCache",
    "block_backward",
    "block_forward",
    "causal_head",
    "params_from_state_dict",
    "softmax",
]

# (weight, bias) keys of the block's parameters; PARAM_KEYS lists them all, in state_dict order.
NORM1 = ("norm1.weight", "norm1.bias")
IN_PROJ = ("self_attn.in_proj_weight", "self_attn.in_proj_bias")
OUT_PROJ = ("self_attn.out_proj.weight", "self_attn.out_proj.bias")
NORM2 = ("norm2.weight", "norm2.bias")
LINEAR1 = ("linear1.weight", "linear1.bias")
LINEAR2 = ("linear2.weight", "linear2.bias")
PARAM_KEYS = tuple(
    key for pair in (NORM1, IN_PROJ, OUT_PROJ, NORM2, LINEAR1, LINEAR2) for key in pair
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
    activation: str  # "gelu" or "relu"
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
        activation: ``"gelu"`` (exact, erf-based, as ``F.gelu``) or ``"relu"``.
        eps: both LayerNorms' epsilon.
        mask: optional bool (T, T) or (B, T, T), ``True`` = blocked, combined with the causal
            mask. A query row with nothing left to attend to gets zero attention weights.

    Shape:
        x: (B, T, C). Returns ``y`` (B, T, C) and the cache for ``block_backward``.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> C = 8
        >>> params = {"norm1.weight": np.ones(C), "norm2.weight": np.ones(C),
        ...           "self_attn.in_proj_weight": rng.standard_normal((3 * C, C)),
        ...           "self_attn.out_proj.weight": rng.standard_normal((C, C)),
        ...           "linear1.weight": rng.standard_normal((4 * C, C)),
        ...           "linear2.weight": rng.standard_normal((C, 4 * C))}
        >>> y, cache = block_forward(params, rng.standard_normal((2, 5, C)), n_head=2)
        >>> y.shape
        (2, 5, 8)
        >>> dx, grads = block_backward(np.ones_like(y), cache)
        >>> dx.shape, sorted(grads) == sorted(params)
        ((2, 5, 8), True)
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 3 or 0 in x.shape:
        raise ValueError(f"x must be a non-empty (B, T, C) array, got shape {x.shape}")
    B, T, C = x.shape
    p = _check_params(params, C, n_head)
    if activation not in ("gelu", "relu"):
        raise ValueError(f"activation must be 'gelu' or 'relu', got {activation!r}")
    nh, hs = n_head, C // n_head
    blocked = _blocked(mask, B, T)  # (B or 1, 1, T, T)

    xhat1, rstd1 = _normalise(x, eps)
    h1 = _affine(xhat1, p, NORM1)  # (B, T, C)
    qkv = _linear(h1, p, IN_PROJ)  # (B, T, C) @ (C, 3C) -> (B, T, 3C), packed q;k;v
    # (B, T, 3C) -> (B, T, 3, nh, hs) -> (3, B, nh, T, hs): head i owns channels i*hs:(i+1)*hs
    q, k, v = qkv.reshape(B, T, 3, nh, hs).transpose(2, 0, 3, 1, 4)
    att = q @ k.swapaxes(-1, -2) / math.sqrt(hs)  # (B, nh, T, hs) @ (B, nh, hs, T) -> (B, nh, T, T)
    wei = softmax(att, blocked=blocked)  # (B, nh, T, T)
    ctx = (wei @ v).transpose(0, 2, 1, 3).reshape(B, T, C)  # (B, nh, T, hs) -> (B, T, C)
    x1 = x + _linear(ctx, p, OUT_PROJ)  # (B, T, C)

    xhat2, rstd2 = _normalise(x1, eps)
    h2 = _affine(xhat2, p, NORM2)  # (B, T, C)
    u = _linear(h2, p, LINEAR1)  # (B, T, C) @ (C, F) -> (B, T, F)
    g = _gelu(u) if activation == "gelu" else np.maximum(u, 0.0)
    y = x1 + _linear(g, p, LINEAR2)  # (B, T, F) @ (F, C) -> (B, T, C)

    cache = BlockCache(
        p, nh, activation, x, xhat1, rstd1, h1, q, k, v, wei, ctx, xhat2, rstd2, h2, u, g
    )
    return y, cache


def block_backward(dy: Any, cache: BlockCache) -> tuple[Array, dict[str, Array]]:
    """The block's backward pass, derived by hand: no autograd, no finite differences.

    Args:
        dy: the gradient of a scalar loss with respect to ``y``.
        cache: what ``block_forward`` returned with ``y``.

    Shape:
        dy: (B, T, C). Returns ``dx`` (B, T, C) and ``grads``, one array per key of the
        forward's ``params``, each the shape of its parameter.

    Example:
        See ``block_forward``.
    """
    p, c = cache.params, cache
    dy = np.asarray(dy, dtype=np.float64)
    if dy.shape != c.x.shape:
        raise ValueError(f"dy must have the shape of y, {c.x.shape}, got {dy.shape}")
    B, T, C = c.x.shape
    nh, hs = c.n_head, C // c.n_head
    grads: dict[str, Array] = {}

    # y = x1 + linear2(act(linear1(norm2(x1)))): the residual passes dy to x1 unchanged.
    dg = _linear_backward(dy, c.g, p, LINEAR2, grads)  # (B, T, F)
    # ReLU's gradient at exactly 0 is taken as 0, as torch does.
    du = dg * (_gelu_grad(c.u) if c.activation == "gelu" else c.u > 0)  # (B, T, F)
    dh2 = _linear_backward(du, c.h2, p, LINEAR1, grads)  # (B, T, C)
    dx1 = dy + _affine_normalise_backward(dh2, c.xhat2, c.rstd2, p, NORM2, grads)

    # x1 = x + out_proj(ctx)
    dctx = _linear_backward(dx1, c.ctx, p, OUT_PROJ, grads)  # (B, T, C)
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
    dh1 = _linear_backward(dqkv, c.h1, p, IN_PROJ, grads)  # (B, T, C)
    dx = dx1 + _affine_normalise_backward(dh1, c.xhat1, c.rstd1, p, NORM1, grads)
    return dx, {key: grads[key] for key in p}


def params_from_state_dict(state_dict: Mapping[str, Any], *, prefix: str = "") -> dict[str, Array]:
    """Turn a block's state_dict into ``params`` for ``block_forward``: float64 NumPy copies.

    Two layouts are recognised by their keys:

    * ``TransformerBlock``, ``FusedBlock`` and ``nn.TransformerEncoderLayer`` (``norm1.weight``,
      ``self_attn.in_proj_weight``, ...): copied as they are.
    * The lesson's ``Block`` (``sa.heads.{i}.key.weight``, ``sa.proj``, ``ffwd.net.0``/``.2``,
      ``ln1``, ``ln2``): the per-head query, key and value weights are stacked into the packed
      ``in_proj_weight`` (q rows of heads 0..nh-1, then k, then v). The lesson's q/k/v have no
      bias, so ``self_attn.in_proj_bias`` is left absent (zero, and no gradient), and the
      ``tril`` buffers are dropped. The lesson's MLP uses ReLU: pass ``activation="relu"`` and
      ``n_head=len(block.sa.heads)`` to ``block_forward``.

    Values may be torch tensors (on any device, any float dtype; torch is never imported here)
    or anything ``np.asarray`` accepts. The mapping is linear, so it also turns the lesson
    block's parameter *gradients* into the layout of ``block_backward``'s ``grads``.

    Args:
        state_dict: the block's ``state_dict()`` (or ``{name: p.grad}``).
        prefix: only keys starting with it are read, with it removed (e.g. ``"blocks.0."``).

    Raises:
        ValueError: neither layout is recognised, or a key is missing or unexpected.

    Example:
        >>> C, hs = 8, 4
        >>> sd = {f"sa.heads.{i}.{n}.weight": np.full((hs, C), 10 * i + j)
        ...       for i in range(2) for j, n in enumerate(("query", "key", "value"))}
        >>> shapes = {"ln1": (C,), "sa.proj": (C, C), "ln2": (C,), "ffwd.net.0": (4 * C, C),
        ...           "ffwd.net.2": (C, 4 * C)}
        >>> sd |= {f"{name}.weight": np.ones(shape) for name, shape in shapes.items()}
        >>> params = params_from_state_dict(sd)
        >>> params["self_attn.in_proj_weight"][::hs, 0].tolist()  # q0 q1 k0 k1 v0 v1
        [0.0, 10.0, 1.0, 11.0, 2.0, 12.0]
        >>> "self_attn.in_proj_bias" in params
        False
    """
    sd = {key[len(prefix) :]: value for key, value in state_dict.items() if key.startswith(prefix)}
    if IN_PROJ[0] in sd:
        out = {key: _to_float64(sd.pop(key)) for key in PARAM_KEYS if key in sd}
    elif "sa.heads.0.query.weight" in sd:
        out = _from_lesson_layout(sd)
    else:
        raise ValueError(
            f"no block parameters found under prefix {prefix!r}: expected "
            f"'{prefix}{IN_PROJ[0]}' (TransformerBlock / nn.TransformerEncoderLayer names) or "
            f"'{prefix}sa.heads.0.query.weight' (the lesson's Block); got keys {sorted(sd)[:6]}"
        )
    if sd:
        raise ValueError(f"unexpected keys for a block's state_dict: {sorted(sd)}")
    missing = [key for key in PARAM_KEYS if key.endswith("weight") and key not in out]
    if missing:
        raise ValueError(f"the state_dict has no {missing} (after prefix {prefix!r})")
    return out


# --- the pieces ---------------------------------------------------------------------------


def _normalise(x: Array, eps: float) -> tuple[Array, Array]:
    """LayerNorm without its affine part: (x - mean) / sqrt(biased var + eps), as nn.LayerNorm."""
    mu = x.mean(axis=-1, keepdims=True)  # (B, T, 1)
    rstd = 1.0 / np.sqrt(((x - mu) ** 2).mean(axis=-1, keepdims=True) + eps)  # (B, T, 1)
    return (x - mu) * rstd, rstd


def _affine(xhat: Array, p: dict[str, Array], keys: tuple[str, str]) -> Array:
    weight, bias = keys
    return xhat * p[weight] + p.get(bias, 0.0)


def _affine_normalise_backward(
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


def _linear(a: Array, p: dict[str, Array], keys: tuple[str, str]) -> Array:
    weight, bias = keys
    return a @ p[weight].T + p.get(bias, 0.0)  # (B, T, in) @ (in, out) -> (B, T, out)


def _linear_backward(
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


def _gelu(u: Array) -> Array:
    """Exact GELU, u * Phi(u), as F.gelu (not the tanh approximation, which differs by ~1e-3)."""
    return 0.5 * u * (1.0 + _erf(u / math.sqrt(2.0)))


def _gelu_grad(u: Array) -> Array:
    """d/du [u * Phi(u)] = Phi(u) + u * phi(u), with phi the standard normal density."""
    cdf = 0.5 * (1.0 + _erf(u / math.sqrt(2.0)))
    return cdf + u * np.exp(-0.5 * u * u) / math.sqrt(2.0 * math.pi)


# --- inputs -------------------------------------------------------------------------------


def _to_float64(value: Any) -> Array:
    if hasattr(value, "detach"):  # a torch.Tensor, recognised without importing torch
        value = value.detach().cpu().double().numpy()
    # A copy, never a view: the oracle must not alias (or be changed by) a module's weights.
    return np.array(value, dtype=np.float64)


def _from_lesson_layout(sd: dict[str, Any]) -> dict[str, Array]:
    nh = 0
    while f"sa.heads.{nh}.query.weight" in sd:
        nh += 1
    qkv = [f"sa.heads.{i}.{name}.weight" for name in ("query", "key", "value") for i in range(nh)]
    if any(key not in sd for key in qkv):
        raise ValueError(
            f"the lesson's Block has {nh} heads, but its state_dict lacks some of {qkv}"
        )
    # 3 * nh blocks of (hs, C), q of heads 0..nh-1, then k, then v -> (3C, C)
    out = {IN_PROJ[0]: np.concatenate([_to_float64(sd.pop(key)) for key in qkv])}
    for i in range(nh):
        sd.pop(f"sa.heads.{i}.tril", None)  # the causal mask buffer, not a parameter
    renames = {"ln1": "norm1", "sa.proj": "self_attn.out_proj", "ln2": "norm2"}
    renames |= {"ffwd.net.0": "linear1", "ffwd.net.2": "linear2"}
    for old, new in renames.items():
        for kind in ("weight", "bias"):
            if f"{old}.{kind}" in sd:
                out[f"{new}.{kind}"] = _to_float64(sd.pop(f"{old}.{kind}"))
    return {key: out[key] for key in PARAM_KEYS if key in out}


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
