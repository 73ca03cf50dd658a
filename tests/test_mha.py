"""TransformerBlock is nn.TransformerEncoderLayer(norm_first=True), on a causal mask."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gptblock import TransformerBlock, causal_mask
from gptblock.blocks.config import ACTIVATIONS, activation_function, activation_name
from gptblock.blocks.masks import masked_softmax, split_dead_rows

CASES = [  # (d_model, n_heads, activation, bias)
    (16, 2, "gelu", True),
    (32, 4, "relu", True),
    (24, 3, "gelu", False),
    (8, 1, "relu", False),
]


def encoder_layer(d_model, n_heads, activation, bias, dropout=0.0, eps=1e-5):
    return nn.TransformerEncoderLayer(
        d_model,
        n_heads,
        4 * d_model,
        dropout=dropout,
        activation=activation,
        layer_norm_eps=eps,
        batch_first=True,
        norm_first=True,
        bias=bias,
    )


def run_layer(layer, x):
    T = x.shape[1]
    return layer(x, src_mask=causal_mask(T), is_causal=True)


@pytest.mark.parametrize("d_model,n_heads,activation,bias", CASES)
def test_state_dict_loads_both_ways_and_outputs_agree_in_train_mode(
    d_model, n_heads, activation, bias
):
    torch.manual_seed(0)
    block = TransformerBlock(d_model, n_heads, activation=activation, bias=bias)
    layer = encoder_layer(d_model, n_heads, activation, bias)
    layer.load_state_dict(block.state_dict(), strict=True)
    x = torch.randn(3, 7, d_model, requires_grad=True)
    y_block, y_layer = block(x), run_layer(layer, x)
    torch.testing.assert_close(y_block, y_layer, atol=1e-5, rtol=0)
    # and back: a fresh block takes the layer's weights
    block2 = TransformerBlock(d_model, n_heads, activation=activation, bias=bias)
    block2.load_state_dict(layer.state_dict(), strict=True)
    torch.testing.assert_close(block2(x), y_layer, atol=1e-5, rtol=0)


@pytest.mark.parametrize("d_model,n_heads,activation,bias", CASES)
def test_outputs_agree_with_the_encoder_layer_fast_path(d_model, n_heads, activation, bias):
    # eval + no_grad lets nn.TransformerEncoderLayer take its fused "fast path".
    torch.manual_seed(1)
    block = TransformerBlock(d_model, n_heads, activation=activation, bias=bias).eval()
    layer = encoder_layer(d_model, n_heads, activation, bias).eval()
    layer.load_state_dict(block.state_dict(), strict=True)
    x = torch.randn(4, 9, d_model)
    with torch.no_grad():
        torch.testing.assert_close(block(x), run_layer(layer, x), atol=1e-5, rtol=0)


def test_gradients_agree_with_the_encoder_layer():
    torch.manual_seed(2)
    block = TransformerBlock(16, 2).double()
    layer = encoder_layer(16, 2, "gelu", True).double()
    layer.load_state_dict(block.state_dict())
    x = torch.randn(2, 6, 16, dtype=torch.float64, requires_grad=True)
    (gx_block,) = torch.autograd.grad(block(x).square().sum(), x)
    (gx_layer,) = torch.autograd.grad(run_layer(layer, x).square().sum(), x)
    torch.testing.assert_close(gx_block, gx_layer, atol=1e-10, rtol=0)


def test_attribute_names_and_mha_settings():
    block = TransformerBlock(16, 2, dropout=0.1, norm_eps=1e-6)
    assert isinstance(block.self_attn, nn.MultiheadAttention)
    assert block.self_attn.batch_first
    assert block.self_attn.dropout == 0.1
    assert block.linear1.out_features == 64 and block.linear2.in_features == 64
    assert block.norm1.eps == block.norm2.eps == 1e-6
    keys = set(block.state_dict())
    assert keys == set(encoder_layer(16, 2, "gelu", True).state_dict())


def test_unknown_activation_lists_the_choices():
    with pytest.raises(
        ValueError,
        match=r"activation must be one of \('gelu', 'relu', 'gelu_tanh', 'relu2'\), got 'tanh'",
    ):
        TransformerBlock(16, 2, activation="tanh")


def test_activation_by_name_and_back():
    assert ACTIVATIONS == ("gelu", "relu", "gelu_tanh", "relu2")
    assert activation_function("gelu") is F.gelu and activation_function("relu") is F.relu
    with pytest.raises(
        ValueError, match=r"one of \('gelu', 'relu', 'gelu_tanh', 'relu2'\), got 'tanh'"
    ):
        activation_function("tanh")
    for name in ACTIVATIONS:
        assert activation_name(activation_function(name)) == name
    assert activation_name(nn.GELU()) == "gelu" and activation_name(nn.ReLU()) == "relu"
    # The tanh GELU (GPT-2's) is its own activation, ~1e-3 away from the exact one.
    assert activation_name(nn.GELU(approximate="tanh")) == "gelu_tanh"
    x = torch.linspace(-4, 4, 101, dtype=torch.float64)
    gap = (activation_function("gelu_tanh")(x) - F.gelu(x)).abs().max()
    assert 1e-4 < gap < 1e-3
    assert activation_name(torch.tanh) is None and activation_name("gelu") is None


def test_indivisible_heads():
    with pytest.raises(ValueError, match=r"d_model=10 is not divisible by n_heads=4"):
        TransformerBlock(10, 4)


@pytest.mark.parametrize("shape", [(5, 16), (2, 5, 8)])
def test_wrong_input_shape(shape):
    with pytest.raises(ValueError, match=r"expected input of shape \(B, T, 16\)"):
        TransformerBlock(16, 2)(torch.randn(*shape))


# --- causal_mask ------------------------------------------------------------------------------


def test_causal_mask_is_true_above_the_diagonal():
    m = causal_mask(4)
    assert m.dtype == torch.bool
    assert torch.equal(m, torch.triu(torch.ones(4, 4, dtype=torch.bool), diagonal=1))
    assert not m.diagonal().any()


def test_causal_mask_rejects_bad_lengths():
    with pytest.raises(ValueError, match="T must be a positive int, got 0"):
        causal_mask(0)


def test_causal_mask_docstring_states_both_conventions():
    doc = causal_mask.__doc__
    assert "may not attend" in doc and "scaled_dot_product_attention" in doc


# --- fully blocked rows (gptblock.blocks.masks) ------------------------------------------------------


def test_split_dead_rows_unblocks_exactly_the_dead_rows():
    blocked = torch.rand(3, 5, 5, generator=torch.Generator().manual_seed(0)) < 0.5
    blocked[0, 1] = True
    blocked[2] = True
    live, dead = split_dead_rows(blocked)
    assert dead.shape == (3, 5) and torch.equal(dead, blocked.all(dim=-1))
    assert dead[0, 1] and dead[2].all()
    assert not live.all(dim=-1).any()  # every row has a key left to attend to
    assert not live[dead].any()  # a dead row attends to every key
    assert torch.equal(live[~dead], blocked[~dead])  # the other rows are untouched


def test_masked_softmax_is_softmax_on_live_rows_and_zero_on_dead_ones():
    g = torch.Generator().manual_seed(1)
    scores = torch.randn(2, 3, 4, 4, generator=g, dtype=torch.float64)  # (B, nh, T, T)
    blocked = causal_mask(4).expand(2, 4, 4).clone()
    blocked[1, 2] = True  # one dead query row in sequence 1, for every head
    w = masked_softmax(scores, blocked)
    assert torch.isfinite(w).all() and torch.equal(w[1, :, 2], torch.zeros(3, 4))
    assert not w[blocked[:, None].expand_as(w)].any()  # blocked keys get weight 0
    expected = torch.softmax(scores.masked_fill(causal_mask(4), float("-inf")), dim=-1)
    expected[1, :, 2] = 0.0
    torch.testing.assert_close(w, expected, atol=0, rtol=0)


# --- optional masks ---------------------------------------------------------------------------


def test_key_padding_mask_blocks_keys_and_fully_blocked_rows_are_finite():
    torch.manual_seed(3)
    block = TransformerBlock(16, 2)
    x = torch.randn(2, 5, 16, requires_grad=True)
    kpm = torch.zeros(2, 5, dtype=torch.bool)
    kpm[0, :2] = True  # sequence 0 is left-padded by 2: its rows 0 and 1 see nothing
    y = block(x, key_padding_mask=kpm)
    assert torch.isfinite(y).all()
    y.sum().backward()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in block.parameters())
    w = block.attention_weights(x, key_padding_mask=kpm)
    assert torch.equal(w[0, :, :2], torch.zeros(2, 2, 5))  # dead rows: zero weights
    assert torch.equal(w[0, :, :, :2], torch.zeros(2, 5, 2))  # nobody attends to padding


def test_a_fully_blocked_row_gives_the_out_proj_bias():
    torch.manual_seed(4)
    block = TransformerBlock(16, 2).eval()
    x = torch.randn(1, 3, 16)
    kpm = torch.tensor([[True, False, False]])
    a = block._attend(block.norm1(x), None, kpm)
    torch.testing.assert_close(a[0, 0], block.self_attn.out_proj.bias, atol=0, rtol=0)


def test_padding_does_not_change_the_unpadded_rows():
    # Right-padding: the real tokens' outputs equal those of the unpadded sequence.
    torch.manual_seed(5)
    block = TransformerBlock(16, 2).double().eval()
    x = torch.randn(1, 6, 16, dtype=torch.float64)
    kpm = torch.tensor([[False] * 4 + [True] * 2])
    torch.testing.assert_close(
        block(x, key_padding_mask=kpm)[:, :4], block(x[:, :4]), atol=1e-12, rtol=0
    )


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        (
            {"attn_mask": torch.zeros(5, 5, dtype=torch.long)},
            TypeError,
            "attn_mask must be a torch.bool tensor.*got dtype torch.int64",
        ),
        (
            {"attn_mask": torch.zeros(4, 4, dtype=torch.bool)},
            ValueError,
            r"attn_mask must have shape \(T, T\) = \(5, 5\).*got \(4, 4\)",
        ),
        (
            {"key_padding_mask": torch.zeros(2, 5)},
            TypeError,
            "key_padding_mask must be a torch.bool tensor.*torch.float32",
        ),
        (
            {"key_padding_mask": torch.zeros(5, 2, dtype=torch.bool)},
            ValueError,
            r"key_padding_mask must have shape \(B, T\) = \(2, 5\), got \(5, 2\)",
        ),
    ],
)
def test_bad_masks_name_dtype_and_shape(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        TransformerBlock(16, 2)(torch.randn(2, 5, 16), **kwargs)


def test_extra_attn_mask_equals_the_encoder_layer_with_the_merged_mask():
    torch.manual_seed(6)
    block = TransformerBlock(16, 2).double()
    layer = encoder_layer(16, 2, "gelu", True).double()
    layer.load_state_dict(block.state_dict())
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    extra = torch.zeros(5, 5, dtype=torch.bool)
    extra[3, 1] = extra[4, 0] = True  # no row fully blocked: the diagonal stays open
    ours = block(x, attn_mask=extra)
    theirs = layer(x, src_mask=causal_mask(5) | extra)
    torch.testing.assert_close(ours, theirs, atol=1e-12, rtol=0)
