"""gptblock.model.generation and the one forward it runs: the cached path equals recomputing.

The references are independent of the code under test: each block form's own ``forward`` (the
lesson's code, ``nn.MultiheadAttention``), and ``GPT.forward`` on the whole context.
"""

import functools

import pytest
import torch

from gptblock import GPT, FusedBlock, GPTConfig, KVCache, TransformerBlock, lesson
from gptblock.blocks.convert import parts_of
from gptblock.blocks.fused import block_forward
from gptblock.blocks.probe import BLOCK_POINTS
from gptblock.model.generation.decode import Decoder, _relaid
from gptblock.model.generation.matvec import RowLinear

TOL64 = dict(atol=1e-12, rtol=0)


def blocks(dtype=torch.float64):
    torch.manual_seed(0)
    made = {
        "fused": FusedBlock(16, 4, activation="gelu_tanh"),
        "mha": TransformerBlock(16, 4),
        "lesson": lesson.Block(16, 4, block_size=12, dropout=0.0),
    }
    for block in made.values():
        with torch.no_grad():
            for p in block.parameters():  # nonzero biases, gains away from 1
                p.add_(torch.randn_like(p) * 0.3)
    return {name: b.to(dtype).eval() for name, b in made.items()}


@pytest.mark.parametrize("form", ["fused", "mha", "lesson"])
def test_the_fused_forward_on_any_forms_weights_is_that_forms_function(form):
    block = blocks()[form]
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    torch.testing.assert_close(block_forward(parts_of(block), x), block(x), **TOL64)


@pytest.mark.parametrize("form", ["fused", "mha", "lesson"])
def test_prefill_then_one_position_steps_equal_the_forms_own_forward(form):
    block = blocks()[form]
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    parts = parts_of(block)
    laid_out = _relaid(parts, RowLinear)  # what GPT.generate's one-token steps run on
    assert isinstance(laid_out.attn.in_proj, RowLinear) and isinstance(
        laid_out.mlp.linear2, RowLinear
    )
    step = functools.partial(block_forward, laid_out)
    cache = KVCache(2, 4, max_len=12, head_size=4, dtype=torch.float64)
    out = [block_forward(parts, x[:, :5], kv_cache=cache)]  # prefill 5
    out += [step(x[:, t : t + 1], kv_cache=cache) for t in range(5, 9)]  # 4 steps
    # The steps' products are summed in another order (RowLinear): equal to rounding.
    torch.testing.assert_close(torch.cat(out, dim=1), block(x), **TOL64)
    assert cache.length == 9


@pytest.mark.parametrize("form", ["fused", "mha", "lesson"])
def test_cached_logits_equal_the_forward_on_the_whole_context(form):
    activation = "relu" if form == "lesson" else "gelu"
    torch.manual_seed(1)
    model = GPT(GPTConfig(13, 10, 2, 2, 16, block=form, activation=activation)).double().eval()
    idx = torch.randint(0, 13, (3, 10))
    decoder = Decoder(model)
    with torch.no_grad():
        got = [decoder.prefill(idx[:, :4])]
        got += [decoder.step(idx[:, t : t + 1]) for t in range(4, 10)]
        torch.testing.assert_close(torch.cat(got, dim=1), model(idx).logits, **TOL64)


def test_the_probe_sees_every_point_in_order_and_none_without_it():
    block = blocks()["fused"]
    seen = []

    class Recording:
        def wants(self, name):
            return True

        def point(self, name, x):
            seen.append(name)
            return x

    x = torch.randn(1, 4, 16, dtype=torch.float64)
    torch.testing.assert_close(block(x, probe=Recording()), block(x), **TOL64)
    assert seen == list(BLOCK_POINTS)


def test_module_hooks_on_a_fused_blocks_parts_still_fire():
    block = blocks()["fused"]
    fired = []
    for name in ("norm1", "self_attn", "norm2", "linear1", "linear2"):
        getattr(block, name).register_forward_hook(lambda m, i, o, name=name: fired.append(name))
    block(torch.randn(1, 3, 16, dtype=torch.float64))
    assert fired == ["norm1", "self_attn", "norm2", "linear1", "linear2"]


def test_dropout_is_applied_in_training_and_not_with_a_probe():
    torch.manual_seed(0)
    block = FusedBlock(16, 2, dropout=0.5).double().train()
    x = torch.randn(2, 6, 16, dtype=torch.float64)

    class Passing:
        def wants(self, name):
            return False

        def point(self, name, x):
            return x

    assert not torch.equal(block(x), block(x))  # two draws
    torch.testing.assert_close(block(x, probe=Passing()), block.eval()(x), **TOL64)
