"""The modern heads' queries and keys prepared in one pass: RMS-normalised per head, scaled by
the qk-norm gains, rotated; with a hand-written backward.

What ``attention.modern_qkv`` computes with ``RMSNorm`` and ``Rotary`` as separate modules,
done here on the packed projection (B, T, nh + 2 nkv, hs) at once: q and k heads side by side,
in float32 (the compute dtype of half-precision inputs), written back in the projection's
dtype. Autograd's graph of that chain (pow, mean, rsqrt, mul, cat, neg, casts: a dozen
(B, T, C)-sized tensors each way) made a modern training step 1.6x a GPT-2 one on a CPU:

* the rotation is ``z = x * C + swap(x) * S`` on whole contiguous tensors, the sign folded
  into S (no cat, no neg) and the gains into both tables ((.., T, H, hs), made once a call);
* its backward is the inverse rotation, ``gz * C - swap(gz) * S`` (a rotation is orthogonal:
  the gradient is rotated by minus the angle), and RMSNorm's is the closed form
  ``dx = r * (dn - n * mean(dn * n))`` with ``n = x * r``, ``r = 1 / sqrt(mean(x^2) + eps)``,
  its sums by one matrix product (a CPU's reductions over rows of 32 are slow);
* v is copied through, so q, k and v are three views of one output, and their gradients land
  in one (B, T, nh + 2 nkv, hs) tensor: no zero-filled slices summed by autograd.

The numbers are the modules' up to rounding (``tests/test_modern_fast.py`` holds them to the
module chain and to ``torch.autograd.gradcheck`` in float64).

Shapes: B batch, T time, nh query heads, nkv key/value heads, H = nh + nkv (q and k heads), hs
head size, r = rotary_dim (the rotated leading channels), r/2 channel pairs.
"""

from __future__ import annotations

from typing import Any

import torch

from .norms import RMSNorm, compute_dtype
from .rotary import Rotary

__all__ = ["QKHeads", "fast_qkv", "qk_heads", "rotary_cos_sin"]


def rotary_cos_sin(
    positions: torch.Tensor, r: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the angles ``pos * theta ** (-2i / r)``, i < r/2, laid out for the
    (B, T, H, r/2) pair views: (T, 1, r/2) or (B, T, 1, r/2). Computed in float64 (a float32
    angle at position 4096 is off by ~1e-4 rad), as ``rotary._cos_sin``, and cast to ``dtype``.
    """
    i = torch.arange(0, r, 2, dtype=torch.float64, device=positions.device)  # (r/2,)
    inv_freq = float(theta) ** (-i / r)  # (r/2,)
    angles = positions.to(torch.float64)[..., None, None] * inv_freq  # (.., T, 1, r/2)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _pairs(t: torch.Tensor, r: int, pairing: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The first and the second channel of each rotated pair, as views: (..., r/2) each."""
    if pairing == "halves":
        return t[..., : r // 2], t[..., r // 2 : r]
    return t[..., 0:r:2], t[..., 1:r:2]  # adjacent: (2i, 2i + 1)


def _swap(t: torch.Tensor, r: int, pairing: str) -> torch.Tensor:
    """``t`` with the two channels of each rotated pair exchanged (the rest copied): two
    strided copies, where autograd's rotation was a cat of negated halves."""
    out = torch.empty_like(t, memory_format=torch.contiguous_format)
    t1, t2 = _pairs(t, r, pairing)
    o1, o2 = _pairs(out, r, pairing)
    o1.copy_(t2)
    o2.copy_(t1)
    if r < t.shape[-1]:
        out[..., r:] = t[..., r:]
    return out


def _tables(
    cos: torch.Tensor, sin: torch.Tensor, hs: int, r: int, pairing: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotation as ``z = x * C + swap(x) * S``, the sign folded into S: C is cos on both
    channels of a pair (1 on the unrotated ones), S is -sin on the first, sin on the second (0
    on the unrotated). (.., T, 1, r/2) -> (.., T, 1, hs) each."""
    C = torch.ones(*cos.shape[:-1], hs, dtype=cos.dtype, device=cos.device)
    S = torch.zeros_like(C)
    c1, c2 = _pairs(C, r, pairing)
    s1, s2 = _pairs(S, r, pairing)
    c1.copy_(cos)
    c2.copy_(cos)
    torch.neg(sin, out=s1)
    s2.copy_(sin)
    return C, S


class QKHeads(torch.autograd.Function):
    """Forward and backward of ``qk_heads`` (see it); ``apply`` takes its arguments in order."""

    @staticmethod
    def forward(
        ctx: Any,
        qkv: torch.Tensor,
        q_gain: torch.Tensor | None,
        k_gain: torch.Tensor | None,
        cos: torch.Tensor | None,
        sin: torch.Tensor | None,
        nh: int,
        eps: float | None,
        r: int,
        pairing: str,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # The arithmetic is in the compute dtype chosen here, whatever autocast would choose.
        with torch.autocast(qkv.device.type, enabled=False):
            B, T, heads, hs = qkv.shape  # heads = nh + 2 nkv
            nkv = (heads - nh) // 2
            H = nh + nkv  # q and k heads
            cd = compute_dtype(qkv.dtype)
            out = torch.empty(B, T, heads, hs, dtype=qkv.dtype, device=qkv.device)
            out[:, :, H:] = qkv[:, :, H:]  # v, copied through
            # Every big operation below is on a contiguous tensor of the compute dtype, in place
            # where it can be: broadcasts over short rows and mixed dtypes cost several times a
            # plain pass on a CPU.
            n = qkv[:, :, :H].to(cd, memory_format=torch.contiguous_format, copy=True)
            gain = r_inv = None
            if eps is not None:  # RMSNorm over hs: n = x r, r = 1 / sqrt(mean(x^2) + eps)
                # One reduction pass (a norm), where mean(x^2) would be a product and a sum.
                rms = torch.linalg.vector_norm(n, dim=-1, keepdim=True)  # (B, T, H, 1)
                r_inv = rms.square_().div_(hs).add_(eps).rsqrt_()  # (B, T, H, 1)
                n.mul_(r_inv)
                if q_gain is not None and k_gain is not None:
                    gain = torch.cat((q_gain.to(cd).expand(nh, hs), k_gain.to(cd).expand(nkv, hs)))
            C = S = None
            if cos is not None and sin is not None and r > 0:
                C, S = _tables(cos.to(cd), sin.to(cd), hs, r, pairing)  # (.., T, 1, hs)
                # The gains folded into the tables, which are made whole: (.., T, H, hs).
                gc = C * (1.0 if gain is None else gain)
                gs = S * (1.0 if gain is None else _swap(gain, r, pairing))
                z = n * gc.expand(*C.shape[:-2], H, hs).contiguous()  # rot(n g)
                z.addcmul_(_swap(n, r, pairing), gs.expand_as(z).contiguous())
            else:
                z = n if gain is None else n * gain
            out[:, :, :H] = z  # rounded to the output's dtype once
            ctx.save_for_backward(n, r_inv, gain, C, S)
            ctx.shape = (nh, nkv, r, pairing)
            q, k, v = torch.split(out, [nh, nkv, nkv], dim=2)  # (B, T, nh | nkv, hs) each
            return q, k, v

    @staticmethod
    def backward(
        ctx: Any, gq: torch.Tensor, gk: torch.Tensor, gv: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        with torch.autocast(gv.device.type, enabled=False):
            return QKHeads._backward(ctx, gq, gk, gv)

    @staticmethod
    def _backward(
        ctx: Any, gq: torch.Tensor, gk: torch.Tensor, gv: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        n, r_inv, gain, C, S = ctx.saved_tensors
        nh, nkv, r, pairing = ctx.shape
        B, T, H, hs = n.shape
        grad = torch.empty(B, T, H + nkv, hs, dtype=gv.dtype, device=gv.device)
        grad[:, :, H:] = gv
        gz = torch.empty_like(n)  # (B, T, H, hs), the compute dtype
        gz[:, :, :nh] = gq
        gz[:, :, nh:] = gk
        if C is not None and S is not None:  # the inverse rotation: gz * C - swap(gz) * S
            whole = (*C.shape[:-2], H, hs)  # (.., T, H, hs)
            gy = gz * C.expand(whole).contiguous()
            gy.addcmul_(_swap(gz, r, pairing), S.expand(whole).contiguous(), value=-1)
        else:
            gy = gz
        none = (None,) * 7
        if r_inv is not None:
            # With dn = gy g: dx = r (dn - n mean(dn n)); the gains' gradient sums gy n. Both
            # sums come from p = gy n: over B and T, and per head through one matrix product
            # with the gains laid out block-diagonally (a CPU's reductions over short rows are
            # slow).
            p = (gy * n).view(B * T, H * hs)
            g_q = g_k = None
            blocks = torch.eye(H, dtype=n.dtype, device=n.device).repeat_interleave(hs, dim=0)
            if gain is not None:
                dg = p.sum(0).view(H, hs)  # (H, hs)
                g_q, g_k = dg[:nh].sum(0), dg[nh:].sum(0)  # (hs,) each
                blocks.mul_(gain.reshape(H * hs, 1))  # (H hs, H)
                gy.mul_(gain)
            dot = (p @ blocks).div_(hs).view(B, T, H, 1)  # mean(dn n) per head
            gy.addcmul_(n, dot, value=-1).mul_(r_inv)
            none = (g_q, g_k, *none[2:])
        grad[:, :, :H] = gy
        return (grad, *none, None)


def qk_heads(
    qkv: torch.Tensor,
    nh: int,
    *,
    q_gain: torch.Tensor | None = None,
    k_gain: torch.Tensor | None = None,
    eps: float | None = None,
    cos: torch.Tensor | None = None,
    sin: torch.Tensor | None = None,
    rotary_dim: int = 0,
    pairing: str = "halves",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k and v of the packed projection, q and k RMS-normalised (with ``eps``; gains
    optional) and rotated (with ``cos`` / ``sin`` from ``rotary_cos_sin``), v as it is.

    No input checks: ``attention.modern_qkv`` calls it with its modules' settings.

    Args:
        qkv: the projection, heads on the third dimension: nh query heads, then nkv key heads,
            then nkv value heads.
        nh: the number of query heads.
        q_gain, k_gain: the qk-norm's gains (hs,); only with ``eps``.
        eps: RMSNorm's epsilon; None: no norm.
        cos, sin: the angles' tables, (T, 1, r/2) or (B, T, 1, r/2); None: no rotation.
        rotary_dim: r, the leading channels rotated.
        pairing: ``"halves"`` or ``"adjacent"`` (``gptblock.blocks.rotary``).

    Shape:
        qkv (B, T, nh + 2 nkv, hs) -> q (B, T, nh, hs), k and v (B, T, nkv, hs), in qkv's dtype.

    Example:
        >>> from gptblock.blocks.rotary import apply_rotary
        >>> qkv = torch.randn(2, 5, 3, 8)  # (B, T, nh + 2 nkv, hs): one head each
        >>> cos, sin = rotary_cos_sin(torch.arange(5), 8, 10000.0, torch.float32)
        >>> q, k, v = qk_heads(qkv, 1, cos=cos, sin=sin, rotary_dim=8)
        >>> expected = apply_rotary(qkv[:, :, 0], torch.arange(5))  # (B, T, hs)
        >>> torch.allclose(q[:, :, 0], expected, atol=1e-6)
        True
        >>> torch.equal(v, qkv[:, :, 2:])
        True
    """
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] = QKHeads.apply(  # type: ignore[no-untyped-call]
        qkv, q_gain, k_gain, cos, sin, nh, eps, rotary_dim, pairing
    )
    return out


def _hooked(module: object) -> bool:
    """Whether a module has forward hooks that calling it would run (the fast path would not)."""
    return isinstance(module, torch.nn.Module) and bool(
        module._forward_hooks or module._forward_pre_hooks
    )


def _watched() -> bool:
    """Whether a Python dispatch or function mode is recording or changing the operators."""
    return bool(torch._C._len_torch_dispatch_stack() or torch._C._len_torch_function_stack())


def fast_qkv(
    qkv: torch.Tensor,
    nh: int,
    q_norm: object,
    k_norm: object,
    rotary: object,
    positions: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """``attention.modern_qkv``'s q, k and v by ``qk_heads`` where its parts are gptblock's
    own ``RMSNorm`` (or None) and ``Rotary`` (or None), with no hooks to run and nothing
    watching the operators (a dispatch or function mode, such as ``gptblock check``'s trace,
    or a tensor subclass: they see the modules' own operators); else None.

    Shape:
        qkv (B, T, nh + 2 nkv, hs) -> q (B, nh, T, hs), k and v (B, nkv, T, hs).
    """
    if type(qkv) is not torch.Tensor or _watched():
        return None
    normed = isinstance(q_norm, RMSNorm) and isinstance(k_norm, RMSNorm)
    if not (normed or q_norm is None is k_norm):
        return None
    if not (rotary is None or isinstance(rotary, Rotary)):
        return None
    if any(_hooked(m) for m in (q_norm, k_norm, rotary)):
        return None
    eps = q_gain = k_gain = None
    if isinstance(q_norm, RMSNorm) and isinstance(k_norm, RMSNorm):
        if q_norm.eps != k_norm.eps:
            return None
        eps, q_gain, k_gain = q_norm.eps, q_norm.weight, k_norm.weight
    cos = sin = None
    r = 0
    pairing = "halves"
    if isinstance(rotary, Rotary) and positions is not None:
        r, pairing = rotary.rotary_dim, rotary.pairing
        cd = compute_dtype(qkv.dtype)
        cos, sin = rotary_cos_sin(positions, r, rotary.theta, cd)  # (.., T, 1, r/2)
    q, k, v = qk_heads(
        qkv,
        nh,
        q_gain=q_gain,
        k_gain=k_gain,
        eps=eps,
        cos=cos,
        sin=sin,
        rotary_dim=r,
        pairing=pairing,
    )  # (B, T, nh | nkv, hs) each
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, nh | nkv, T, hs)
