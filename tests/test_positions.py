"""Explicit token positions (issue 20, item 1): a block with rotary positions and the GPT take the
tokens' positions, (T,) or (B, T), so an offset and a KV cache filled elsewhere compute what a
full pass does. Held against the NumPy oracle (``gptblock.reference.modern``) in float64."""

import numpy as np
import pytest
import torch

from gptblock import GPT, FusedBlock, GPTConfig, KVCache
from gptblock.errors import UserTypeError, UserValueError
from gptblock.model.generation.decode import Decoder
from gptblock.reference.modern import ModernOptions, modern_forward

C, NH, NKV, T = 16, 4, 2, 10
ROPE = [
    {"rope_pairing": "halves"},
    {"rope_pairing": "adjacent", "rotary_dim": 2, "rope_theta": 50.0},
]


def _block(seed=0, **rope):
    torch.manual_seed(seed)
    block = FusedBlock(C, NH, n_kv_heads=NKV, rope=True, norm="rmsnorm", mlp="swiglu", d_ff=24,
                       **rope).double().eval()  # fmt: skip
    with torch.no_grad():  # weights large enough that every angle shows in the output
        for p in block.parameters():
            p.normal_(0.0, 0.5)
    return block


def _oracle(block, x, positions):
    c = block.config
    o = ModernOptions(n_head=NH, n_kv_head=NKV, norm="rmsnorm", mlp="swiglu", position="rope",
                      rotary_dim=c.rotary_dim, rope_theta=c.rope_theta, rope_pairing=c.rope_pairing)  # fmt: skip
    params = {k: v.detach().numpy() for k, v in block.state_dict().items()}
    return torch.from_numpy(modern_forward(params, x.numpy(), o, positions.numpy())[0])


@pytest.mark.parametrize("rope", ROPE)
def test_a_cache_of_five_then_positions_five_to_nine_is_the_full_pass_and_the_oracle(rope):
    block = _block(**rope)
    x = torch.randn(2, T, C, dtype=torch.float64)
    with torch.no_grad():
        full = block(x, positions=torch.arange(T))
        assert torch.equal(full, block(x))  # the default positions are 0 .. T-1
        cache = KVCache(2, NKV, 16, C // NH, dtype=torch.float64)
        block(x[:, :5], kv_cache=cache, positions=torch.arange(5))
        tail = block(x[:, 5:], kv_cache=cache, positions=torch.arange(5, T))
    torch.testing.assert_close(tail, full[:, 5:], rtol=0, atol=1e-12)
    torch.testing.assert_close(full, _oracle(block, x, torch.arange(T)), rtol=0, atol=1e-10)


@pytest.mark.parametrize("rope", ROPE)
def test_an_offset_without_a_cache_rotates_as_the_oracle_and_per_sequence(rope):
    block = _block(1, **rope)
    x = torch.randn(2, 5, C, dtype=torch.float64)
    offset = torch.arange(5, 10)
    with torch.no_grad():
        y = block(x, positions=offset)
        assert (y - block(x)).abs().max() < 1e-9  # attention sees distances only (RoPE)
        rows = torch.stack([torch.arange(3, 8), torch.tensor([0, 2, 4, 6, 8])])  # (B, T)
        both = block(x, positions=rows)
    torch.testing.assert_close(y, _oracle(block, x, offset), rtol=0, atol=1e-10)
    torch.testing.assert_close(both, _oracle(block, x, rows), rtol=0, atol=1e-10)
    spread = _oracle(block, x[1:], rows[1])
    torch.testing.assert_close(both[1:], spread, rtol=0, atol=1e-10)
    assert (both[1:] - block(x[1:])).abs().max() > 1e-3  # positions 0, 2, 4.. are not 0, 1, 2..


def _gpt(position, seed=0):
    torch.manual_seed(seed)
    config = GPTConfig(vocab_size=13, block_size=16, n_layer=2, n_head=NH, n_embd=C,
                       position=position)  # fmt: skip
    model = GPT(config).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model


def test_the_gpts_learned_positions_read_the_rows_named():
    model = _gpt("learned")
    idx = torch.randint(0, 13, (2, 5))
    with torch.no_grad():
        y = model(idx, positions=torch.arange(5, 10)).logits
        shifted = _gpt("learned")
        shifted.wpe.weight[:5] = model.wpe.weight[5:10]  # rows 5..9 where 0..4 are read
        torch.testing.assert_close(y, shifted(idx).logits, rtol=0, atol=1e-12)
        assert (y - model(idx).logits).abs().max() > 1e-3


@pytest.mark.parametrize("position", ["learned", "rope"])
def test_the_gpt_with_a_cache_of_five_then_positions_five_to_nine_is_the_full_pass(position):
    model = _gpt(position, 2)
    idx = torch.randint(0, 13, (2, T))
    with torch.no_grad():
        full = model(idx, positions=torch.arange(T)).logits
        decoder = Decoder(model)
        decoder.prefill(idx[:, :5])
        tail = model._run(idx[:, 5:], decoder.prefill_parts, caches=decoder.caches,
                          positions=torch.arange(5, T))  # fmt: skip
    torch.testing.assert_close(tail, full[:, 5:], rtol=0, atol=1e-10)


def test_the_rotary_gpt_depends_on_distances_only():
    model = _gpt("rope", 3)
    idx = torch.randint(0, 13, (2, 6))
    with torch.no_grad():
        rows = torch.stack([torch.arange(100, 106), torch.arange(6)])
        torch.testing.assert_close(model(idx, positions=rows).logits, model(idx).logits,
                                   rtol=0, atol=1e-9)  # fmt: skip


@pytest.mark.parametrize("positions, error, message", [
    (torch.arange(4), UserValueError, r"positions must have shape \(5,\) or \(2, 5\)"),
    (torch.arange(5.0), UserTypeError, "integer positions, got torch.float32"),
    ([0, 1, 2, 3, 4], UserTypeError, "integer positions, got list"),
    (torch.tensor([-1, 0, 1, 2, 3]), UserValueError, r"positions must be in >= 0, got -1"),
])  # fmt: skip
def test_positions_that_are_not_positions_are_refused(positions, error, message):
    with pytest.raises(error, match=message):
        _block()(torch.zeros(2, 5, C, dtype=torch.float64), positions=positions)


def test_positions_go_where_they_mean_something():
    with pytest.raises(UserValueError, match=r"no rotary positions \(position='learned'\)"):
        FusedBlock(C, NH)(torch.zeros(1, 3, C), positions=torch.arange(3))
    with pytest.raises(UserValueError, match=r"positions must be in \[0, 16\), got 16"):
        _gpt("learned")(torch.zeros(1, 3, dtype=torch.long), positions=torch.arange(14, 17))
    _gpt("none")(torch.zeros(1, 3, dtype=torch.long), positions=torch.arange(100, 103))


def test_the_oracles_positions_default_to_0_to_t():
    block = _block()
    x = torch.randn(1, 4, C, dtype=torch.float64)
    params = {k: v.detach().numpy() for k, v in block.state_dict().items()}
    o = ModernOptions(n_head=NH, n_kv_head=NKV, norm="rmsnorm", mlp="swiglu", position="rope")
    default = modern_forward(params, x.numpy(), o)[0]
    np.testing.assert_array_equal(default, modern_forward(params, x.numpy(), o, np.arange(4))[0])
