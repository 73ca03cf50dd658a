"""The modern heads' queries and keys prepared in one pass, with a hand-written backward.

``QKHeads`` is ``ModernHeads``' RMSNorm and rotation on the packed projection at once: autograd's
graph of that chain made a modern training step 1.6x a GPT-2 one on a CPU. The rotation is ``z =
x * C + swap(x) * S`` on whole tensors, sign and gains folded into the tables; its backward is
the inverse rotation, RMSNorm's is ``norms.rms_backward``; v is copied through, so the three
gradients land in one tensor. ``tests/test_modern_fast.py`` holds it to the module chain.

Shapes: B batch, T time, nh query heads, nkv key/value heads, H = nh + nkv (q and k heads), hs
head size, r = rotary_dim (the rotated leading channels).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from .norms import RMSNorm, compute_dtype, inverse_rms, rms_backward
from .rotary import Rotary, cos_sin, pair_views

__all__ = ["ModernHeads", "QKHeads", "repeat_kv"]


def _swap(t: Tensor, r: int, pairing: str) -> Tensor:
    """``t`` with the two channels of each rotated pair exchanged (the rest copied)."""
    out = torch.empty_like(t, memory_format=torch.contiguous_format)
    t1, t2 = pair_views(t, r, pairing)
    o1, o2 = pair_views(out, r, pairing)
    o1.copy_(t2)
    o2.copy_(t1)
    if r < t.shape[-1]:
        out[..., r:] = t[..., r:]
    return out


def _tables(cos: Tensor, sin: Tensor, hs: int, r: int, pairing: str) -> tuple[Tensor, Tensor]:
    """The rotation as ``z = x * C + swap(x) * S``: C is cos on both channels of a pair (1 on
    the unrotated), S -sin on the first, sin on the second (0 on the unrotated): (.., T, 1, hs)."""
    cos, sin = cos[..., None, :], sin[..., None, :]  # (.., T, 1, r/2): shared by the heads
    C = torch.ones(*cos.shape[:-1], hs, dtype=cos.dtype, device=cos.device)
    S = torch.zeros_like(C)
    c1, c2 = pair_views(C, r, pairing)
    s1, s2 = pair_views(S, r, pairing)
    c1.copy_(cos)
    c2.copy_(cos)
    torch.neg(sin, out=s1)
    s2.copy_(sin)
    return C, S


class QKHeads(torch.autograd.Function):
    """``apply(qkv, q_gain, k_gain, cos, sin, nh, eps, r, pairing)``: q and k of ``qkv`` (B, T,
    nh + 2 nkv, hs) RMS-normalised (``eps`` None: not; gains (hs,) optional) and rotated over
    their first r channels (``cos`` / ``sin`` of ``rotary.cos_sin``; None: not), v as it is ->
    q (B, T, nh, hs), k and v (B, T, nkv, hs), in qkv's dtype. No input checks."""

    @staticmethod
    def forward(
        ctx: Any,
        qkv: Tensor,
        q_gain: Tensor | None,
        k_gain: Tensor | None,
        cos: Tensor | None,
        sin: Tensor | None,
        nh: int,
        eps: float | None,
        r: int,
        pairing: str,
    ) -> tuple[Tensor, Tensor, Tensor]:
        # The arithmetic is in the compute dtype chosen here, whatever autocast would choose.
        with torch.autocast(qkv.device.type, enabled=False):
            B, T, heads, hs = qkv.shape  # heads = nh + 2 nkv
            nkv = (heads - nh) // 2
            H = nh + nkv  # q and k heads
            cd = compute_dtype(qkv.dtype)
            out = torch.empty(B, T, heads, hs, dtype=qkv.dtype, device=qkv.device)
            out[:, :, H:] = qkv[:, :, H:]  # v, copied through
            # Contiguous tensors of one dtype, in place where possible: broadcasts over short
            # rows and mixed dtypes cost several times a plain pass on a CPU.
            n = qkv[:, :, :H].to(cd, memory_format=torch.contiguous_format, copy=True)
            gain = r_inv = None
            if eps is not None:  # RMSNorm over hs: n = x r
                r_inv = inverse_rms(n, eps)  # (B, T, H, 1)
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
    def backward(ctx: Any, gq: Tensor, gk: Tensor, gv: Tensor) -> tuple[Tensor | None, ...]:
        with torch.autocast(gv.device.type, enabled=False):
            n, r_inv, gain, C, S = ctx.saved_tensors
            nh, nkv, r, pairing = ctx.shape
            B, T, H, hs = n.shape
            grad = torch.empty(B, T, H + nkv, hs, dtype=gv.dtype, device=gv.device)
            grad[:, :, H:] = gv
            gy = torch.empty_like(n)  # (B, T, H, hs), the compute dtype
            gy[:, :, :nh] = gq
            gy[:, :, nh:] = gk
            if C is not None and S is not None:  # the inverse rotation: gz * C - swap(gz) * S
                whole = (*C.shape[:-2], H, hs)  # (.., T, H, hs)
                gz, gy = gy, gy * C.expand(whole).contiguous()
                gy.addcmul_(_swap(gz, r, pairing), S.expand(whole).contiguous(), value=-1)
            g_q = g_k = None
            if r_inv is not None:
                gy, dgain = rms_backward(gy, n, r_inv, gain)
                if dgain is not None:
                    g_q, g_k = dgain[:nh].sum(0), dgain[nh:].sum(0)  # (hs,) each
            grad[:, :, :H] = gy
            return grad, g_q, g_k, None, None, None, None, None, None


def repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """Each key/value head (B, nkv, L, hs) repeated for the ``n_rep`` query heads it serves,
    Llama's order: query head j reads key/value head ``j // n_rep``.

    Example:
        >>> repeat_kv(torch.tensor([1.0, 2.0]).view(1, 2, 1, 1), 2).flatten().tolist()
        [1.0, 1.0, 2.0, 2.0]
    """
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1)


class ModernHeads(NamedTuple):
    """The modern block's heads part: nkv key/value heads, q and k normalised per head and
    rotated at their positions, each part None where the block has none. ``QKHeads`` computes
    it unless a module hook is to run or something watches the operators (a dispatch or
    function mode, such as ``gptblock check``'s trace, or a tensor subclass).

    Example:
        >>> from gptblock.blocks.rotary import apply_rotary
        >>> qkv = torch.randn(2, 5, 3 * 8)  # (B, T, (nh + 2 nkv) hs): one head each
        >>> q, k, v = ModernHeads(1, Rotary(8), None, None)(qkv, 1, 0, None)  # (B, 1, T, hs)
        >>> torch.allclose(q[:, 0], apply_rotary(qkv[..., :8], torch.arange(5)), atol=1e-6)
        True
        >>> torch.equal(v[:, 0], qkv[..., 16:])
        True
    """

    n_kv_heads: int  # nkv, dividing nh
    rotary: Rotary | None  # on q and k, at their positions
    q_norm: RMSNorm | None  # over each head's hs channels
    k_norm: RMSNorm | None

    def __call__(
        self, qkv: Tensor, nh: int, start: int, positions: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """q (B, nh, T, hs), k and v (B, nkv, T, hs), rotated at ``positions`` (or ``start ..``)."""
        B, T, rows = qkv.shape
        nkv, rotary, q_norm, k_norm = self
        hs = rows // (nh + 2 * nkv)
        if positions is None and rotary is not None:
            positions = torch.arange(start, start + T, device=qkv.device)  # (T,)
        if self._fast(qkv):
            eps = q_norm.eps if q_norm is not None else None
            gains = (
                (None, None) if q_norm is None or k_norm is None else (q_norm.weight, k_norm.weight)
            )
            cos = sin = None
            r, pairing = 0, "halves"
            if rotary is not None and positions is not None:
                r, pairing = rotary.rotary_dim, rotary.pairing
                cos, sin = cos_sin(positions, r, rotary.theta, compute_dtype(qkv.dtype))
            heads = qkv.view(B, T, nh + 2 * nkv, hs)
            q, k, v = QKHeads.apply(heads, *gains, cos, sin, nh, eps, r, pairing)  # type: ignore[no-untyped-call, unused-ignore]
            return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, nh | nkv, T, hs)
        q, k, v = torch.split(qkv, [nh * hs, nkv * hs, nkv * hs], dim=-1)
        q = q.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
        k, v = (t.view(B, T, nkv, hs).transpose(1, 2) for t in (k, v))  # (B, nkv, T, hs)
        if q_norm is not None and k_norm is not None:
            q, k = q_norm(q), k_norm(k)  # over hs, per head and position
        if rotary is not None and positions is not None:
            q, k = rotary(q, positions), rotary(k, positions)
        # The norm and the rotation compute in float32; under bfloat16 autocast q and k go back
        # to v's dtype, so that the attention's kernel is the plain path's: left in float32,
        # SDPA's CPU flash kernel made a training step twice as slow.
        return q.to(v.dtype), k.to(v.dtype), v

    def share(self, k: Tensor, v: Tensor, nh: int) -> tuple[Tensor, ...]:
        return repeat_kv(k, nh // self.n_kv_heads), repeat_kv(v, nh // self.n_kv_heads)

    def _fast(self, qkv: Tensor) -> bool:
        """Whether ``QKHeads`` computes what the modules would, no hook skipped, nothing watching."""
        watched = torch._C._len_torch_dispatch_stack() or torch._C._len_torch_function_stack()
        modules = [m for m in self[1:] if m is not None]
        if type(qkv) is not Tensor or watched:
            return False
        if any(m._forward_hooks or m._forward_pre_hooks for m in modules):
            return False
        q_norm, k_norm = self.q_norm, self.k_norm
        if q_norm is None or k_norm is None:
            return q_norm is k_norm  # neither
        return q_norm.eps == k_norm.eps
