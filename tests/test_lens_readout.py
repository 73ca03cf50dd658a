"""gptblock.lens.readout: the stream as a sum, direct logit attribution, the logit lens, and
the heads' entropy and distance, each against an independent computation (float64, 1e-10)."""

import math

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from gptblock.errors import UserTypeError, UserValueError
from gptblock.lens import (
    attention_entropy,
    direct_logit_attribution,
    head_summaries,
    logit_lens,
    mean_distance_back,
    stream_components,
)
from lens_models import FORMS, lens_gpt, prompt
from test_lens_trace import TOL64, block_reference


def cached(model, idx=None):
    with torch.no_grad():
        return model.run_with_cache(prompt() if idx is None else idx)


# --- the stream, decomposed ----------------------------------------------------------------


@pytest.mark.parametrize("form", FORMS)
def test_the_final_stream_is_embed_plus_every_attn_out_and_mlp_out(form):
    model = lens_gpt(form, n_layer=3)
    _, cache = cached(model)
    parts = stream_components(cache)
    assert list(parts) == ["embed", "L0 attn", "L0 MLP", "L1 attn", "L1 MLP", "L2 attn", "L2 MLP"]
    final = cache["blocks.2.resid_post"]
    torch.testing.assert_close(sum(parts.values()), final, **TOL64)
    # ... which is the stream the model's own blocks compute
    x = model.wte(prompt()) + model.wpe(torch.arange(9))
    with torch.no_grad():
        for block in model.blocks:
            x = block(x)
    torch.testing.assert_close(final, x, **TOL64)
    ln_f = model.transformer["ln_f"]
    torch.testing.assert_close(cache["ln_final"], ln_f(final), **TOL64)


@pytest.mark.parametrize("form", FORMS)
def test_attn_out_is_the_sum_of_the_heads_plus_the_output_bias(form):
    model = lens_gpt(form, n_head=4)
    _, cache = cached(model)
    for i, block in enumerate(model.blocks):
        proj = block.sa.proj if form == "lesson" else block.self_attn.out_proj
        heads = cache[f"blocks.{i}.head_out"]  # (B, T, nh, C)
        torch.testing.assert_close(
            heads.sum(dim=2) + proj.bias, cache[f"blocks.{i}.attn_out"], **TOL64
        )
        if form == "lesson":  # each head is the lesson's own Head, through its proj columns
            h = block.ln1(cache[f"blocks.{i}.resid_pre"])
            for n, head in enumerate(block.sa.heads):
                own = head(h) @ proj.weight[:, n * 4 : (n + 1) * 4].T  # (B, T, hs) -> (B, T, C)
                torch.testing.assert_close(heads[:, :, n], own, **TOL64)


# --- direct logit attribution --------------------------------------------------------------


def numpy_dla(model, cache, token, b, t):
    """Each component through the final LayerNorm at the forward pass's scale, in NumPy."""
    n = lambda x: x.detach().numpy()  # noqa: E731
    ln_f = model.transformer["ln_f"]
    x = n(cache[f"blocks.{cache.n_layer - 1}.resid_post"][b, t])
    s = np.sqrt(((x - x.mean()) ** 2).mean() + ln_f.eps)
    w = n(ln_f.weight) * n(model.lm_head.weight[token])
    comps = [n(cache["embed"][b, t])]
    for i in range(cache.n_layer):
        comps += [*n(cache[f"blocks.{i}.head_out"][b, t]), n(cache[f"blocks.{i}.mlp_out"][b, t])]
    return np.array([((c - c.mean()) / s) @ w for c in comps])


@pytest.mark.parametrize("form", FORMS)
def test_direct_logit_attribution_adds_up_to_the_logit(form):
    model = lens_gpt(form, n_layer=3, n_head=2)
    run = cached(model)
    for token, position, batch in [(3, -1, 0), (7, 4, 1), (0, 0, 0)]:
        a = direct_logit_attribution(model, run, token, position=position, batch=batch)
        expected_logit = float(model(prompt()).logits[batch, position, token].detach())
        assert a.logit == pytest.approx(expected_logit, abs=1e-10)
        assert float(a.values.sum()) + a.bias == pytest.approx(a.logit, abs=1e-10)
        assert a.labels[:4] == ("embed", "L0H0", "L0H1", "L0 MLP") and len(a.labels) == 10
        np.testing.assert_allclose(
            a.values.numpy(), numpy_dla(model, run.cache, token, batch, position), atol=1e-10
        )
        # The biases: each attention output bias through ln_f at the same scale, and ln_f's.
        ln_f = model.transformer["ln_f"]
        w_u = model.lm_head.weight[token].detach().numpy()
        g, beta = ln_f.weight.detach().numpy(), ln_f.bias.detach().numpy()
        bias = beta @ w_u
        for block in model.blocks:
            proj = block.sa.proj if form == "lesson" else block.self_attn.out_proj
            b_o = proj.bias.detach().numpy()
            bias += ((b_o - b_o.mean()) / a.scale * g) @ w_u
        assert a.bias == pytest.approx(bias, abs=1e-10)
        assert a.position == (position % 9) and a.token == token


def test_the_scale_is_the_one_the_forward_pass_used():
    model = lens_gpt()
    run = cached(model)
    a = direct_logit_attribution(model, run, 5, position=3, batch=1)
    x = run.cache["blocks.1.resid_post"][1, 3]
    ln_f = model.transformer["ln_f"]
    normalised = (x - x.mean()) / a.scale * ln_f.weight + ln_f.bias
    torch.testing.assert_close(normalised, run.cache["ln_final"][1, 3], **TOL64)


@pytest.mark.parametrize("form", ["fused", "mha"])
def test_without_biases_the_components_are_the_whole_logit(form):
    model = lens_gpt(form, bias=False)
    run = cached(model)
    a = direct_logit_attribution(model, run, 2)
    assert a.bias == 0.0
    assert float(a.values.sum()) == pytest.approx(a.logit, abs=1e-10)


def test_attribution_arguments_are_checked():
    model = lens_gpt()
    run = cached(model)
    with pytest.raises(UserValueError, match="token=13 is out of range: there are 13"):
        direct_logit_attribution(model, run, 13)
    with pytest.raises(UserValueError, match="token=-1 is out of range"):
        direct_logit_attribution(model, run, -1)
    with pytest.raises(UserValueError, match="position=9 is out of range: there are 9"):
        direct_logit_attribution(model, run, 1, position=9)
    with pytest.raises(UserTypeError, match=r"batch must be an int, got 0\.5"):
        direct_logit_attribution(model, run, 1, batch=0.5)
    with torch.no_grad():
        partial = model.run_with_cache(prompt(), ["embed"])
    with pytest.raises(KeyError, match="was not cached"):
        direct_logit_attribution(model, partial, 1)
    assert direct_logit_attribution(model, run, torch.tensor(4)).token == 4


# --- the logit lens ------------------------------------------------------------------------


@pytest.mark.parametrize("form", FORMS)
def test_the_logit_lens_reads_the_stream_after_each_layer(form):
    model = lens_gpt(form, n_layer=3)
    idx = prompt()
    _, cache = cached(model, idx)
    lens = logit_lens(model, cache, batch=1)
    assert lens.labels == ("embed", "layer 0", "layer 1", "layer 2")
    assert lens.probs.shape == (4, 9, 13)
    with torch.no_grad():
        # The last reading is the model's own output distribution.
        torch.testing.assert_close(lens.probs[-1], F.softmax(model(idx).logits[1], -1), **TOL64)
        # Reading i: ln_f and the unembedding on the stream the model's own blocks computed.
        x = model.wte(idx) + model.wpe(torch.arange(9))
        readings = [x]
        for block in model.blocks:
            x = block(x)
            readings.append(x)
        for s, x in enumerate(readings):
            logits = model.lm_head(model.transformer["ln_f"](x[1]))
            torch.testing.assert_close(lens.probs[s], F.softmax(logits, -1), **TOL64)
        torch.testing.assert_close(block_reference(model, idx)[1].softmax(-1), lens.probs[-1])


# --- entropy and distance ------------------------------------------------------------------


def test_entropy_in_bits_of_uniform_and_one_hot_rows():
    T = 6
    uniform = torch.tril(torch.ones(T, T, dtype=torch.float64))
    uniform = uniform / uniform.sum(-1, keepdim=True)
    expected = torch.tensor([math.log2(t + 1) for t in range(T)], dtype=torch.float64)
    torch.testing.assert_close(attention_entropy(uniform), expected, **TOL64)
    torch.testing.assert_close(
        mean_distance_back(uniform), torch.arange(T) / 2.0, **TOL64, check_dtype=False
    )
    one_hot = torch.eye(T, dtype=torch.float64)  # every position attends to itself
    assert attention_entropy(one_hot).eq(0).all() and mean_distance_back(one_hot).eq(0).all()
    first = torch.zeros(T, T, dtype=torch.float64)
    first[:, 0] = 1  # every position attends to the first
    torch.testing.assert_close(mean_distance_back(first), torch.arange(T).double(), **TOL64)


def test_entropy_and_distance_on_real_attention_against_numpy():
    model = lens_gpt(n_head=4)
    _, cache = cached(model)
    p = cache["blocks.1.pattern"].numpy()  # (B, nh, T, T)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, -p * np.log2(p), 0.0)
    np.testing.assert_allclose(
        attention_entropy(cache["blocks.1.pattern"]).numpy(), terms.sum(-1), atol=1e-10
    )
    T = p.shape[-1]
    back = np.array([[t - j for j in range(T)] for t in range(T)], dtype=np.float64)
    np.testing.assert_allclose(
        mean_distance_back(cache["blocks.1.pattern"]).numpy(), (p * back).sum(-1), atol=1e-10
    )
    rows = head_summaries(cache, batch=1)
    assert [(r.layer, r.head) for r in rows] == [(i, n) for i in range(2) for n in range(4)]
    r = rows[4 + 2]  # layer 1, head 2
    assert r.entropy == pytest.approx(terms[1, 2].sum(-1).mean(), abs=1e-10)
    assert r.distance == pytest.approx((p[1, 2] * back).sum(-1).mean(), abs=1e-10)
    assert r.top_position == int(p[1, 2, -1].argmax()) and r.top_weight == p[1, 2, -1].max()
    assert 0 < r.entropy < math.log2(T)  # sharp, but not one-hot: the weights are worth looking at
