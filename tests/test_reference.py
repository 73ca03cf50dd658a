"""The NumPy oracle against torch autograd: outputs, input gradients and every parameter gradient.

float64 throughout, tolerance 1e-10 (absolute). Every block form with TransformerBlock's parameter
names is in BLOCKS; FusedBlock joins automatically once gptblock exports it.
"""

import pathlib
import subprocess
import sys
import textwrap

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import gptblock
from gptblock import TransformerBlock, causal_mask, lesson
from gptblock.reference import (
    PARAM_KEYS,
    block_backward,
    block_forward,
    params_from_state_dict,
    softmax,
)
from gptblock.reference.layout import (
    LESSON_ANCHOR,
    LESSON_RENAMES,
    LESSON_TRIL,
    lesson_head,
    lesson_head_count,
    lesson_qkv_keys,
)

REFERENCE_DIR = pathlib.Path(gptblock.__file__).parent / "reference"
TOL = 1e-10

# The forms with TransformerBlock's names and constructor.
BLOCKS = [TransformerBlock, gptblock.FusedBlock]
block_classes = pytest.mark.parametrize("Block", BLOCKS, ids=lambda cls: cls.__name__)


def randomise_(module, seed):
    """Give every parameter random values: torch's init leaves biases 0 and norms 1, which would
    hide a wrong bias or LayerNorm gradient."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=p.dtype)
            norm_weight = name.rsplit(".", 1)[-1] == "weight" and p.dim() == 1
            p.copy_(1.0 + 0.3 * noise if norm_weight else 0.5 * noise)
    return module


def torch_run(module, x, dy, **masks):
    """y, dx and {name: grad} from autograd, as NumPy."""
    x = x.clone().requires_grad_(True)
    y = module(x, **masks)
    names, params = zip(*module.named_parameters(), strict=True)
    grads = torch.autograd.grad(y, (x, *params), grad_outputs=dy)
    return (
        y.detach().numpy(),
        grads[0].numpy(),
        {n: g.numpy() for n, g in zip(names, grads[1:], strict=True)},
    )


def assert_matches(ours, theirs, atol=TOL):
    (y, dx, grads), (ty, tdx, tgrads) = ours, theirs
    np.testing.assert_allclose(y, ty, atol=atol, rtol=0, err_msg="y")
    np.testing.assert_allclose(dx, tdx, atol=atol, rtol=0, err_msg="dx")
    assert sorted(grads) == sorted(tgrads)
    for name in tgrads:
        np.testing.assert_allclose(grads[name], tgrads[name], atol=atol, rtol=0, err_msg=name)


def oracle_run(params, x, dy, n_head, **kwargs):
    y, cache = block_forward(params, x, n_head, **kwargs)
    dx, grads = block_backward(dy, cache)
    return y, dx, grads


@st.composite
def block_cases(draw):
    B, T = draw(st.integers(1, 3)), draw(st.integers(1, 6))
    nh, hs = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    bools = st.booleans()
    attn_shape = draw(st.sampled_from([None, (T, T), (B, T, T)]))
    attn_mask = (
        None if attn_shape is None else draw(hnp.arrays(np.bool_, attn_shape, elements=bools))
    )
    padding = draw(st.none() | hnp.arrays(np.bool_, (B, T), elements=bools))
    return dict(
        B=B,
        T=T,
        nh=nh,
        C=nh * hs,
        activation=draw(st.sampled_from(["gelu", "relu", "gelu_tanh"])),
        bias=draw(bools),
        attn_mask=attn_mask,
        padding=padding,
        seed=draw(st.integers(0, 2**31 - 1)),
    )


@block_classes
@settings(max_examples=100, deadline=None, derandomize=True)
@given(case=block_cases())
def test_oracle_matches_autograd(Block, case):
    B, T, C, nh = case["B"], case["T"], case["C"], case["nh"]
    block = randomise_(
        Block(C, nh, activation=case["activation"], bias=case["bias"]).double(), case["seed"]
    )
    g = torch.Generator().manual_seed(case["seed"])
    x = torch.randn(B, T, C, generator=g, dtype=torch.float64)
    dy = torch.randn(B, T, C, generator=g, dtype=torch.float64)
    masks, mask = {}, np.zeros((B, T, T), dtype=bool)  # the oracle takes one combined mask
    if case["attn_mask"] is not None:
        masks["attn_mask"] = torch.from_numpy(case["attn_mask"])
        mask |= case["attn_mask"]
    if case["padding"] is not None:
        masks["key_padding_mask"] = torch.from_numpy(case["padding"])
        mask |= case["padding"][:, None, :]  # a padded key is blocked for every query row
    theirs = torch_run(block, x, dy, **masks)
    params = params_from_state_dict(block.state_dict())
    ours = oracle_run(params, x.numpy(), dy.numpy(), nh, activation=case["activation"], mask=mask)
    assert_matches(ours, theirs)


@block_classes
def test_fully_blocked_rows_give_zero_weights_and_match_autograd(Block):
    B, T, C, nh = 2, 4, 8, 2
    block = randomise_(Block(C, nh).double(), seed=1)
    mask = np.zeros((B, T, T), dtype=bool)
    mask[0, 2] = True  # one dead query row in sequence 0
    mask[1] = True  # every row dead in sequence 1
    x = torch.randn(B, T, C, dtype=torch.float64)
    dy = torch.randn(B, T, C, dtype=torch.float64)
    params = params_from_state_dict(block.state_dict())
    y, cache = block_forward(params, x.numpy(), nh, mask=mask)
    assert np.all(cache.wei[0, :, 2] == 0) and np.all(cache.wei[1] == 0)
    assert np.all(cache.ctx[0, 2] == 0) and np.all(cache.ctx[1] == 0)  # attention output = bias
    ours = (y, *block_backward(dy.numpy(), cache))
    assert_matches(ours, torch_run(block, x, dy, attn_mask=torch.from_numpy(mask)))


def test_huge_scores_stay_finite_and_still_match_autograd():
    B, T, C, nh = 2, 7, 16, 2
    block = randomise_(TransformerBlock(C, nh).double(), seed=2)
    with torch.no_grad():
        block.self_attn.in_proj_weight[:C] *= 1e3  # W_q: scores ~1e3 times larger
    x = torch.randn(B, T, C, dtype=torch.float64)
    dy = torch.randn(B, T, C, dtype=torch.float64)
    y, cache = block_forward(params_from_state_dict(block.state_dict()), x.numpy(), nh)
    scores = cache.q @ cache.k.swapaxes(-1, -2) / np.sqrt(C // nh)  # (B, nh, T, T)
    with np.errstate(over="ignore"):
        assert np.isinf(np.exp(scores)).any()  # a softmax without the max subtraction overflows
    dx, grads = block_backward(dy.numpy(), cache)
    assert np.isfinite(y).all() and np.isfinite(dx).all()
    assert all(np.isfinite(gr).all() for gr in grads.values())
    # Scores of ~1e4 carry ~1e4 times the rounding error of O(1) ones, so compare relative to
    # each array's scale, still at 1e-10.
    ty, tdx, tgrads = torch_run(block, x, dy)
    for name, ours, theirs in [("y", y, ty), ("dx", dx, tdx)] + [
        (n, grads[n], tgrads[n]) for n in tgrads
    ]:
        np.testing.assert_allclose(
            ours, theirs, atol=TOL * max(1.0, np.abs(theirs).max()), rtol=0, err_msg=name
        )


def encoder_layer(C, nh, activation, d_ff=None):
    return nn.TransformerEncoderLayer(
        C, nh, d_ff or 4 * C, dropout=0.0, activation=activation, batch_first=True, norm_first=True
    ).double()


@pytest.mark.parametrize("activation,d_ff", [("gelu", None), ("relu", 24)])
def test_encoder_layer_state_dict(activation, d_ff):
    B, T, C, nh = 2, 5, 8, 2
    layer = randomise_(encoder_layer(C, nh, activation, d_ff), seed=3)
    x = torch.randn(B, T, C, dtype=torch.float64)
    dy = torch.randn(B, T, C, dtype=torch.float64)
    theirs = torch_run(layer, x, dy, src_mask=causal_mask(T), is_causal=True)
    params = params_from_state_dict(layer.state_dict())
    assert_matches(oracle_run(params, x.numpy(), dy.numpy(), nh, activation=activation), theirs)


def test_the_tanh_gelu_would_not_pass():
    B, T, C, nh = 2, 7, 16, 2
    block = randomise_(TransformerBlock(C, nh).double(), seed=4)
    x = torch.randn(B, T, C, dtype=torch.float64)
    y, _ = block_forward(params_from_state_dict(block.state_dict()), x.numpy(), nh)
    outputs = {}
    for name, act in [("exact", "gelu"), ("tanh", lambda u: F.gelu(u, approximate="tanh"))]:
        layer = encoder_layer(C, nh, act)
        layer.load_state_dict(block.state_dict())
        with torch.no_grad():
            outputs[name] = layer(x, src_mask=causal_mask(T), is_causal=True).numpy()
    assert np.abs(outputs["exact"] - y).max() <= TOL
    assert np.abs(outputs["tanh"] - y).max() > 1e4 * TOL  # ~1e-3: far outside the tolerance


@pytest.mark.parametrize("C,nh,T", [(8, 2, 5), (12, 3, 1), (6, 1, 8)])
def test_lesson_block_through_the_per_head_layout(C, nh, T):
    block = randomise_(lesson.Block(C, nh, block_size=8, dropout=0.0).double(), seed=5)
    x = torch.randn(2, T, C, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(2, T, C, dtype=torch.float64)
    y = block(x)
    y.backward(dy)
    params = params_from_state_dict(block.state_dict())
    assert "self_attn.in_proj_bias" not in params  # the lesson's q/k/v have no bias
    ours = oracle_run(params, x.detach().numpy(), dy.numpy(), nh, activation="relu")
    # The layout change is linear, so it maps the lesson's gradients onto the oracle's names.
    grads = params_from_state_dict({n: p.grad for n, p in block.named_parameters()})
    assert_matches(ours, (y.detach().numpy(), x.grad.numpy(), grads))


def test_params_from_state_dict_copies_reads_any_dtype_and_takes_a_prefix():
    block = TransformerBlock(8, 2).bfloat16()
    sd = {f"blocks.3.{k}": v for k, v in block.state_dict().items()} | {"wte.weight": 0}
    params = params_from_state_dict(sd, prefix="blocks.3.")
    assert list(params) == list(PARAM_KEYS)
    assert all(p.dtype == np.float64 for p in params.values())
    w = params["norm1.weight"]
    w += 1  # a copy: the module's weights are untouched
    assert torch.equal(block.norm1.weight, torch.ones(8, dtype=torch.bfloat16))
    nobias = params_from_state_dict(TransformerBlock(8, 2, bias=False).state_dict())
    assert sorted(nobias) == sorted(k for k in PARAM_KEYS if k.endswith("weight"))


def test_softmax_is_stable_and_zeroes_blocked_rows():
    z = np.array([[1e308, -1e308, 0.0], [3.0, 2.0, 1.0]])
    blocked = np.array([[False, False, False], [True, True, True]])
    p = softmax(z, blocked=blocked)
    assert p.tolist() == [[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    ref = torch.softmax(torch.tensor([[4.0, -2.0, 0.5]], dtype=torch.float64), -1).numpy()
    np.testing.assert_allclose(softmax([[4.0, -2.0, 0.5]]), ref, atol=1e-15, rtol=0)


def test_bad_inputs_raise_naming_the_value():
    params = params_from_state_dict(TransformerBlock(8, 2).state_dict())
    x = np.zeros((1, 3, 8))
    IN = "self_attn.in_proj_weight"
    cases = [
        (ValueError, "n_head", lambda: block_forward(params, x, 3)),
        (ValueError, "activation", lambda: block_forward(params, x, 2, activation="silu")),
        (ValueError, r"\(B, T, C\)", lambda: block_forward(params, x[0], 2)),
        (TypeError, "bool", lambda: block_forward(params, x, 2, mask=np.zeros((3, 3)))),
        (ValueError, r"\(T, T\)", lambda: block_forward(params, x, 2, mask=np.zeros((2, 2), bool))),
        (ValueError, "unexpected", lambda: block_forward({**params, "norm3.weight": 0}, x, 2)),
        (
            ValueError,
            r"norm1.weight must have shape \(4,\)",
            lambda: block_forward(params, np.zeros((1, 3, 4)), 2),
        ),
        (
            ValueError,
            "shape of y",
            lambda: block_backward(x[:, :2], block_forward(params, x, 2)[1]),
        ),
        (ValueError, "no block parameters", lambda: params_from_state_dict({"wte.weight": 0})),
        (ValueError, "unexpected keys", lambda: params_from_state_dict({**params, "extra": 0})),
        (ValueError, "norm2.weight", lambda: params_from_state_dict({IN: params[IN]})),
    ]
    for error, match, call in cases:
        with pytest.raises(error, match=match):
            call()


def test_reference_runs_with_numpy_alone(tmp_path):
    # torch made unimportable, the reference package loaded from its folder as a top-level
    # package (not through gptblock/__init__, which imports torch): any torch or gptblock import
    # in it, direct or indirect, fails this test; only relative imports inside it can work.
    script = textwrap.dedent(
        f"""
        import importlib.util, sys
        sys.modules["torch"] = None
        import numpy as np
        spec = importlib.util.spec_from_file_location(
            "reference",
            {str(REFERENCE_DIR / "__init__.py")!r},
            submodule_search_locations=[{str(REFERENCE_DIR)!r}],
        )
        ref = importlib.util.module_from_spec(spec)
        sys.modules["reference"] = ref
        spec.loader.exec_module(ref)
        rng = np.random.default_rng(0)
        C = 8
        shapes = {{"norm1.weight": (C,), "self_attn.in_proj_weight": (3 * C, C),
                  "self_attn.out_proj.weight": (C, C), "norm2.weight": (C,),
                  "linear1.weight": (4 * C, C), "linear2.weight": (C, 4 * C)}}
        params = {{k: rng.standard_normal(s) for k, s in shapes.items()}}
        y, cache = ref.block_forward(params, rng.standard_normal((2, 4, C)), 2)
        dx, grads = ref.block_backward(np.ones_like(y), cache)
        assert sorted(grads) == sorted(params) and np.isfinite(dx).all()
        assert not any(m.startswith(("torch", "gptblock")) for m in sys.modules if sys.modules[m])
        print("ok")
        """
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_relu_gradient_at_exactly_zero_is_zero_as_in_torch():
    block = randomise_(TransformerBlock(8, 2, activation="relu").double(), seed=6)
    with torch.no_grad():
        block.linear1.weight[:5] = 0.0  # five hidden units sit at u = 0 exactly
        block.linear1.bias[:5] = 0.0
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    dy = torch.randn(2, 3, 8, dtype=torch.float64)
    params = params_from_state_dict(block.state_dict())
    ours = oracle_run(params, x.numpy(), dy.numpy(), 2, activation="relu")
    assert_matches(ours, torch_run(block, x, dy))


# ----- the layout: the lesson's keys onto the packed ones -------------------------------------


def test_layout_names_every_key_of_both_layouts():
    nh = 3
    packed = TransformerBlock(12, nh).state_dict()
    assert list(PARAM_KEYS) == list(packed)
    keys = set(lesson.Block(12, nh, block_size=4).state_dict())
    assert lesson_head_count(keys) == nh and lesson_head_count(set()) == 0
    assert lesson_head_count({f"blocks.1.{k}" for k in keys}, prefix="blocks.1.") == nh
    assert LESSON_ANCHOR in keys
    trils = {lesson_head(i) + LESSON_TRIL for i in range(nh)}
    renamed = {f"{old}.{kind}" for old in LESSON_RENAMES for kind in ("weight", "bias")}
    assert keys == set(lesson_qkv_keys(nh)) | trils | renamed  # nothing left over
    # The renames land on every packed key but the q/k/v (one packed pair for all the heads).
    assert {f"{new}.{kind}" for new in LESSON_RENAMES.values() for kind in ("weight", "bias")} == (
        set(PARAM_KEYS) - {"self_attn.in_proj_weight", "self_attn.in_proj_bias"}
    )


def test_lesson_qkv_keys_stack_into_the_packed_in_proj_weight():
    block = lesson.Block(8, 2, block_size=4)
    sd = block.state_dict()
    packed = gptblock.convert(block, "mha").state_dict()["self_attn.in_proj_weight"]
    stacked = torch.cat([sd[key] for key in lesson_qkv_keys(2)])  # (3C, C)
    assert torch.equal(stacked, packed)
    assert lesson_qkv_keys(2, kind="bias")[1] == "sa.heads.1.query.bias"


def test_layout_imports_without_numpy_or_torch():
    script = textwrap.dedent(
        f"""
        import importlib.util, sys
        sys.modules["numpy"] = sys.modules["torch"] = None
        path = {str(REFERENCE_DIR / "layout.py")!r}
        spec = importlib.util.spec_from_file_location("layout", path)
        layout = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(layout)
        assert layout.lesson_qkv_keys(1) == [
            "sa.heads.0.query.weight", "sa.heads.0.key.weight", "sa.heads.0.value.weight"
        ]
        print("ok")
        """
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"
