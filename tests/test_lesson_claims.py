"""Every claim the two lessons make about the block, as a test on every block form."""

import pytest
import torch
import torch.nn as nn

from forms import FORMS
from gptblock import TransformerBlock, lesson

ALL = pytest.mark.parametrize("form", sorted(FORMS))


def make(form, d_model=16, n_heads=2, dropout=0.0, dtype=torch.float64):
    torch.manual_seed(0)
    return FORMS[form](d_model, n_heads, dropout).to(dtype)


# --- lesson 2, worked example -----------------------------------------------------------------


@ALL
def test_worked_example_shape(form):
    block = make(form, 16, 2)
    assert block(torch.randn(2, 5, 16, dtype=torch.float64)).shape == (2, 5, 16)


@ALL
@pytest.mark.parametrize("t", range(5))
def test_changing_token_t_changes_outputs_at_positions_from_t_only(form, t):
    block = make(form, 16, 2).eval()
    torch.manual_seed(1)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    x2 = x.clone()
    x2[:, t] = torch.randn(2, 16, dtype=torch.float64)
    with torch.no_grad():
        diff = (block(x2) - block(x)).abs().amax(dim=(0, 2))  # (T,)
    assert torch.equal(diff[:t], torch.zeros(t, dtype=torch.float64))  # exactly zero, not ~0
    assert (diff[t:] > 1e-6).all()  # it does reach every later position


# --- lesson 1: the head's weights -------------------------------------------------------------


@ALL
@pytest.mark.parametrize("T", [1, 5, 17])
def test_weights_rows_sum_to_one_and_nothing_above_the_diagonal(form, T):
    block = make(form, 24, 3).eval()
    x = torch.randn(2, T, 24, dtype=torch.float64)
    w = block.attention_weights(x)  # (B, nh, T, T)
    assert w.shape == (2, 3, T, T)
    torch.testing.assert_close(
        w.sum(-1), torch.ones(2, 3, T, dtype=torch.float64), atol=1e-12, rtol=0
    )
    upper = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    assert torch.equal(w[..., upper], torch.zeros_like(w[..., upper]))  # exactly 0


def test_scores_are_scaled_by_one_over_sqrt_head_size():
    torch.manual_seed(2)
    head = lesson.Head(16, 4, 8).double()
    x = torch.randn(1, 6, 16, dtype=torch.float64)
    q, k = head.query(x), head.key(x)
    scores = (q @ k.transpose(-2, -1)) / 2.0  # sqrt(head_size=4) = 2
    scores = scores.masked_fill(torch.ones(6, 6).triu(1).bool(), float("-inf"))
    torch.testing.assert_close(head.attention_weights(x), scores.softmax(-1), atol=1e-14, rtol=0)


# --- pre-norm: each sub-layer's output is added to its input ---------------------------------


def capture(module, store, key, what="output"):
    def hook(mod, args, out):
        store[key] = args[0] if what == "input" else (out[0] if isinstance(out, tuple) else out)

    return module.register_forward_hook(hook)


BRANCHES = {  # form -> (first norm, attention sub-layer, second norm, MLP's last module)
    "lesson": ("ln1", "sa", "ln2", "ffwd"),
    "mha": ("norm1", "self_attn", "norm2", "linear2"),
    "fused": ("norm1", "self_attn", "norm2", "linear2"),
}


@pytest.mark.parametrize("form", sorted(BRANCHES))
def test_block_is_pre_norm_residual(form):
    block = make(form).eval()
    n1, attn, n2, mlp = (getattr(block, name) for name in BRANCHES[form])
    seen = {}
    hooks = [
        capture(n1, seen, "norm1_in", "input"),
        capture(attn, seen, "attn_out"),
        capture(n2, seen, "resid_mid"),  # norm2's input is the stream after the attention branch
        capture(n2, seen, "norm2_in", "input"),
        capture(mlp, seen, "mlp_out"),
    ]
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    y = block(x)
    for h in hooks:
        h.remove()
    # The first norm reads the untouched input, and the stream is input + branch outputs.
    assert torch.equal(seen["norm1_in"], x)
    torch.testing.assert_close(seen["norm2_in"], x + seen["attn_out"], atol=0, rtol=0)
    torch.testing.assert_close(y, seen["norm2_in"] + seen["mlp_out"], atol=0, rtol=0)


# --- batch independence -----------------------------------------------------------------------


@ALL
def test_batch_elements_do_not_see_each_other(form):
    # A (time, batch) mix-up -- the lessons' batch_first mistake -- breaks exactly this.
    block = make(form).eval()
    torch.manual_seed(3)
    x = torch.randn(4, 6, 16, dtype=torch.float64)
    with torch.no_grad():
        y = block(x)
        x2 = x.clone()
        x2[1:] = torch.randn(3, 6, 16, dtype=torch.float64)
        assert torch.equal(block(x2)[0], y[0])
        torch.testing.assert_close(block(x[2:3])[0], y[2], atol=1e-12, rtol=0)


# --- dropout is off in eval -------------------------------------------------------------------


@ALL
def test_eval_is_deterministic_and_equals_a_dropout_free_block(form):
    torch.manual_seed(4)
    noisy = FORMS[form](16, 2, 0.3).double().eval()
    clean = FORMS[form](16, 2, 0.0).double().eval()
    clean.load_state_dict(noisy.state_dict())
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    a, b = noisy(x), noisy(x)
    assert torch.equal(a, b)
    assert torch.equal(a, clean(x))
    assert not torch.equal(noisy.train()(x), a)  # and dropout does act in training mode


# --- the two lessons' blocks are one function -------------------------------------------------


def copy_lesson_into_transformer_block(src: lesson.Block) -> TransformerBlock:
    """The lesson's per-head q/k/v stacked into nn.MultiheadAttention's packed in_proj."""
    C = src.ln1.normalized_shape[0]
    nh = len(src.sa.heads)
    dst = TransformerBlock(C, nh, activation="relu", bias=True).to(src.ln1.weight.dtype)
    q = torch.cat([h.query.weight for h in src.sa.heads], dim=0)  # nh x (hs, C) -> (C, C)
    k = torch.cat([h.key.weight for h in src.sa.heads], dim=0)  # (C, C)
    v = torch.cat([h.value.weight for h in src.sa.heads], dim=0)  # (C, C)
    with torch.no_grad():
        dst.self_attn.in_proj_weight.copy_(torch.cat([q, k, v], dim=0))  # (3C, C)
        dst.self_attn.in_proj_bias.zero_()  # the lesson's q/k/v have no bias
        dst.self_attn.out_proj.load_state_dict(src.sa.proj.state_dict())
        dst.norm1.load_state_dict(src.ln1.state_dict())
        dst.norm2.load_state_dict(src.ln2.state_dict())
        dst.linear1.load_state_dict(src.ffwd.net[0].state_dict())
        dst.linear2.load_state_dict(src.ffwd.net[2].state_dict())
    return dst


@pytest.mark.parametrize("C,nh", [(16, 2), (24, 4), (8, 1)])
def test_transformer_block_with_relu_and_no_qkv_bias_is_the_lesson_block(C, nh):
    torch.manual_seed(5)
    src = lesson.Block(C, nh, 16, dropout=0.0).double().eval()
    for p in src.parameters():  # move LayerNorm affine params off their 1/0 init too
        nn.init.normal_(p, std=0.3)
    dst = copy_lesson_into_transformer_block(src).eval()
    x = torch.randn(3, 11, C, dtype=torch.float64)
    torch.testing.assert_close(dst(x), src(x), atol=1e-12, rtol=0)
    torch.testing.assert_close(
        dst.attention_weights(x), src.attention_weights(x), atol=1e-12, rtol=0
    )
