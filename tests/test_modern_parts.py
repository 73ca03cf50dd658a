"""The modern block's parts alone (issue 20, item 2), and the invariances that prove them (item 3).

References are independent of gptblock: the formulas written out here, Meta's original rotary
code (complex multiplication of channel pairs), and Hugging Face's Llama modules.
"""

import numpy as np
import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama import modeling_llama as hf

from gptblock import (
    FusedBlock,
    GroupedQueryAttention,
    RMSNorm,
    Rotary,
    SwiGLU,
    apply_rotary,
    attention,
    rmsnorm,
    swiglu,
)
from gptblock.blocks.attention import ModernHeads, SelfAttention
from gptblock.blocks.parts import Dense
from gptblock.blocks.rotary import pairing_permutation

TIGHT = dict(rtol=0, atol=1e-12)  # float64, the same arithmetic in another order
# Hugging Face's LlamaRMSNorm and eager attention compute the norm and the softmax in float32
# whatever the input's dtype, so against them float64 agrees to float32's rounding only.
HF = dict(rtol=1e-6, atol=1e-6)


def test_rmsnorm_is_the_formula_with_eps_inside_the_root():
    x = np.random.default_rng(0).normal(size=(3, 5))
    w = np.random.default_rng(1).normal(size=5)
    expected = x / np.sqrt((x**2).mean(-1, keepdims=True) + 0.5) * w
    got = rmsnorm(torch.tensor(x), torch.tensor(w), eps=0.5).numpy()
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-14)
    # eps inside the root: [1, 1] with eps 3 is divided by sqrt(1 + 3), not by 1 + 3
    assert rmsnorm(torch.ones(2, dtype=torch.float64), None, eps=3.0).tolist() == [0.5, 0.5]


def test_rmsnorm_module_equals_hugging_faces():
    torch.manual_seed(0)
    theirs = hf.LlamaRMSNorm(8, eps=1e-6).double()
    theirs.weight.data.normal_()
    ours = RMSNorm(8, eps=1e-6).double()
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    torch.testing.assert_close(ours(x), theirs(x), **HF)
    assert not torch.allclose(rmsnorm(x, ours.weight, 1e-6), rmsnorm(x, None, 1e-6))


def hf_cos_sin(positions, hs, theta):
    inv_freq = 1.0 / theta ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs)
    freqs = positions[:, None].double() * inv_freq  # (T, hs/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (T, hs): Hugging Face's layout
    return emb.cos()[None], emb.sin()[None]  # (1, T, hs)


@pytest.mark.parametrize("theta", [10000.0, 500000.0])
def test_halves_pairing_equals_hugging_faces_rotary(theta):
    torch.manual_seed(0)
    q, k = (
        torch.randn(2, 4, 6, 8, dtype=torch.float64),
        torch.randn(2, 4, 6, 8, dtype=torch.float64),
    )
    positions = torch.arange(3, 9)  # an offset, as after a cache
    cos, sin = hf_cos_sin(positions, 8, theta)
    q_hf, k_hf = hf.apply_rotary_pos_emb(q, k, cos, sin)
    torch.testing.assert_close(apply_rotary(q, positions, theta), q_hf, rtol=0, atol=1e-12)
    torch.testing.assert_close(apply_rotary(k, positions, theta), k_hf, rtol=0, atol=1e-12)


def test_adjacent_pairing_equals_metas_complex_rotary():
    """Meta's Llama: channel pairs (2i, 2i + 1) as complex numbers times exp(i pos freq_i)."""
    torch.manual_seed(0)
    x = torch.randn(1, 2, 5, 8, dtype=torch.float64)
    positions = torch.arange(5)
    freqs = 1.0 / 10000.0 ** (torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    rotation = torch.polar(torch.ones(5, 4, dtype=torch.float64), positions[:, None] * freqs)
    expected = torch.view_as_real(torch.view_as_complex(x.reshape(1, 2, 5, 4, 2)) * rotation)
    got = apply_rotary(x, positions, pairing="adjacent")
    torch.testing.assert_close(got, expected.flatten(-2), rtol=0, atol=1e-12)


def test_partial_rotation_leaves_the_other_channels():
    x = torch.randn(1, 1, 4, 8, dtype=torch.float64)
    positions = torch.arange(4)
    got = apply_rotary(x, positions, rotary_dim=4)
    assert torch.equal(got[..., 4:], x[..., 4:])
    torch.testing.assert_close(got[..., :4], apply_rotary(x[..., :4], positions), **TIGHT)
    assert torch.equal(apply_rotary(x, positions, rotary_dim=0), x)
    per_batch = torch.stack([positions, positions + 2])  # (B, T) positions
    y = torch.randn(2, 3, 4, 8, dtype=torch.float64)
    torch.testing.assert_close(
        apply_rotary(y, per_batch)[1], apply_rotary(y[1], positions + 2), **TIGHT
    )


def test_rope_scores_depend_only_on_the_distance():
    torch.manual_seed(0)
    q, k = torch.randn(8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    rope = Rotary(8, rotary_dim=6)

    def score(m, n):
        return rope(q[None], torch.tensor([m])) @ rope(k[None], torch.tensor([n])).T

    for m, n in [(5, 2), (9, 9), (1, 7)]:
        for shift in (1, 13, 400):
            torch.testing.assert_close(score(m + shift, n + shift), score(m, n), **TIGHT)
    assert not torch.allclose(score(5, 2), score(5, 3))  # and it does depend on the distance


def test_swiglu_module_equals_hugging_faces_mlp():
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=8, intermediate_size=12, num_attention_heads=2, hidden_act="silu"
    )
    theirs = hf.LlamaMLP(config).double()
    ours = SwiGLU(8, 12).double()
    ours.load_state_dict(theirs.state_dict())  # gate_proj, up_proj, down_proj
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    torch.testing.assert_close(ours(x), theirs(x), **TIGHT)
    w1, w2, w3 = theirs.gate_proj.weight, theirs.down_proj.weight, theirs.up_proj.weight
    expected = (torch.nn.functional.silu(x @ w1.T) * (x @ w3.T)) @ w2.T
    torch.testing.assert_close(swiglu(x, w1, w2, w3), expected, **TIGHT)


@pytest.mark.parametrize("n_kv", [4, 2, 1])
def test_grouped_query_attention_equals_hugging_faces_llama_attention(n_kv):
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=16, num_attention_heads=4, num_key_value_heads=n_kv, attention_bias=False
    )
    config._attn_implementation = "eager"
    theirs = hf.LlamaAttention(config, layer_idx=0).double().eval()
    ours = GroupedQueryAttention(16, 4, n_kv).double()
    ours.load_state_dict(theirs.state_dict())
    T = 6
    x = torch.randn(2, T, 16, dtype=torch.float64)
    cos, sin = hf_cos_sin(torch.arange(T), 4, 10000.0)
    causal = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)[None, None]
    expected, _ = theirs(x, position_embeddings=(cos, sin), attention_mask=causal)
    torch.testing.assert_close(ours(x), expected, **HF)


def test_attention_function_with_a_mask_and_an_offset():
    torch.manual_seed(0)
    q = torch.randn(1, 4, 2, 8, dtype=torch.float64)  # the last 2 of 5 positions
    k, v = (
        torch.randn(1, 2, 5, 8, dtype=torch.float64),
        torch.randn(1, 2, 5, 8, dtype=torch.float64),
    )
    kr, vr = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    scores = q @ kr.transpose(-2, -1) / 8**0.5
    blocked = torch.tensor([[False, True, False, False, True], [False, True, False, False, False]])
    expected = scores.masked_fill(blocked, float("-inf")).softmax(-1) @ vr
    torch.testing.assert_close(attention(q, k, v, blocked, causal=False), expected, **TIGHT)
    full = torch.randn(1, 4, 5, 8, dtype=torch.float64)
    torch.testing.assert_close(
        attention(full, k, v)[:, :, 3:], attention(full[:, :, 3:], k, v), **TIGHT
    )


# --- invariances (item 3) ---------------------------------------------------------------------


def block(seed=0, **options):
    torch.manual_seed(seed)
    return FusedBlock(16, 4, **options).double().eval()


def test_gqa_with_as_many_kv_heads_as_heads_is_mha():
    torch.manual_seed(0)
    w, o = torch.randn(48, 16, dtype=torch.float64), torch.randn(16, 16, dtype=torch.float64)
    h = torch.randn(2, 5, 16, dtype=torch.float64)
    mha = SelfAttention(Dense(w, None), Dense(o, None), 4)(h)
    gqa = SelfAttention(Dense(w, None), Dense(o, None), 4, ModernHeads(4, None, None, None))(h)
    torch.testing.assert_close(gqa, mha, **TIGHT)


def test_gqa_is_mha_with_each_key_value_head_repeated():
    grouped = block(n_kv_heads=2)
    mha = block()
    state = grouped.state_dict()
    w = state["self_attn.in_proj_weight"]  # rows: q (16), k (2 heads x 4), v (2 heads x 4)
    q, k, v = w[:16], w[16:24], w[24:32]
    repeat = lambda t: t.view(2, 4, 16).repeat_interleave(2, dim=0).reshape(16, 16)  # noqa: E731
    state["self_attn.in_proj_weight"] = torch.cat([q, repeat(k), repeat(v)])
    state["self_attn.in_proj_bias"] = torch.cat(
        [state["self_attn.in_proj_bias"][:16]]
        + [state["self_attn.in_proj_bias"][a:b].view(2, 4).repeat_interleave(2, 0).flatten()
           for a, b in ((16, 24), (24, 32))]
    )  # fmt: skip
    mha.load_state_dict(state)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    torch.testing.assert_close(grouped(x), mha(x), **TIGHT)


def test_rotary_dim_zero_is_no_positions():
    plain = block()
    rotary = block(rope=True, rotary_dim=0)
    rotary.load_state_dict(plain.state_dict())
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    torch.testing.assert_close(rotary(x), plain(x), **TIGHT)


def test_the_two_pairings_are_one_model_after_permuting_q_and_k():
    adjacent = block(rope=True, rope_pairing="adjacent", rotary_dim=2 * 1 + 2)
    halves = block(rope=True, rope_pairing="halves", rotary_dim=4)
    state = adjacent.state_dict()
    perm = pairing_permutation(4, 4)
    rows = torch.cat([head * 4 + perm for head in range(8)])  # q's 4 heads, then k's 4
    w = state["self_attn.in_proj_weight"]
    state["self_attn.in_proj_weight"] = torch.cat([w[:32][rows], w[32:]])
    b = state["self_attn.in_proj_bias"]
    state["self_attn.in_proj_bias"] = torch.cat([b[:32][rows], b[32:]])
    halves.load_state_dict(state)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    torch.testing.assert_close(halves(x), adjacent(x), rtol=0, atol=1e-12)
    assert not torch.allclose(block(rope=True, rope_pairing="halves")(x), adjacent(x))


def test_the_blocks_packed_attention_is_grouped_query_attention():
    fused = block(bias=False, n_kv_heads=2, rope=True, qk_norm=True)
    alone = GroupedQueryAttention(16, 4, 2, qk_norm=True, norm_eps=1e-5).double()
    w = fused.self_attn.in_proj_weight
    alone.load_state_dict(
        {
            "q_proj.weight": w[:16],
            "k_proj.weight": w[16:24],
            "v_proj.weight": w[24:],
            "o_proj.weight": fused.self_attn.out_proj.weight,
            "q_norm.weight": fused.self_attn.q_norm.weight,
            "k_norm.weight": fused.self_attn.k_norm.weight,
        }
    )
    h = torch.randn(2, 5, 16, dtype=torch.float64)
    torch.testing.assert_close(fused.self_attn(h), alone(h), rtol=0, atol=1e-12)


def test_under_bfloat16_autocast_the_rotated_queries_and_keys_keep_the_values_dtype():
    """The norm and rotation compute in float32; q and k must come back in v's dtype, or the
    attention runs in float32 by SDPA's CPU flash kernel (a training step twice as slow)."""
    from gptblock.blocks.fused import FusedBlock

    block = FusedBlock(32, 4, norm="rmsnorm", n_kv_heads=2, qk_norm=True, rope=True)
    h = torch.randn(2, 5, 32)
    attn = block.self_attn
    with torch.autocast("cpu", dtype=torch.bfloat16):
        q, k, v = attn.project(h)  # attention_weights' path
        q2, k2, v2 = attn.heads(attn.in_proj(h), 4, 0, None)  # forward's path
        y = block(h)
    assert v.dtype == v2.dtype == torch.bfloat16
    assert q.dtype == k.dtype == q2.dtype == k2.dtype == torch.bfloat16, (q.dtype, q2.dtype)
    assert torch.isfinite(y).all()
