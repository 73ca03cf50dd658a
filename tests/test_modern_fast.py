"""The modern parts' hand-written backwards (issue 22): ``QKHeads`` and ``RMSNormFunction``.

Each is held to float64 ``gradcheck`` (finite differences, independent of the hand-written
backward), and the attention's fast path to the module chain it replaces (``RMSNorm`` then
``Rotary`` as separate modules, autograd's own backward), forward and backward.
"""

import pytest
import torch

from gptblock import FusedBlock
from gptblock.blocks.norms import rmsnorm
from gptblock.blocks.qk_heads import QKHeads
from gptblock.blocks.rotary import cos_sin

CASES = [  # eps, gains, rope, rotary_dim, pairing, per-batch positions
    (1e-5, True, True, 6, "halves", False),
    (0.1, True, True, 4, "adjacent", True),
    (1e-5, False, True, 6, "halves", False),
    (None, False, True, 2, "halves", True),
    (0.5, True, False, 0, "halves", False),
    (0.5, False, False, 0, "halves", False),
]


@pytest.mark.parametrize(("eps", "gains", "rope", "r", "pairing", "per_batch"), CASES)
def test_qk_heads_gradcheck_in_float64(eps, gains, rope, r, pairing, per_batch):
    g = torch.Generator().manual_seed(0)
    B, T, nh, nkv, hs = 2, 3, 2, 1, 6  # grouped: two query heads share a key/value head
    qkv = torch.randn(B, T, nh + 2 * nkv, hs, dtype=torch.float64, generator=g)
    q_gain = torch.randn(hs, dtype=torch.float64, generator=g) if gains else None
    k_gain = torch.randn(hs, dtype=torch.float64, generator=g) if gains else None
    pos = torch.randint(0, 50, (B, T), generator=g) if per_batch else torch.arange(5, 5 + T)
    cos, sin = cos_sin(pos, r, 100.0, torch.float64) if rope else (None, None)

    def f(qkv, q_gain, k_gain):
        return QKHeads.apply(qkv, q_gain, k_gain, cos, sin, nh, eps, r, pairing)

    inputs = [t.requires_grad_() if t is not None else None for t in (qkv, q_gain, k_gain)]
    assert torch.autograd.gradcheck(f, tuple(inputs), atol=1e-8, rtol=1e-6)


@pytest.mark.parametrize("weight", [True, False])
def test_rmsnorm_gradcheck_in_float64(weight):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 5, dtype=torch.float64, generator=g).requires_grad_()
    w = torch.randn(5, dtype=torch.float64, generator=g).requires_grad_() if weight else None
    assert torch.autograd.gradcheck(lambda x, w: rmsnorm(x, w, 0.1), (x, w))


def _chain(block: FusedBlock, h: torch.Tensor):
    """q and k by the modules one after the other, as before issue 22's fast path."""
    attn = block.self_attn
    B, T, C = h.shape
    nh, hs = attn.n_heads, C // attn.n_heads
    q, k, _ = torch.split(attn.in_proj(h), [C, C, C], dim=-1)
    q, k = (t.view(B, T, nh, hs).transpose(1, 2) for t in (q, k))  # (B, nh, T, hs)
    q, k = attn.q_norm(q), attn.k_norm(k)
    pos = torch.arange(T)
    return attn.rotary(q, pos), attn.rotary(k, pos)


@pytest.mark.parametrize("pairing", ["halves", "adjacent"])
@pytest.mark.parametrize("rotary_dim", [None, 4])
def test_fast_path_equals_the_module_chain(pairing, rotary_dim):
    torch.manual_seed(0)
    block = FusedBlock(
        16, 2, norm="rmsnorm", qk_norm=True, rope=True, rope_pairing=pairing,
        rotary_dim=rotary_dim,
    ).double()  # fmt: skip
    with torch.no_grad():  # gains away from 1, so that their gradient and their place matter
        block.self_attn.q_norm.weight.normal_()
        block.self_attn.k_norm.weight.normal_()
    h = torch.randn(3, 5, 16, dtype=torch.float64)
    fast_q, fast_k, _ = block.self_attn.project(h)
    q, k = _chain(block, h)
    torch.testing.assert_close(fast_q, q, rtol=0, atol=1e-12)
    torch.testing.assert_close(fast_k, k, rtol=0, atol=1e-12)
    w = torch.randn_like(q)
    params = [block.self_attn.in_proj_weight, block.self_attn.q_norm.weight]
    fast = torch.autograd.grad(((fast_q + fast_k) * w).sum(), params)
    chain = torch.autograd.grad(((q + k) * w).sum(), params)
    for a, b in zip(fast, chain, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_fast_path_in_bfloat16_autocast_is_the_chain_to_bfloat16_rounding():
    torch.manual_seed(0)
    block = FusedBlock(64, 2, norm="rmsnorm", qk_norm=True, rope=True)
    x = torch.randn(4, 16, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fast_q, fast_k, v = block.self_attn.project(x)
        q, k = _chain(block, x)
    assert fast_q.dtype == fast_k.dtype == v.dtype == torch.bfloat16
    # bfloat16 has 8 bits of mantissa: q and k are about 1 in size after the norm.
    torch.testing.assert_close(fast_q.float(), q.float(), rtol=0, atol=2**-6)
    torch.testing.assert_close(fast_k.float(), k.float(), rtol=0, atol=2**-6)


def test_a_hook_on_the_norm_still_runs():
    block = FusedBlock(16, 2, norm="rmsnorm", qk_norm=True, rope=True)
    seen = []
    block.self_attn.q_norm.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    block(torch.randn(1, 4, 16))
    assert seen == [torch.Size([1, 2, 4, 8])]
