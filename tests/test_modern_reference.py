"""The modern block against the NumPy oracle (issue 20, item 3): forward and the hand-written
backward equal ``FusedBlock``'s forward and autograd's gradients, to 1e-10 in float64, for
every combination of the options."""

import dataclasses

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gptblock import BlockConfig, FusedBlock
from gptblock.blocks.config import applicable
from gptblock.reference.modern import ModernOptions, modern_backward, modern_forward

OPTIONS = st.fixed_dictionaries(
    {
        "norm": st.sampled_from(["layernorm", "rmsnorm"]),
        "mlp": st.sampled_from(["dense", "swiglu"]),
        "activation": st.sampled_from(["gelu", "relu", "gelu_tanh", "relu2"]),
        "d_ff": st.sampled_from([None, 20]),
        "n_kv_heads": st.sampled_from([4, 2, 1]),
        "qk_norm": st.booleans(),
        "parallel_residual": st.booleans(),
        "rope": st.booleans(),
        "rotary_dim": st.sampled_from([None, 2, 0]),
        "rope_pairing": st.sampled_from(["halves", "adjacent"]),
        "rope_theta": st.sampled_from([10000.0, 50.0]),
        "bias": st.booleans(),
    }
)


def oracle_options(config):
    # The oracle's options are BlockConfig's by name: every one of them is read across.
    return ModernOptions(
        **{f.name: getattr(config, f.name) for f in dataclasses.fields(ModernOptions)}
    )


@settings(max_examples=40, deadline=None)
@given(options=OPTIONS, seed=st.integers(0, 2**16))
def test_the_fused_block_and_autograd_equal_the_oracle(options, seed):
    torch.manual_seed(seed)
    options = applicable(BlockConfig, options)  # a sampled value that could not act: dropped
    block = FusedBlock(16, 4, **options).double()
    with torch.no_grad():  # gains and biases away from 1 and 0, so their gradients matter
        for p in block.parameters():
            p.normal_(0.0, 0.5)
    x = torch.randn(2, 6, 16, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(2, 6, 16, dtype=torch.float64)
    y = block(x)
    y.backward(dy)

    params = {k: v.detach().numpy() for k, v in block.state_dict().items()}
    y_ref, cache = modern_forward(params, x.detach().numpy(), oracle_options(block.config))
    dx_ref, grads = modern_backward(dy.numpy(), cache)

    np.testing.assert_allclose(y.detach().numpy(), y_ref, rtol=0, atol=1e-10)
    np.testing.assert_allclose(x.grad.numpy(), dx_ref, rtol=0, atol=1e-10)
    assert sorted(grads) == sorted(dict(block.named_parameters()))
    for name, p in block.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), grads[name], rtol=0, atol=1e-10, err_msg=name)


def test_the_oracle_of_gpt2s_options_is_the_lessons_oracle():
    """With every option off the modern oracle is the block oracle (``block_forward``)."""
    from gptblock.reference import block_backward, block_forward

    rng = np.random.default_rng(0)
    block = FusedBlock(8, 2).double()
    params = {k: rng.standard_normal(v.shape) for k, v in block.state_dict().items()}
    x, dy = rng.standard_normal((2, 5, 8)), rng.standard_normal((2, 5, 8))
    y, cache = block_forward(params, x, n_head=2)
    y_m, cache_m = modern_forward(params, x, ModernOptions(n_head=2))
    np.testing.assert_allclose(y_m, y, rtol=0, atol=1e-12)
    dx, grads = block_backward(dy, cache)
    dx_m, grads_m = modern_backward(dy, cache_m)
    np.testing.assert_allclose(dx_m, dx, rtol=0, atol=1e-12)
    for key in grads:
        np.testing.assert_allclose(grads_m[key], grads[key], rtol=0, atol=1e-12, err_msg=key)
