"""Property tests: the four forms of the block are one function, forward and backward.

Hypothesis draws the shape (B, T, d_model, n_heads), the activation, bias, LayerNorm eps, dropout
(eval mode: it must change nothing) and masks; the FusedBlock's parameters are random and
``convert`` makes the other forms. Outputs, input gradients and parameter gradients must agree:
float64 within 1e-10, float32 within 1e-5. Parameter gradients are compared in the packed
``TransformerBlock`` layout; the lesson's per-head gradients are packed by ``pack_lesson`` below,
written independently of ``gptblock.blocks.convert``.

The lesson's block takes no masks, has no q/k/v bias and is ReLU with eps 1e-5: it joins the
comparison when the drawn case allows it. ``nn.TransformerEncoderLayer`` returns NaN for a query
row with nothing to attend to, so it joins masked cases only without such rows.
"""

import pytest
import torch
import torch.nn as nn
from hypothesis import given, settings
from hypothesis import strategies as st

from gptblock import FusedBlock, causal_mask, convert, lesson

# Deterministic (the same examples on every run and machine), no per-example deadline (the CI
# machine is shared), and few enough examples that the file takes seconds.
PROPERTY = settings(derandomize=True, deadline=None, max_examples=40)
TOL = {torch.float64: 1e-10, torch.float32: 1e-5}


@st.composite
def cases(draw, dtypes=(torch.float64, torch.float32)):
    # A third of the cases are ones the lesson's block can compute (ReLU, eps 1e-5, no masks), so it
    # is compared as often as the others rather than by the luck of three independent draws.
    kind = draw(st.sampled_from(["lesson", "masked", "any"]))
    with_lesson = kind == "lesson"
    nh = draw(st.integers(1, 3))
    return {
        "B": draw(st.integers(1, 3)),
        "T": draw(st.integers(1, 7)),
        "nh": nh,
        "C": nh * draw(st.integers(1, 5)),
        "activation": "relu"
        if with_lesson
        else draw(st.sampled_from(["gelu", "relu", "gelu_tanh"])),
        "bias": draw(st.booleans()),
        "eps": 1e-5 if with_lesson else draw(st.sampled_from([1e-5, 1e-3])),
        "dropout": draw(st.sampled_from([0.0, 0.3])),
        "dtype": draw(st.sampled_from(dtypes)),
        "seed": draw(st.integers(0, 2**16)),
        "masks": {
            "lesson": "none",
            "masked": draw(st.sampled_from(["attn", "batch_attn", "padding", "both"])),
            "any": draw(st.sampled_from(["none", "attn", "batch_attn", "padding", "both"])),
        }[kind],
    }


def build(case):
    """The fused block with random parameters, plus the masks: (block, x, attn_mask, kpm)."""
    g = torch.Generator().manual_seed(case["seed"])
    B, T, C, dtype = case["B"], case["T"], case["C"], case["dtype"]
    block = FusedBlock(
        C,
        case["nh"],
        dropout=case["dropout"],
        activation=case["activation"],
        bias=case["bias"],
        norm_eps=case["eps"],
    )
    with torch.no_grad():
        for name, p in block.named_parameters():
            # Around 1 for the LayerNorm weights, small elsewhere; the lesson cannot have a
            # q/k/v bias, so that one is zero in the cases the lesson joins (ReLU ones).
            scale = (
                0.0 if name == "self_attn.in_proj_bias" and case["activation"] == "relu" else 0.4
            )
            p.copy_(
                torch.randn(p.shape, generator=g) * scale + ("norm" in name and "weight" in name)
            )
    block = block.to(dtype).eval()
    x = torch.randn(B, T, C, generator=g).to(dtype)
    attn_mask = kpm = None
    if case["masks"] in ("attn", "both"):
        attn_mask = torch.rand(T, T, generator=g) < 0.3
    if case["masks"] == "batch_attn":
        attn_mask = torch.rand(B, T, T, generator=g) < 0.3
    if case["masks"] in ("padding", "both"):
        kpm = torch.rand(B, T, generator=g) < 0.3
    return block, x, attn_mask, kpm


def blocked(B, T, attn_mask, kpm):
    """Independent of gptblock.blocks.masks: the (B, T, T) bool mask, True = blocked."""
    m = causal_mask(T).expand(B, T, T)
    if attn_mask is not None:
        m = m | attn_mask
    if kpm is not None:
        m = m | kpm[:, None, :]
    return m


def forms_for(case, block, attn_mask, kpm):
    """name -> (module, call(x) -> y) for every form that can compute this case."""
    B, T = case["B"], case["T"]
    masked = attn_mask is not None or kpm is not None
    forms = {
        "fused": (block, lambda x: block(x, attn_mask, kpm)),
    }
    mha = convert(block, "mha")
    forms["mha"] = (mha, lambda x: mha(x, attn_mask, kpm))
    if not blocked(B, T, attn_mask, kpm).all(-1).any():
        layer = convert(block, "encoder_layer")
        # One (B * nh, T, T) mask: causal, extra and padding merged, True = blocked.
        src_mask = blocked(B, T, attn_mask, kpm).repeat_interleave(case["nh"], dim=0)
        forms["encoder_layer"] = (layer, lambda x: layer(x, src_mask=src_mask))
    if not masked and case["activation"] == "relu" and case["eps"] == 1e-5:
        lb = convert(block, "lesson", block_size=T)
        forms["lesson"] = (lb, lb)
    return forms


def pack_lesson(block, grads):
    """The lesson's parameter gradients in TransformerBlock's names and packed layout."""
    g = dict(zip([n for n, _ in block.named_parameters()], grads, strict=True))
    nh = len(block.sa.heads)
    packed = {
        "self_attn.in_proj_weight": torch.cat(
            [g[f"sa.heads.{i}.{w}.weight"] for w in ("query", "key", "value") for i in range(nh)]
        ),
        "self_attn.out_proj.weight": g["sa.proj.weight"],
        "self_attn.out_proj.bias": g["sa.proj.bias"],
    }
    for mine, theirs in [("ln1", "norm1"), ("ln2", "norm2")]:
        packed |= {f"{theirs}.{k}": g[f"{mine}.{k}"] for k in ("weight", "bias")}
    for mine, theirs in [("ffwd.net.0", "linear1"), ("ffwd.net.2", "linear2")]:
        packed |= {f"{theirs}.{k}": g[f"{mine}.{k}"] for k in ("weight", "bias")}
    return packed


def outputs_and_grads(name, module, call, x, w):
    x = x.detach().clone().requires_grad_(True)
    y = call(x)
    params = list(module.parameters())
    gx, *gp = torch.autograd.grad((y * w).sum(), [x, *params])
    if name == "lesson":
        named = pack_lesson(module, gp)
    else:
        named = dict(zip([n for n, _ in module.named_parameters()], gp, strict=True))
    return y.detach(), gx, named


@settings(PROPERTY, max_examples=100)
@given(cases())
def test_all_forms_agree_in_outputs_input_and_parameter_gradients(case):
    block, x, attn_mask, kpm = build(case)
    tol = TOL[case["dtype"]]
    w = torch.randn(x.shape, generator=torch.Generator().manual_seed(1)).to(x.dtype)
    forms = forms_for(case, block, attn_mask, kpm)
    y0, gx0, gp0 = outputs_and_grads("fused", *forms.pop("fused"), x, w)
    assert torch.isfinite(y0).all() and torch.isfinite(gx0).all()
    for name, (module, call) in forms.items():
        y, gx, gp = outputs_and_grads(name, module, call, x, w)
        torch.testing.assert_close(y, y0, atol=tol, rtol=tol, msg=f"{name} output")
        torch.testing.assert_close(gx, gx0, atol=tol, rtol=tol, msg=f"{name} input grad")
        # The lesson has no q/k/v bias; made from a bias-free block it has zero biases that the
        # bias-free forms lack. Every other parameter is compared.
        assert set(gp0) - set(gp) <= {"self_attn.in_proj_bias"}, name
        for param in set(gp) & set(gp0):
            torch.testing.assert_close(
                gp[param], gp0[param], atol=tol, rtol=tol, msg=f"{name} {param}"
            )


# --- exact structural properties, every form ---------------------------------------------------


def every_form(case):
    """All four forms of one random float64 block (ReLU, eps 1e-5 so the lesson can join)."""
    block, x, _, _ = build(case | {"activation": "relu", "eps": 1e-5, "masks": "none"})
    forms = forms_for(case | {"activation": "relu", "eps": 1e-5}, block, None, None)
    return {name: call for name, (_, call) in forms.items()}, x


@PROPERTY
@given(cases(dtypes=(torch.float64,)), st.data())
def test_causality_is_exact_in_every_form(case, data):
    forms, x = every_form(case | {"T": max(case["T"], 2)})
    t = data.draw(st.integers(1, x.shape[1] - 1), label="t")
    x2 = x.clone()
    x2[:, t:] = torch.randn(x2[:, t:].shape, dtype=x.dtype)  # change the present and the future
    assert set(forms) == {"fused", "mha", "encoder_layer", "lesson"}
    with torch.no_grad():
        for name, call in forms.items():
            y, y2 = call(x), call(x2)
            assert torch.equal(y2[:, :t], y[:, :t]), name  # the past: bit for bit
            assert not torch.equal(y2[:, t:], y[:, t:]), name  # the change does arrive


@PROPERTY
@given(cases(dtypes=(torch.float64,)), st.data())
def test_batch_elements_are_independent_exactly_in_every_form(case, data):
    forms, x = every_form(case | {"B": max(case["B"], 2)})
    b = data.draw(st.integers(0, x.shape[0] - 1), label="b")
    x2 = torch.randn_like(x)
    x2[b] = x[b]  # every other sequence in the batch changes
    with torch.no_grad():
        for name, call in forms.items():
            assert torch.equal(call(x2)[b], call(x)[b]), name


# --- gradcheck -------------------------------------------------------------------------------


@pytest.mark.parametrize("masks", ["none", "both"])
def test_gradcheck_fused_block_in_float64(masks):
    # Small enough that the numerical Jacobian over every parameter stays quick.
    case = {"B": 2, "T": 4, "C": 4, "nh": 2, "activation": "gelu", "bias": True, "eps": 1e-5}
    case |= {"dropout": 0.0, "dtype": torch.float64, "seed": 7, "masks": masks}
    block, x, attn_mask, kpm = build(case)
    if masks == "both":
        kpm = torch.tensor([[True, False, False, False], [False, False, False, True]])
        attn_mask = torch.zeros(4, 4, dtype=torch.bool)
        attn_mask[2, 1] = True  # and row 0 of sequence 0 is fully blocked
    names = [n for n, _ in block.named_parameters()]

    def f(x, *params):
        state = dict(zip(names, params, strict=True))
        return torch.func.functional_call(block, state, (x, attn_mask, kpm))

    params = [p.detach().clone().requires_grad_(True) for p in block.parameters()]
    assert torch.autograd.gradcheck(f, (x.requires_grad_(True), *params), atol=1e-7, rtol=1e-5)


def test_the_comparison_can_fail():
    # A wrong form must not pass: a lesson block whose heads are swapped computes another function.
    case = {"B": 2, "T": 5, "C": 8, "nh": 2, "activation": "relu", "bias": True, "eps": 1e-5}
    case |= {"dropout": 0.0, "dtype": torch.float64, "seed": 3, "masks": "none"}
    block, x, _, _ = build(case)
    lb = convert(block, "lesson", block_size=5)
    lb.sa.heads = nn.ModuleList([lb.sa.heads[1], lb.sa.heads[0]])
    assert isinstance(lb, lesson.Block)
    assert not torch.allclose(lb(x), block(x), atol=1e-3)
