"""The tiny GPT: configuration, initialisation, forward, and generation with and without a cache."""

import dataclasses
import gc
import math

import pytest
import torch
from torch.nn import functional as F

from forms import lesson_block_state_as_mha
from gptblock import GPT, GPTConfig, KVCache, TransformerBlock
from gptblock.lesson import Block as LessonBlock


def tiny(**kw):
    base = dict(vocab_size=13, block_size=12, n_layer=2, n_head=2, n_embd=16)
    base.update(kw)
    return GPTConfig(**base)


def model(seed=0, **kw):
    torch.manual_seed(seed)
    return GPT(tiny(**kw))


# --- config -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw,exc,match",
    [
        ({"vocab_size": 0}, ValueError, "vocab_size must be a positive int, got 0"),
        ({"block_size": -1}, ValueError, "block_size must be a positive int, got -1"),
        ({"n_layer": 1.5}, TypeError, r"n_layer must be an int, got 1.5"),
        ({"n_embd": 10, "n_head": 3}, ValueError, "n_embd=10 is not divisible by n_head=3"),
        ({"dropout": 1.2}, ValueError, r"dropout must be in \[0, 1\), got 1.2"),
        (
            {"activation": "swish"},
            ValueError,
            r"activation must be one of \('gelu', 'relu', 'gelu_tanh', 'relu2'\), got 'swish'",
        ),
        (
            {"block": "flash"},
            ValueError,
            r"block must be one of \('fused', 'mha', 'lesson'\), got 'flash'",
        ),
        ({"block": "lesson"}, ValueError, "it needs activation='relu', got 'gelu'"),
        (
            {"block": "lesson", "activation": "relu", "bias": False},
            ValueError,
            "it needs bias=True",
        ),
        ({"bias": 1}, TypeError, "bias must be a bool, got 1"),
    ],
)
def test_config_errors_name_the_value(kw, exc, match):
    with pytest.raises(exc, match=match):
        tiny(**kw)


def test_config_is_frozen_and_round_trips_as_a_dict():
    cfg = tiny(dropout=0.1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.n_layer = 3
    assert GPTConfig(**dataclasses.asdict(cfg)) == cfg


# --- structure and initialisation -------------------------------------------------------------


def test_gpt2_names_and_weight_tying():
    m = model()
    names = set(dict(m.named_parameters()))
    assert {"transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight"} <= names
    assert m.lm_head.weight is m.transformer.wte.weight
    assert "lm_head.weight" not in names  # tied: one parameter, listed once


def test_gpt2_initialisation():
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=500, block_size=64, n_layer=4, n_head=4, n_embd=128)
    m = GPT(cfg)
    resid = 0.02 / math.sqrt(2 * cfg.n_layer)
    for name, p in m.named_parameters():
        if name.endswith(("out_proj.weight", "linear2.weight")):
            assert p.std().item() == pytest.approx(resid, rel=0.05), name
        elif name.endswith("bias"):
            assert torch.equal(p, torch.zeros_like(p)), name
        elif p.dim() >= 2:
            assert p.std().item() == pytest.approx(0.02, rel=0.05), name
            assert abs(p.mean().item()) < 0.002, name
        else:
            assert torch.equal(p, torch.ones_like(p)), name


def test_loss_at_initialisation_is_about_log_vocab():
    # Small initial weights give near-uniform predictions: loss ~ ln(V).
    m = model(vocab_size=65)
    idx, targets = torch.randint(0, 65, (2, 8, 12))
    _, loss = m(idx, targets)
    assert loss.item() == pytest.approx(math.log(65), abs=0.1)


def test_num_params():
    m = model()
    total = sum(p.numel() for p in m.parameters())
    assert m.num_params(exclude_position_embeddings=False) == total
    assert m.num_params() == total - 12 * 16


# --- forward ----------------------------------------------------------------------------------


def test_loss_is_the_cross_entropy_of_the_logits():
    m = model().double()
    idx = torch.randint(0, 13, (3, 7))
    targets = torch.randint(0, 13, (3, 7))
    targets[0, :2] = -1  # ignored positions
    logits, loss = m(idx, targets)
    assert logits.shape == (3, 7, 13)
    ref = F.cross_entropy(logits.reshape(-1, 13), targets.reshape(-1), ignore_index=-1)
    torch.testing.assert_close(loss, ref, atol=0, rtol=0)
    assert m(idx).loss is None


def test_too_long_input_names_T_and_block_size():
    with pytest.raises(ValueError, match="T=13 exceeds block_size=12"):
        model()(torch.zeros(1, 13, dtype=torch.long))


@pytest.mark.parametrize("bad", [13, 100, -1])
def test_token_ids_outside_the_vocabulary(bad):
    idx = torch.zeros(2, 4, dtype=torch.long)
    idx[1, 2] = bad
    with pytest.raises(
        ValueError, match=rf"idx contains token id {bad}, outside the vocabulary \[0, 13\)"
    ):
        model()(idx)


def test_bad_targets_and_dtypes():
    m = model()
    idx = torch.zeros(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="targets contains token id 13"):
        m(idx, torch.full((2, 4), 13))
    with pytest.raises(
        ValueError, match=r"targets must have the shape of idx \(2, 4\), got \(2, 3\)"
    ):
        m(idx, torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(
        TypeError,
        match=r"idx must be a \(B, T\) tensor of token ids of dtype torch.int64 or torch.int32",
    ):
        m(torch.zeros(2, 4))
    with pytest.raises(
        ValueError, match=r"non-empty \(B, T\) tensor of token ids, got shape \(4,\)"
    ):
        m(torch.zeros(4, dtype=torch.long))


def test_every_block_form_gives_the_same_logits_for_the_same_weights():
    cfg = dict(activation="relu", dropout=0.0)
    fused, mha = model(block="fused", **cfg).double(), model(seed=1, block="mha", **cfg).double()
    lesson = model(seed=2, block="lesson", **cfg).double()
    # fused and mha share every parameter name; the lesson's blocks are re-packed.
    state = fused.state_dict()
    mha.load_state_dict(state, strict=True)
    lesson_state = {
        k: v for k, v in lesson.state_dict().items() if not k.startswith("transformer.h.")
    }
    for i, block in enumerate(lesson.transformer.h):
        for k, v in lesson_block_state_as_mha(block).items():
            lesson_state[f"transformer.h.{i}.{k}"] = v
    for k, v in lesson_state.items():  # zero in_proj_bias: the lesson's q/k/v have none
        state[k] = v
    fused.load_state_dict(state, strict=True)
    mha.load_state_dict(state, strict=True)
    idx = torch.randint(0, 13, (2, 12))
    ref = lesson(idx).logits
    torch.testing.assert_close(fused(idx).logits, ref, atol=1e-10, rtol=0)
    torch.testing.assert_close(mha(idx).logits, ref, atol=1e-10, rtol=0)


# --- generation -------------------------------------------------------------------------------


def steps(m, idx, n, use_cache, seed=0, **kw):
    g = torch.Generator().manual_seed(seed)
    out = list(m.stream(idx, n, use_cache=use_cache, generator=g, **kw))
    return torch.stack([s.logits for s in out]), torch.cat([s.token for s in out], dim=1)


@pytest.mark.parametrize("prompt_len", [1, 5, 12, 15])
def test_cached_and_uncached_generation_agree_at_every_step(prompt_len):
    # 20 new tokens with block_size 12: the window fills and then slides, so the cache is
    # rebuilt; logits must still match the uncached (nanoGPT-style) path step by step.
    m = model()
    idx = torch.randint(0, 13, (3, prompt_len))
    logits_c, tokens_c = steps(m, idx, 20, use_cache=True)
    logits_u, tokens_u = steps(m, idx, 20, use_cache=False)
    torch.testing.assert_close(logits_c, logits_u, atol=1e-5, rtol=0)
    assert torch.equal(tokens_c, tokens_u)


def test_generate_is_reproducible_with_a_generator_and_cache_agnostic():
    m = model()
    idx = torch.randint(0, 13, (2, 3))
    out = [
        m.generate(idx, 15, generator=torch.Generator().manual_seed(7), use_cache=c)
        for c in (True, True, False)
    ]
    assert out[0].shape == (2, 18)
    assert torch.equal(out[0][:, :3], idx)
    assert torch.equal(out[0], out[1]) and torch.equal(out[0], out[2])


def test_temperature_zero_is_greedy():
    m = model()
    idx = torch.randint(0, 13, (2, 3))
    logits, tokens = steps(m, idx, 10, use_cache=True, temperature=0.0)
    assert torch.equal(tokens, logits.argmax(-1).T)
    # top_k=1 at any temperature is greedy too
    assert torch.equal(
        m.generate(idx, 10, temperature=0), m.generate(idx, 10, temperature=5.0, top_k=1)
    )


def test_top_k_restricts_the_choice_and_is_clamped():
    m = model()
    idx = torch.randint(0, 13, (4, 2))
    logits, tokens = steps(m, idx, 12, use_cache=True, top_k=3, temperature=2.0)
    top3 = logits.topk(3, dim=-1).indices  # (steps, B, 3)
    assert (top3 == tokens.T[..., None]).any(-1).all()
    g = torch.Generator().manual_seed(0)
    big = m.generate(idx, 5, top_k=1000, generator=g)
    g = torch.Generator().manual_seed(0)
    assert torch.equal(big, m.generate(idx, 5, top_k=None, generator=g))


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"temperature": -0.5}, "temperature must be a finite number >= 0"),
        ({"top_k": 0}, "top_k must be a positive int or None, got 0"),
        ({"max_new_tokens": -1}, "max_new_tokens must be an int >= 0, got -1"),
        ({"temperature": 0, "top_k": 5}, r"top_k=5 acts only when sampling \(temperature > 0\)"),
    ],
)
def test_generate_argument_errors(kw, match):
    args = {"max_new_tokens": 3, **kw}
    with pytest.raises(ValueError, match=match):
        model().generate(torch.zeros(1, 2, dtype=torch.long), **args)


def test_stream_checks_its_arguments_when_called():
    with pytest.raises(ValueError, match="top_k must be a positive int or None"):
        model().stream(torch.zeros(1, 2, dtype=torch.long), 3, top_k=0)  # no next() needed


def test_empty_prompt_and_zero_tokens():
    m = model()
    with pytest.raises(
        ValueError, match=r"non-empty \(B, T\) tensor of token ids, got shape \(1, 0\)"
    ):
        m.generate(torch.zeros(1, 0, dtype=torch.long), 3)
    idx = torch.randint(0, 13, (2, 4))
    assert torch.equal(m.generate(idx, 0), idx)


def test_mode_is_restored_and_grad_mode_untouched():
    m = model(dropout=0.2).train()
    m.generate(torch.zeros(1, 2, dtype=torch.long), 3)
    assert m.training
    m.eval()
    m.generate(torch.zeros(1, 2, dtype=torch.long), 3)
    assert not m.training
    assert torch.is_grad_enabled()


@pytest.mark.parametrize("block", ["mha", "lesson"])
def test_the_cache_works_for_every_block_form(block):
    # Only FusedBlock has a KV cache; the other forms generate through fused copies.
    m = model(block=block, activation="relu")
    idx = torch.randint(0, 13, (2, 3))
    logits_c, tokens_c = steps(m, idx, 15, use_cache=True)
    logits_u, tokens_u = steps(m, idx, 15, use_cache=False)
    torch.testing.assert_close(logits_c, logits_u, atol=1e-5, rtol=0)
    assert torch.equal(tokens_c, tokens_u)
    assert isinstance(m.transformer.h[0], (TransformerBlock, LessonBlock))  # the model is unchanged


def test_cache_is_released_after_the_call():
    m = model()
    m.generate(torch.zeros(2, 2, dtype=torch.long), 5)
    gc.collect()
    assert not [o for o in gc.get_objects() if type(o) is KVCache]


def test_generate_long_prompt_is_cropped():
    m = model()
    idx = torch.randint(0, 13, (1, 30))  # longer than block_size 12
    out = m.generate(idx, 4, temperature=0)
    assert out.shape == (1, 34) and torch.equal(out[:, :30], idx)
    assert torch.equal(out[:, 30:], m.generate(idx[:, -12:], 4, temperature=0)[:, 12:])


@pytest.mark.parametrize("train", [True, False])
def test_forward_compiles_into_one_graph(train):
    # Reading the ids' range on the host would break the graph (and, on a GPU, make the host
    # wait for the device every step); under torch.compile the check is skipped.
    m = model().train(train)
    idx = torch.randint(0, 13, (2, 6))
    explanation = torch._dynamo.explain(m)(idx, idx)
    assert explanation.graph_break_count == 0, explanation.break_reasons


def test_eval_mode_still_checks_the_ids_range():
    idx = torch.zeros(1, 4, dtype=torch.long)
    idx[0, 1] = 13
    with pytest.raises(ValueError, match="idx contains token id 13"):
        model().eval()(idx)
