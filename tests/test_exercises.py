"""The lesson's exercises: their numbers checked against independent computations, and the CLI."""

import dataclasses
import math
import pathlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import gptblock.cli.exercises as cli_exercises
from gptblock import lesson
from gptblock.cli import main
from gptblock.exercises import exercise1, exercise2, exercise3, on_learner, run_all
from gptblock.reference import causal_head

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs" / "exercises.md"


# --- Exercise 1 -------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exercise1_passes_and_reports_consistent_numbers(seed):
    r = exercise1(seed)
    assert r.passed and [row.d_k for row in r.rows] == [4, 16, 64, 256]
    for row in r.rows:
        # the unscaled and scaled variances are one sample, so they differ by exactly d_k
        assert row.var_raw == pytest.approx(row.d_k * row.var_scaled, rel=1e-12)
        assert row.z == pytest.approx((row.var_scaled - 1) / row.std_error, rel=1e-12)


def test_exercise1_standard_error_matches_the_spread_over_repeated_runs():
    # The derived standard error (with the 4th moment 3 d_k^2 + 6 d_k) against the actual spread
    # of the sample variance over 1000 independent runs (the spread is itself estimated to ~3%).
    # At d_k = 4 the naive sqrt(2 / N), which forgets the 6 / d_k, is 32% too small.
    N, d, runs = 400, 4, 1000
    rows = [exercise1(seed, d_ks=(d,), n_samples=N).rows[0] for seed in range(runs)]
    spread = np.std([row.var_scaled for row in rows], ddof=1)
    predicted = rows[0].std_error
    assert abs(spread / predicted - 1) < 0.1
    assert abs(spread / math.sqrt(2 / N) - 1) > 0.2
    assert abs(np.mean([row.var_scaled for row in rows]) - 1) < 4 * predicted / math.sqrt(runs)


def test_exercise1_band_rejects_the_wrong_scalings():
    # Scaling by 1/d_k (variance 1/d_k) or not at all (variance d_k) is far outside the band.
    for row in exercise1(0).rows:
        band = 5 * row.std_error
        assert band < 0.1
        assert abs(1 / row.d_k - 1) > band and abs(row.d_k - 1) > band


def test_exercise1_rejects_too_few_samples():
    with pytest.raises(ValueError, match="n_samples"):
        exercise1(0, n_samples=3)


# --- Exercise 2 -------------------------------------------------------------------------------


@pytest.mark.parametrize("T", [1, 5, 16])
def test_causal_head_matches_torch_sdpa(T):
    rng = np.random.default_rng(T)
    q, k, v = rng.standard_normal((3, 2, T, 4))  # (B, T, hs) each
    out, wei = causal_head(q, k, v)
    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
    expected = F.scaled_dot_product_attention(tq, tk, tv, is_causal=True).numpy()
    np.testing.assert_allclose(out, expected, atol=1e-12, rtol=0)
    scores = (tq @ tk.transpose(-2, -1)) / 2.0  # sqrt(hs) = 2
    future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    expected_wei = torch.softmax(scores.masked_fill(future, float("-inf")), -1).numpy()
    np.testing.assert_allclose(wei, expected_wei, atol=1e-12, rtol=0)


def test_exercise2_passes_with_exact_zeros():
    r = exercise2(0)
    assert r.passed and r.max_future_weight == 0.0 and r.max_row_sum_error <= 1e-12
    assert exercise2(0, T=1).passed  # no future positions at all


# --- Exercise 3 -------------------------------------------------------------------------------


def test_exercise3_numbers_match_torch_entropies():
    r = exercise3(7, n_draws=200)
    # The same draws, in the same order, with entropies computed by torch.
    rng = np.random.default_rng(7)
    q = torch.from_numpy(rng.standard_normal((200, 64)))
    keys = torch.from_numpy(rng.standard_normal((200, 6, 64)))
    raw = (keys @ q[:, :, None])[..., 0]  # (n, 6, 64) @ (n, 64, 1) -> (n, 6)
    bits = math.log(2)
    h_raw = torch.distributions.Categorical(logits=raw).entropy() / bits
    h_scaled = torch.distributions.Categorical(logits=raw / 8).entropy() / bits
    assert r.mean_entropy_raw == pytest.approx(h_raw.mean().item(), abs=1e-10)
    assert r.mean_entropy_scaled == pytest.approx(h_scaled.mean().item(), abs=1e-10)
    assert r.fraction_higher == (h_scaled > h_raw).double().mean().item() == 1.0
    assert r.min_gap == pytest.approx((h_scaled - h_raw).min().item(), abs=1e-10)
    assert r.passed and r.scale == 1 / 8


@pytest.mark.parametrize("d_k,scale", [(4, 0.5), (64, None), (256, 0.9)])
def test_exercise3_holds_in_every_draw_for_any_scale_below_one(d_k, scale):
    assert exercise3(1, n_draws=300, d_k=d_k, scale=scale).fraction_higher == 1.0


def test_exercise3_fails_when_the_scale_sharpens():
    r = exercise3(0, scale=8.0)
    assert not r.passed and r.fraction_higher == 0.0


# --- the docs quote the default run -----------------------------------------------------------


def test_docs_quote_the_numbers_the_default_run_gives():
    text = DOCS.read_text()
    ex1, _, ex3 = run_all(0)
    for value in (ex3.mean_entropy_raw, ex3.mean_entropy_scaled):
        assert f"{value:.4f}" in text
    for value in (ex3.mean_max_weight_raw, ex3.mean_max_weight_scaled):
        assert f"{value:.4f}" in text and f"{value:.2f}" in text
    assert f"{ex3.min_gap:.4f}" in text
    assert f"{ex1.rows[0].std_error:.4f}" in text and f"{ex1.rows[-1].std_error:.4f}" in text


# --- the command line -------------------------------------------------------------------------


def test_cli_passes_and_is_reproducible(capsys):
    assert main(["exercises", "--seed", "5"]) == 0
    first = capsys.readouterr().out
    assert first.count("PASS") == 4 + 3 + 1  # four d_k rows, three exercises, the summary
    assert "FAIL" not in first
    assert main(["exercises", "--seed", "5"]) == 0
    assert capsys.readouterr().out == first
    assert main(["exercises", "--seed", "6"]) == 0
    assert capsys.readouterr().out != first


def test_cli_exits_1_on_a_fail(capsys, monkeypatch):
    ex1, ex2, ex3 = run_all(0)
    failing = dataclasses.replace(ex2, max_future_weight=0.25, passed=False)
    monkeypatch.setattr(cli_exercises, "run_all", lambda seed: (ex1, failing, ex3))
    assert main(["exercises"]) == 1
    out = capsys.readouterr().out
    assert "FAIL: exercise [2]" in out and "0.25" in out


def test_cli_rejects_a_negative_seed_in_one_line(capsys):
    assert main(["exercises", "--seed", "-1"]) == 2
    assert capsys.readouterr().err.strip() == (
        "gptblock exercises: error: --seed must be an int in [0, 2**63 - 1], got -1"
    )


def test_cli_help_shows_the_default_seed(capsys):
    with pytest.raises(SystemExit):
        main(["exercises", "--help"])
    assert "(default: 0)" in capsys.readouterr().out


# --- the exercises on the learner's own classes (--on) ----------------------------------------

LECTURE = pathlib.Path(__file__).parent / "zoo_public" / "blocks" / "ng_video_lecture.py"


def test_on_runs_the_exercises_on_the_learners_classes_isolated(tmp_path, capsys):
    assert main(["exercises", "--on", str(LECTURE)]) == 0  # the lecture's own classes
    out = capsys.readouterr().out
    said = [line.split(maxsplit=1)[0] for line in out.splitlines() if line.startswith("  ")]
    assert said == ["holds"] * 12 and out.rstrip().endswith(
        "PASS: every exercise holds on " + str(LECTURE)
    )
    assert "768 = 3 C hs at C=32, hs=8" in out and "(2, 6, 32) -> (2, 6, 8)" in out  # a head's
    assert "4,128 = 4 C^2 + C at C=32" in out and "12,608 = 12 C^2 + 10 C at C=32" in out
    mistaken = tmp_path / "my_gpt.py"  # no mask, and a typo in the MLP's forward
    mask = 'wei = wei.masked_fill(self.tril[:T, :T] == 0, float("-inf"))'
    text = LECTURE.read_text().replace(mask, "pass").replace("self.net(x)", "self.nett(x)")
    mistaken.write_text(text)
    assert main(["exercises", "--on", str(mistaken)]) == 1
    out = capsys.readouterr().out
    leak = "the mask            changing token 1 moved the output at 0: it sees a later token"
    typo = "calling it raised AttributeError: 'FeedFoward' object has no attribute 'nett'"
    assert out.count(leak) == 2 and out.count(typo) == 3 and "12,608 = 12 C^2" in out, out
    assert out.rstrip().endswith(
        "FAIL: Head: the mask; MultiHeadAttention: the mask; Block: shapes; Block: the mask; "
        "Block: the worked example"
    ), out


def test_a_learners_error_is_why_an_exercise_does_not_hold():
    def typo(x):
        raise AttributeError("'Block' object has no attribute 'ln3'")

    found = on_learner("Block", typo, 32, 12 * 32 * 32 + 10 * 32)
    assert [(h.exercise, h.holds) for h in found] == [
        ("shapes", False),
        ("the mask", False),
        ("the worked example", False),
        ("parameters", True),
    ]
    assert (
        found[0].said == "calling it raised AttributeError: 'Block' object has no attribute 'ln3'"
    )


@pytest.mark.parametrize("C, nh", [(32, 4), (48, 3)])
def test_the_lessons_own_classes_hold_every_exercise(C, nh):
    torch.manual_seed(0)
    for kind, module in (
        ("Head", lesson.Head(C, C // nh, 8)),
        ("MultiHeadAttention", lesson.MultiHeadAttention(nh, C, 8)),
        ("Block", lesson.Block(C, nh, 8)),
    ):
        module = module.double().eval()

        def forward(x, module=module):
            with torch.no_grad():
                return module(torch.from_numpy(x)).numpy()

        n = sum(p.numel() for p in module.parameters())  # the counts: formulas checked here
        found = on_learner(kind, forward, C, n)
        assert all(h.holds for h in found), [h for h in found if not h.holds]
        mistaken = on_learner(kind, forward, C, n + 1)[-1]
        assert not mistaken.holds and "(1 more)" in mistaken.said


def test_a_leak_and_a_blind_position_are_named():
    w = np.random.default_rng(0).standard_normal((16, 16))
    leaks = on_learner("Block", lambda x: x @ w + x.mean(axis=1, keepdims=True), 16, 0)[1]
    assert not leaks.holds and leaks.said.startswith("changing token 1 moved the output at 0")
    blind = on_learner("Block", lambda x: x @ w, 16, 0)[2]  # each position sees itself only
    assert not blind.holds and blind.said.startswith(
        "changing token 0 did not move the output at 1"
    )


def test_a_class_that_hangs_is_stopped_and_the_next_gets_a_fresh_process(tmp_path):
    from gptblock.check.isolation.check import ask_isolated

    path = tmp_path / "hangs.py"
    path.write_text(
        "import torch.nn as nn\n"
        "class Head(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        while True:\n"
        "            pass\n"
        "class Block(nn.Linear):\n"
        "    def __init__(self):\n"
        "        super().__init__(4, 4)\n"
    )
    targets = [f"{path}:Head", f"{path}:Block"]
    answers = ask_isolated(targets, lambda call, i: call("build")[0]["description"], timeout=3)
    assert answers == ["its process did not finish within 3 s and was stopped", "Block()"]
