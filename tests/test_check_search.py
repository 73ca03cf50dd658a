"""The checker's reference block, its mistaken variants, and the search for the one a block is.

The reference (``steps.run_steps`` with ``CORRECT``) is held to the NumPy oracle in float64; with a
block's own parts it reproduces gptblock's blocks and ``nn.TransformerEncoderLayer``; every two
diagnoses are far apart compared with the search's tolerance.
"""

import numpy as np
import pytest
import torch
import torch.nn as nn
from torch.nn import functional as F

import gptblock
from gptblock import TransformerBlock, lesson, reference
from gptblock.check.mistakes.catalogue import (
    DEVIATIONS,
    LESSONS,
    MISTAKES,
    MODERN,
    compose,
    searched,
)
from gptblock.check.mistakes.search import (
    TOLERANCE,
    distance,
    explain,
    fitted_scale,
    smallest,
    variants,
)
from gptblock.check.mistakes.steps import (
    CANDIDATE_ACTIVATIONS,
    CORRECT,
    NORM_FORMS,
    MissingPart,
    Parts,
    affine,
    run_steps,
)
from gptblock.check.roles.mapping import MappedBlock, map_roles
from gptblock.check.roles.parts import discover
from gptblock.check.roles.provenance import choose
from gptblock.check.serve.subject import one_thread


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():  # as check_block runs: on a loaded machine 100x faster for tiny tensors
        yield


def _weights(C, seed):
    """Random weights in TransformerBlock's names, LayerNorms away from (1, 0)."""
    g = torch.Generator().manual_seed(seed)

    def w(*shape, std=1.0):
        return torch.randn(*shape, generator=g, dtype=torch.float64) * std

    return {
        "norm1.weight": 1 + w(C, std=0.1), "norm1.bias": w(C, std=0.1),
        "self_attn.in_proj_weight": w(3 * C, C, std=C**-0.5), "self_attn.in_proj_bias": w(3 * C, std=0.1),
        "self_attn.out_proj.weight": w(C, C, std=C**-0.5), "self_attn.out_proj.bias": w(C, std=0.1),
        "norm2.weight": 1 + w(C, std=0.1), "norm2.bias": w(C, std=0.1),
        "linear1.weight": w(4 * C, C, std=C**-0.5), "linear1.bias": w(4 * C, std=0.1),
        "linear2.weight": w(C, 4 * C, std=(4 * C) ** -0.5), "linear2.bias": w(C, std=0.1),
    }  # fmt: skip


def _parts(w, C):
    def qkv(h):
        q, k, v = affine(w["self_attn.in_proj_weight"], w["self_attn.in_proj_bias"])(h).chunk(3, -1)
        return q, k, v

    def norm(i):
        return lambda h: F.layer_norm(h, (C,), w[f"norm{i}.weight"], w[f"norm{i}.bias"])

    return Parts(
        C, C, qkv,
        affine(w["self_attn.out_proj.weight"], w["self_attn.out_proj.bias"]),
        affine(w["linear1.weight"], w["linear1.bias"]),
        affine(w["linear2.weight"], w["linear2.bias"]),
        norm(1), norm(2),
    )  # fmt: skip


@pytest.mark.parametrize("activation", ["gelu", "relu"])
@pytest.mark.parametrize("C, nh", [(8, 2), (12, 3), (16, 1), (16, 8)])
def test_the_reference_is_the_numpy_oracle(C, nh, activation):
    w = _weights(C, seed=C + nh)
    x = torch.randn(3, 5, C, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    ours = run_steps(_parts(w, C), x, nh, CANDIDATE_ACTIVATIONS[activation], CORRECT)
    oracle, _ = reference.block_forward(
        {k: v.numpy() for k, v in w.items()}, x.numpy(), nh, activation=activation
    )
    np.testing.assert_allclose(ours.numpy(), oracle, rtol=0, atol=1e-10)


def _mapped(module, C):
    named = dict(module.named_parameters())  # the checker's own values: every weight matters
    chosen = choose({n: p.detach() for n, p in named.items()}, C, torch.Generator().manual_seed(0))
    with torch.no_grad():
        for n, p in named.items():
            p.copy_(chosen[n])
    parts = discover(module)
    mapped = map_roles(module, C, parts, {})
    assert isinstance(mapped, MappedBlock), mapped
    return mapped


@pytest.mark.parametrize("form", ["lesson", "mha", "fused", "encoder_layer"])
def test_the_reference_with_a_blocks_own_parts_computes_the_block(form):
    torch.manual_seed(0)
    C, nh = 16, 2
    if form == "lesson":
        block, act = lesson.Block(C, nh, 8), "relu"
    elif form == "mha":
        block, act = TransformerBlock(C, nh), "gelu"
    elif form == "fused":
        block, act = gptblock.FusedBlock(C, nh, activation="relu"), "relu"
    else:
        block, act = (
            nn.TransformerEncoderLayer(
                C, nh, 4 * C, 0.0, "gelu", batch_first=True, norm_first=True
            ),
            "gelu",
        )
    block = block.double().eval()
    mapped = _mapped(block, C)
    x = torch.randn(3, 5, C, dtype=torch.float64)
    with torch.no_grad():
        if form == "encoder_layer":
            theirs = block(x, src_mask=gptblock.causal_mask(5), is_causal=True)
        else:
            theirs = block(x)
        # the lesson's heads register key before query: only the comparison, trying the other
        # orders (the fallback), tells them apart
        tried = mapped.readings + (mapped.fallback if form == "lesson" else ())
        ours = [run_steps(r, x, nh, CANDIDATE_ACTIVATIONS[act], CORRECT) for r in tried]
    assert any(torch.allclose(y, theirs, rtol=0, atol=1e-10) for y in ours), form


def _outputs(parts, x, nh, size):
    """(mistakes, output) of every variant of up to ``size`` mistakes under every activation."""
    out = []
    with torch.no_grad():
        for deviations in variants(size):
            for act in CANDIDATE_ACTIVATIONS.values():
                try:
                    y = run_steps(parts, x, nh, act, compose(deviations))
                except MissingPart:
                    continue
                out.append((frozenset(d.mistake for d in deviations), y))
    return out


def _smallest_gap(outputs):
    """min over pairs with different mistakes of min(distance(a, b), distance(b, a)), vectorised."""
    labels = [m for m, _ in outputs]
    Y = torch.stack([y.reshape(-1, y.shape[-1]) for _, y in outputs])  # (N, R, C): R = B * T rows
    finite = torch.isfinite(Y).all(-1)  # (N, R)
    scale = torch.where(torch.isfinite(Y), Y, 0.0).abs().flatten(1).amax(1).clamp_min(1e-12)  # (N,)
    best = float("inf")
    for a in range(len(outputs)):
        diff = (Y[a][None] - Y).abs().amax(-1)  # (N, R): row-wise max |y_a - y_b|
        # distance(y_a, y_b): rows where y_b is defined; inf if y_a is not finite there
        bad_a = (finite & ~finite[a][None]).any(1)  # (N,)
        d_ab = torch.where(finite, diff, 0.0).amax(1) / scale
        d_ab = torch.where(bad_a | (finite.double().mean(1) < 0.5), torch.inf, d_ab)
        bad_b = (finite[a][None] & ~finite).any(1)
        d_ba = torch.where(finite[a][None], diff, 0.0).amax(1) / scale[a]
        d_ba = torch.where(bad_b | (finite[a].double().mean() < 0.5), torch.inf, d_ba)
        gap = torch.minimum(d_ab, d_ba)
        other = torch.tensor([labels[b] != labels[a] for b in range(len(outputs))])
        if other.any():
            best = min(best, float(gap[other].min()))
    return best


@pytest.mark.parametrize("make, C, nh", [
    (lambda: TransformerBlock(16, 2), 16, 2),
    (lambda: lesson.Block(32, 4, 8), 32, 4),
    (lambda: TransformerBlock(32, 8), 32, 8),
])  # fmt: skip
def test_every_two_diagnoses_are_far_apart_compared_with_the_tolerance(make, C, nh):
    """Over every variant of up to two mistakes (and every activation), outputs with different
    mistakes differ by more than 100x TOLERANCE (measured: 4.7e-2, 8.1e-2 and 6.7e-2)."""
    torch.manual_seed(0)
    mapped = _mapped(make().double().eval(), C)
    x = torch.randn(6, 6, C, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    outputs = _outputs(mapped.readings[0], x, nh, 2)
    assert _smallest_gap(outputs) > 100 * TOLERANCE


def test_the_vectorised_gap_agrees_with_distance():
    mapped = _mapped(TransformerBlock(8, 2).double().eval(), 8)
    x = torch.randn(4, 4, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    outputs = _outputs(mapped.readings[0], x, 2, 1)
    slow = min(
        min(distance(ya, yb), distance(yb, ya))
        for i, (ma, ya) in enumerate(outputs)
        for mb, yb in outputs[i + 1 :]
        if ma != mb
    )
    assert _smallest_gap(outputs) == pytest.approx(slow, rel=1e-12)


def test_variants_are_smallest_first_with_one_deviation_per_group():
    sizes = [len(v) for v in variants(3)]
    assert sizes == sorted(sizes) and sizes[0] == 0 and max(sizes) == 3
    for v in variants(3):
        groups = [d.group for d in v]
        assert len(groups) == len(set(groups))


def test_smallest_stops_at_the_first_size_and_tries_each_set_of_mistakes_once():
    # the one search of the lessons' variants and the modern attention: wrong_scale's three
    # ways are one diagnosis (its first accepted), and nothing larger is tried after a match
    pool = [d for d in LESSONS if d.mistake in ("no_scaling", "wrong_scale", "post_norm")]
    tried = []

    def attempt(deviations):
        tried.append(deviations)
        return deviations if {d.group for d in deviations} == {"scale"} else None

    found = smallest(variants(2, pool), attempt)
    assert [f[0].mistake for f in found] == ["no_scaling", "wrong_scale"]
    assert max(len(t) for t in tried) == 1
    assert sum(1 for t in tried if t and t[0].mistake == "wrong_scale") == 1


def test_each_mistake_has_one_home_in_the_catalogue():
    # every deviation is a way of its own mistake's entry, grouped by the one step it changes,
    # and what an entry explains is another catalogued mistake
    ways = [(m.id, d.label) for m in MISTAKES.values() for d in m.ways]
    assert [(d.mistake, d.label) for d in DEVIATIONS] == ways
    assert all(len(d.changes) == 1 for d in DEVIATIONS)
    groups = {d.group for d in LESSONS}
    assert groups == {"mask", "axis", "scale", "softmax", "split", "merge", "wiring", "norms"}
    assert {d.group for d in MODERN} == {"targets", "table", "order"}
    assert set(DEVIATIONS) == {*LESSONS, *MODERN}
    forms = [f for m in MISTAKES.values() for f in m.forms]  # each mistaken norm form, one home
    assert sorted(forms) == sorted(f for f in NORM_FORMS if f != "rms")
    assert all(e in MISTAKES and e != m.id for m in MISTAKES.values() for e in m.explains)
    assert MISTAKES["mask_reversed"].explains == ("future_leak", "nonfinite")


def test_every_deviation_changes_the_block():
    w = _weights(16, seed=3)
    x = torch.randn(4, 6, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    right = run_steps(_parts(w, 16), x, 4, F.gelu, CORRECT)
    for deviation in LESSONS:  # the modern ones: tests/test_check_modern.py
        y = run_steps(_parts(w, 16), x, 4, F.gelu, compose([deviation]))
        assert min(distance(y, right), distance(right, y)) > 100 * TOLERANCE, deviation.label


def test_a_variant_that_needs_a_missing_norm_is_skipped():
    w = _weights(8, seed=0)
    parts = _parts(w, 8)
    one = Parts(parts.C, parts.D, parts.qkv, parts.proj, parts.fc1, parts.fc2, parts.ln1, None)
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    with pytest.raises(MissingPart):
        run_steps(one, x, 2, F.gelu, CORRECT)
    shared = next(d for d in DEVIATIONS if d.mistake == "shared_norm")
    y = run_steps(one, x, 2, F.gelu, compose([shared]))
    found = explain([one], x, y, (2,), max_size=1)
    assert found.match is not None and found.match.mistakes == ["shared_norm"]


def test_the_search_names_the_unknowns_and_ties():
    w = _weights(16, seed=1)
    x = torch.randn(5, 5, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    mistakes = [d for d in DEVIATIONS if d.mistake in ("no_scaling", "post_norm")]
    y = run_steps(_parts(w, 16), x, 4, F.relu, compose(mistakes))
    found = explain([_parts(w, 16)], x, y, (1, 2, 4, 8, 16), max_size=3)
    assert found.match is not None
    assert (found.match.mistakes, found.match.n_head, found.match.activation) == (
        ["no_scaling", "post_norm"], 4, "relu",
    )  # fmt: skip
    assert found.alternatives == () and found.match.error < 1e-12
    nothing = explain([_parts(w, 16)], x, y * 1.1, (4,), max_size=1)
    assert nothing.match is None and nothing.closest is not None


def test_a_scale_none_of_the_ways_has_is_fitted_with_the_other_mistakes_kept():
    w = _weights(16, seed=1)
    x = torch.randn(5, 5, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    post = [d for d in DEVIATIONS if d.mistake == "post_norm"]
    for ratio, others in ((3.0, []), (0.3, post)):  # 3 x and 0.3 x hs ** -0.5 = 1.5 and 0.15
        y = run_steps(_parts(w, 16), x, 4, F.relu, compose([*others, fitted_scale(ratio)]))
        found = explain([_parts(w, 16)], x, y, (4,), max_size=3)
        assert found.match is not None and found.match.error < 1e-6  # the fit: to ~1e-7 of r
        assert sorted(found.match.mistakes) == sorted({"wrong_scale", *(d.mistake for d in others)})
        said = found.match.deviations[-1].describe(16, 4)
        assert said.startswith(f"scores scaled by {ratio * 0.5:.4g} = {ratio:.4g} x hs ** -0.5")
    # a block the scale cannot reproduce keeps its nearest miss; no scale is fitted past max_size
    y = run_steps(_parts(w, 16), x, 4, F.relu, compose([*post, fitted_scale(3.0)]))
    assert explain([_parts(w, 16)], x, y, (4,), max_size=1).match is None


def test_the_probes_passed_rule_out_the_mistakes_every_way_of_which_fails_them():
    def ruled_out(passed):
        kept = searched(passed)
        assert all(d in LESSONS for d in kept)
        return {d.mistake for d in LESSONS} - {d.mistake for d in kept}

    from gptblock.check.compare.probes import PROBES

    assert all(set(m.ruled_out_by) <= set(PROBES) for m in MISTAKES.values())  # names of probes
    leaks = {"future_leak", "mask_reversed", "mask_zero", "mask_after_softmax", "softmax_dim"}
    assert ruled_out(()) == set() and searched(()) == LESSONS
    # attention along the batch (batch_mixing) leaks the future past the causality probe
    assert ruled_out({"causality"}) == set()
    assert ruled_out({"causality", "batch independence"}) == leaks | {"batch_mixing"}
    assert ruled_out({"residual stream"}) == {"post_norm", "no_residual"}
    # every way of a leak moves an earlier position (the causality probe fails on it)
    w = _weights(16, seed=3)
    x = torch.randn(3, 6, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    for d in LESSONS:
        if d.mistake in leaks:
            x2 = x.clone()
            x2[:, 4] += torch.linspace(-1, 1, 16)  # a later position moves an earlier one
            y, y2 = (run_steps(_parts(w, 16), t, 4, F.relu, compose([d])) for t in (x, x2))
            assert not torch.allclose(y[:, :4], y2[:, :4], equal_nan=True), d.label


def test_a_reading_that_raises_is_skipped_not_fatal():
    w = _weights(8, seed=0)
    good = _parts(w, 8)

    def broken(h):
        raise RuntimeError("view size is not compatible")

    bad = Parts(8, 8, good.qkv, broken, good.fc1, good.fc2, good.ln1, good.ln2)
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    y = run_steps(good, x, 2, F.gelu, CORRECT)
    found = explain([bad, good], x, y, (2,), max_size=1)
    assert found.match is not None and found.match.reading == 1 and found.match.deviations == ()


def test_a_catalogue_entry_and_the_count_of_single_variants():
    assert MISTAKES["wrong_scale"].lesson == (
        "lesson 1: wei = q @ k.transpose(-2, -1) * k.shape[-1] ** -0.5"
    )
    assert (MISTAKES["mask_zero"].explains, len(MISTAKES["wrong_scale"].ways)) == (
        ("future_leak",), 4,
    )  # fmt: skip
    assert [len(v) for v in variants(1)][:3] == [0, 1, 1]
    assert sum(1 for _ in variants(1)) == 1 + len(LESSONS)


# ----- the internal functions' former doctest examples (moved here from their docstrings) ----


def test_affine_is_f_linear_with_these_weights():
    f = affine(torch.eye(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64))
    assert f(torch.zeros(1, 2, dtype=torch.float64)).tolist() == [[1.0, 1.0]]


def test_repeat_heads_interleaves_or_tiles():
    from gptblock.check.mistakes.steps import repeat_heads

    t = torch.arange(2.0).reshape(1, 2, 1, 1)
    assert repeat_heads(t, 2).flatten().tolist() == [0.0, 0.0, 1.0, 1.0]
    assert repeat_heads(t, 2, "tile").flatten().tolist() == [0.0, 1.0, 0.0, 1.0]


def test_a_deviation_describes_itself_with_the_blocks_numbers():
    deviation = next(d for d in DEVIATIONS if d.mistake == "wrong_scale")
    assert deviation.describe(C=32, n_head=4) == (
        "scores scaled by C ** -0.5 = 0.1768 (C=32) instead of hs ** -0.5 = 0.3536 (hs=8)"
    )
    assert compose([deviation]).scale(32, 8) == 32**-0.5


def test_distance_is_relative_to_the_largest_entry():
    y = torch.ones(1, 2, 4, dtype=torch.float64)
    assert (distance(y, y), round(distance(1.5 * y, y), 12), distance(y, y[0])) == (
        0.0,
        0.5,
        float("inf"),
    )


# ----- public code's ways of known mistakes (blocks of our own writing, shaped like theirs) ----


class _Head(nn.Module):
    def __init__(self, C: int, hs: int, scale_power: float | None) -> None:
        super().__init__()
        self.key, self.query, self.value = (nn.Linear(C, hs, bias=False) for _ in range(3))
        self.register_buffer("tril", torch.tril(torch.ones(8, 8)))
        self.scale_power = scale_power

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        k, q = self.key(x), self.query(x)
        power = self.scale_power  # of C; None: the lesson's hs ** -0.5
        wei = q @ k.transpose(-2, -1) * (k.shape[-1] ** -0.5 if power is None else C**power)
        wei = F.softmax(wei.masked_fill(self.tril[:T, :T] == 0, float("-inf")), dim=-1)
        return wei @ self.value(x)


class _PublicShapedBlock(nn.Module):
    def __init__(self, n_embd: int = 16, scale_power: float | None = None, normed: str = ""):
        super().__init__()
        self.heads = nn.ModuleList(_Head(n_embd, n_embd // 4, scale_power) for _ in range(4))
        self.proj = nn.Linear(n_embd, n_embd)
        self.ff = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd), nn.ReLU(), nn.Linear(4 * n_embd, n_embd)
        )
        self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.normed = normed  # the branch whose stream is replaced by its normed copy

    def sa(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.cat([h(x) for h in self.heads], dim=-1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.normed == "attn":  # TobiasJacob/tinychatgpt's GptBlock
            x = self.ln1(x)
            x = x + self.sa(x)
        else:
            x = x + self.sa(self.ln1(x))
        if self.normed == "mlp":
            x = self.ln2(x)
            return x + self.ff(x)
        return x + self.ff(self.ln2(x))


@pytest.mark.parametrize("kwargs, diagnosis", [
    ({"scale_power": 0.5}, ["wrong_scale"]),  # devshah21/GPT_from_scartch: * C ** 0.5
    ({"normed": "attn", "scale_power": -0.5}, ["no_residual", "wrong_scale"]),
    ({"normed": "attn"}, ["no_residual"]),
    ({"normed": "mlp"}, ["no_residual"]),
    ({"scale_power": -1.0}, ["wrong_scale"]),  # C ** -1: none of wrong_scale's ways, fitted
    ({"normed": "mlp", "scale_power": -0.75}, ["no_residual", "wrong_scale"]),
])  # fmt: skip
def test_public_ways_of_wrong_scale_and_no_residual_are_named(kwargs, diagnosis):
    from gptblock.check.isolation.check import check_in_process

    torch.manual_seed(0)
    report = check_in_process(_PublicShapedBlock, kwargs, {})
    assert sorted(report.diagnosis) == diagnosis and report.confident, str(report)


def test_a_transposed_mask_is_mask_reversed():
    """The upper triangle where the lower belongs (``triu`` for ``tril``; ``src_mask=causal.T``
    in the s19 unseen set): each position sees itself and the future, was read as future_leak."""
    torch.manual_seed(0)
    block = lesson.Block(32, 4, 16)
    for head in block.sa.heads:
        head.tril = head.tril.T.contiguous()
    report = gptblock.check_block(block, isolate=False)
    assert report.diagnosis == ["mask_reversed"], str(report)


class _OneViewWrong(nn.Module):
    """nanoGPT's attention with one of q, k, v viewed as (B, nh, T, hs) without the transpose
    (torchtune's q in the s56 public set, read as future_leak alone)."""

    def __init__(self, n_embd: int = 32, n_head: int = 4, wrong: str = "q"):
        super().__init__()
        self.c_attn, self.c_proj = nn.Linear(n_embd, 3 * n_embd), nn.Linear(n_embd, n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 64), nn.GELU(), nn.Linear(64, n_embd))
        self.ln_1, self.ln_2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.n_head, self.wrong = n_head, wrong

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        split = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (
            t.reshape(B, self.n_head, T, -1) if name == self.wrong
            else t.reshape(B, T, self.n_head, -1).transpose(1, 2)
            for name, t in zip("qkv", split, strict=True)
        )  # fmt: skip
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp(self.ln_2(x))


@pytest.mark.parametrize("wrong", ["q", "k", "v"])
def test_heads_mixed_in_one_projection_alone_is_heads_mixed(wrong):
    from gptblock.check.isolation.check import check_in_process

    torch.manual_seed(0)
    report = check_in_process(_OneViewWrong, {"wrong": wrong}, {})
    assert report.diagnosis == ["heads_mixed"] and report.confident, str(report)
    assert f"{wrong} alone is reshaped" in str(report)
