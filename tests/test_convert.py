"""convert(module, to): every direction, the same function, and a clear refusal where it cannot."""

import itertools

import pytest
import torch
import torch.nn as nn
from torch.nn import functional as F

from gptblock import ConversionError, FusedBlock, TransformerBlock, causal_mask, convert, lesson

FORMS = ("lesson", "mha", "fused", "encoder_layer")
CLASSES = {
    "lesson": lesson.Block,
    "mha": TransformerBlock,
    "fused": FusedBlock,
    "encoder_layer": nn.TransformerEncoderLayer,
}
BLOCK_SIZE = 8


def run(block, x):
    """Any form's block function: the encoder layer needs the causal mask passed in."""
    if isinstance(block, nn.TransformerEncoderLayer):
        T = x.shape[1]
        return block(x, src_mask=causal_mask(T), is_causal=True)
    return block(x)


def to(module, form):
    return (
        convert(module, form, block_size=BLOCK_SIZE) if form == "lesson" else convert(module, form)
    )


def randomize(module, seed=0):
    """Nonzero values everywhere (fresh blocks have zero biases), zero in_proj_bias kept."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name != "self_attn.in_proj_bias":
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.3 + ("norm" in name))
    return module


def lesson_block(dropout=0.0):
    torch.manual_seed(0)
    return randomize(lesson.Block(16, 2, BLOCK_SIZE, dropout=dropout)).double().eval()


@pytest.mark.parametrize("src,dst", list(itertools.product(FORMS, FORMS)))
def test_every_direction_computes_the_same_function(src, dst):
    source = to(lesson_block(), src)
    x = torch.randn(3, 6, 16, dtype=torch.float64)
    target = to(source, dst)
    assert type(target) is CLASSES[dst]
    with torch.no_grad():
        torch.testing.assert_close(run(target, x), run(source, x), atol=1e-12, rtol=0)


def test_round_trips_are_bit_exact():
    block = lesson_block()
    for path in itertools.permutations(("mha", "fused", "encoder_layer")):
        m = block
        for form in (*path, "lesson"):
            m = to(m, form)
        for (name, a), (_, b) in zip(
            block.state_dict().items(), m.state_dict().items(), strict=True
        ):
            assert torch.equal(a, b), (path, name)


def test_the_new_module_shares_nothing_and_keeps_dtype_device_and_mode():
    block = FusedBlock(16, 2, dropout=0.25, activation="relu", norm_eps=1e-6).double().train()
    for form in ("mha", "fused", "encoder_layer"):
        new = convert(block, form)
        assert new.training
        assert {p.dtype for p in new.parameters()} == {torch.float64}
        assert {p.device for p in new.parameters()} == {torch.device("cpu")}
        with torch.no_grad():
            next(new.parameters()).add_(1.0)
        assert not torch.equal(next(new.parameters()), next(block.parameters()))
    assert not convert(block.eval(), "mha").training


def test_dropout_activation_and_eps_are_carried_over():
    block = FusedBlock(16, 4, dropout=0.25, activation="relu", bias=False, norm_eps=1e-6)
    layer = convert(block, "encoder_layer")
    assert layer.activation is F.relu and layer.norm_first and layer.self_attn.batch_first
    assert layer.norm1.eps == layer.norm2.eps == 1e-6
    assert (
        layer.dropout.p == layer.dropout1.p == layer.dropout2.p == layer.self_attn.dropout == 0.25
    )
    assert layer.linear1.bias is None and layer.self_attn.num_heads == 4
    assert convert(layer, "mha").config == block.config
    lb = convert(lesson.Block(16, 4, 8, dropout=0.3), "fused")
    assert lb.config.dropout == 0.3 and lb.config.activation == "relu" and lb.config.bias
    assert {
        m.p for m in convert(lb, "lesson", block_size=8).modules() if isinstance(m, nn.Dropout)
    } == {0.3}


def test_in_eval_mode_dropout_changes_nothing_in_any_form():
    block = lesson_block(dropout=0.5)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    for form in FORMS:
        torch.testing.assert_close(run(to(block, form), x), block(x), atol=1e-12, rtol=0)


def test_a_bias_free_block_becomes_a_lesson_block_with_zero_biases():
    torch.manual_seed(3)
    block = randomize(FusedBlock(16, 2, activation="relu", bias=False)).double()
    new = convert(block, "lesson", block_size=8)
    biases = [p for n, p in new.named_parameters() if n.endswith("bias")]
    assert len(biases) == 5 and all(torch.equal(b, torch.zeros_like(b)) for b in biases)
    x = torch.randn(2, 8, 16, dtype=torch.float64)
    torch.testing.assert_close(new(x), block(x), atol=1e-12, rtol=0)


def test_the_lesson_block_size_defaults_to_the_source_lessons():
    assert convert(lesson.Block(16, 2, 12), "lesson").block_size == 12
    assert convert(lesson.Block(16, 2, 12), "lesson", block_size=4).block_size == 4


# --- refusals --------------------------------------------------------------------------------


def refuses(module, form, match, **kw):
    with pytest.raises(ConversionError, match=match):
        convert(module, form, **kw)


def test_conversion_error_is_a_value_error():
    assert issubclass(ConversionError, ValueError)


def test_refuses_what_the_lesson_block_cannot_compute():
    relu = FusedBlock(16, 2, activation="relu")
    with torch.no_grad():
        relu.self_attn.in_proj_bias[20] = 0.5  # a key bias
    refuses(relu, "lesson", "query/key/value Linears have no bias", block_size=8)
    refuses(FusedBlock(16, 2), "lesson", "uses ReLU, this block uses 'gelu'", block_size=8)
    refuses(
        TransformerBlock(16, 2, activation="relu", norm_eps=1e-6),
        "lesson",
        "eps 1e-05, this block 1e-06",
        block_size=8,
    )


def test_refuses_encoder_layers_that_are_not_this_block():
    def layer(**kw):
        args = dict(dropout=0.0, activation="gelu", batch_first=True, norm_first=True)
        return nn.TransformerEncoderLayer(16, 2, kw.pop("d_ff", 64), **(args | kw))

    refuses(layer(norm_first=False), "fused", "post-norm")
    refuses(layer(batch_first=False), "fused", "batch_first=False")
    refuses(layer(d_ff=32), "fused", "dim_feedforward=32")
    refuses(layer(activation=nn.SiLU()), "mha", "activation")
    refuses(layer(activation=torch.sigmoid), "mha", "activation")
    odd = layer()
    odd.norm2.eps = 1e-3
    refuses(odd, "fused", "different eps")
    odd = layer()
    odd.dropout1.p = 0.1
    refuses(odd, "fused", "dropouts differ")
    odd = layer()
    odd.linear1.bias = None
    refuses(odd, "fused", "some of its layers have biases")
    assert convert(layer(activation=nn.ReLU()), "fused").config.activation == "relu"


def test_refuses_a_lesson_block_whose_dropouts_were_changed():
    block = lesson.Block(16, 2, 8, dropout=0.1)
    block.sa.dropout.p = 0.3
    refuses(block, "fused", r"different probabilities \[0.1, 0.3\]")


def test_bad_arguments():
    with pytest.raises(ValueError, match="to must be one of"):
        convert(FusedBlock(16, 2), "gpt2")
    with pytest.raises(ValueError, match="needs block_size=N"):
        convert(FusedBlock(16, 2, activation="relu"), "lesson")
    with pytest.raises(ValueError, match="block_size applies only to to='lesson'"):
        convert(FusedBlock(16, 2), "mha", block_size=8)
    with pytest.raises(TypeError, match="got Linear"):
        convert(nn.Linear(4, 4), "fused")
