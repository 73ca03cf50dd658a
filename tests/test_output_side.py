"""The output side's options (issue 22): zero-initialised output projections, logit soft-capping,
and Muon's momentum as a setting.

The soft cap is checked against NumPy (logits and loss), through every path that computes
logits (cached generation, the lens, the checkpoint), and against the exports that cannot hold
it; zero-init against what a model whose blocks are the identity computes.
"""

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gptblock import GPT, GPTConfig, RunMeta
from gptblock.blocks.config import applicable
from gptblock.data.batches import CharTokenizer
from gptblock.interop.hf import save_hf, to_hf
from gptblock.lens.readout import direct_logit_attribution, logit_lens
from gptblock.model.generation.decode import Decoder
from gptblock.model.head import soft_cap
from gptblock.train.config import TrainConfig, configure_optimizer
from gptblock.train.presets import preset_settings


def gpt(seed=0, **options):
    torch.manual_seed(seed)
    options = applicable(GPTConfig, options)  # a sampled value that could not act: dropped
    config = GPTConfig(vocab_size=13, block_size=10, n_layer=2, n_head=4, n_embd=16, **options)
    return GPT(config).double().eval()


def np_loss(logits, targets):
    """Mean cross-entropy of (N, V) logits over targets (N,), -1 skipped: NumPy, float64."""
    z = logits - logits.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    keep = targets >= 0
    return -logp[keep, targets[keep]].mean()


@pytest.mark.parametrize("cap", [0.5, 3.0, 15.0])
def test_soft_capped_logits_and_loss_equal_numpys(cap):
    capped = gpt(logit_softcap=cap)
    plain = gpt(logit_softcap=None)
    plain.load_state_dict(capped.state_dict())  # the same weights: the cap is no parameter
    idx = torch.randint(0, 13, (3, 7), generator=torch.Generator().manual_seed(1))
    targets = idx.roll(-1, dims=1)
    targets[0, -1] = -1  # a position without a target
    with torch.no_grad():
        for p in capped.parameters():  # logits of a few units, so the cap bends them
            p.mul_(3)
        plain.load_state_dict(capped.state_dict())
        raw = plain(idx).logits.numpy()  # (B, T, V) before any cap
        logits, loss = capped(idx, targets)
    want = cap * np.tanh(raw / cap)
    np.testing.assert_allclose(logits.numpy(), want, rtol=0, atol=1e-12)
    assert np.abs(logits.numpy()).max() < cap < np.abs(raw).max() + cap  # bounded by the cap
    ref = np_loss(want.reshape(-1, 13), targets.reshape(-1).numpy())
    assert abs(float(loss) - ref) < 1e-12


def test_soft_cap_is_the_identity_near_zero_and_its_gradient_is_tanhs():
    x = torch.linspace(-40, 40, 81, dtype=torch.float64, requires_grad=True)
    y = soft_cap(x, 15.0)
    y.sum().backward()
    grad = 1 - np.tanh(x.detach().numpy() / 15.0) ** 2  # d/dx cap * tanh(x / cap)
    np.testing.assert_allclose(x.grad.numpy(), grad, rtol=0, atol=1e-14)
    small = torch.tensor([1e-3], dtype=torch.float64)
    assert abs(float(soft_cap(small, 15.0)) - 1e-3) < 1e-11  # slope 1 at 0
    assert soft_cap(x, None) is x


OPTIONS = st.fixed_dictionaries(
    {
        "logit_softcap": st.sampled_from([None, 0.7, 15.0]),
        "zero_init_proj": st.booleans(),
        "tie_embeddings": st.booleans(),
        "position": st.sampled_from(["learned", "rope"]),
        "norm": st.sampled_from(["layernorm", "rmsnorm"]),
        "qk_norm": st.booleans(),
    }
)


def perturbed(**options):
    """A model of ``options`` whose zero-initialised weights are moved off zero, as training
    would move them (a zero projection hides every path through its block)."""
    model = gpt(**options)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


@settings(max_examples=15, deadline=None)
@given(options=OPTIONS)
def test_cached_generation_equals_recompute(options):
    model = perturbed(**options)
    idx = torch.randint(0, 13, (2, 7), generator=torch.Generator().manual_seed(2))
    full = model(idx).logits  # (B, T, V)
    with torch.no_grad():
        decoder = Decoder(model)
        steps = [decoder.prefill(idx[:, :4])]
        steps += [decoder.step(idx[:, t : t + 1]) for t in range(4, 7)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-10)
    a = model.generate(idx[:, :3], 9, temperature=0)  # slides past block_size
    b = model.generate(idx[:, :3], 9, temperature=0, use_cache=False)
    assert torch.equal(a, b)


@settings(max_examples=10, deadline=None)
@given(options=OPTIONS)
def test_the_lens_holds_its_identities_with_the_options(options):
    model = perturbed(**options)
    idx = torch.randint(0, 13, (1, 6), generator=torch.Generator().manual_seed(3))
    run = model.run_with_cache(idx)
    torch.testing.assert_close(run.logits, model(idx).logits, rtol=0, atol=1e-12)
    a = direct_logit_attribution(model, run, token=3)
    # The parts add up to the logit before the cap; capped, that is the model's logit.
    assert abs(float(a.values.sum()) + a.bias - a.logit) < 1e-10
    cap = options["logit_softcap"]
    assert a.softcap == cap
    capped = a.logit if cap is None else cap * np.tanh(a.logit / cap)
    assert abs(capped - float(run.logits[0, -1, 3].detach())) < 1e-10
    lens = logit_lens(model, run.cache)
    torch.testing.assert_close(lens.probs[-1], run.logits[0].softmax(-1), rtol=0, atol=1e-12)


def test_attribution_refuses_another_capped_models_run():
    a, b = perturbed(logit_softcap=2.0), gpt(seed=5, logit_softcap=2.0)
    run = a.run_with_cache(torch.tensor([[1, 2, 3]]))
    with pytest.raises(ValueError, match="not this model's own run_with_cache result"):
        direct_logit_attribution(b, run, token=4)


def test_zero_init_starts_every_block_as_the_identity():
    for tied in (True, False):
        model = gpt(zero_init_proj=True, tie_embeddings=tied)
        zero = {n for n, p in model.named_parameters() if not p.any()}
        want = {f"transformer.h.{i}.{w}.weight" for i in (0, 1) for w in ("self_attn.out_proj", "linear2")}  # fmt: skip
        assert zero - {n for n in zero if n.endswith("bias")} == want | (set() if tied else {"lm_head.weight"})  # fmt: skip
        idx = torch.randint(0, 13, (2, 5))
        with (
            torch.no_grad()
        ):  # the blocks add nothing: the head reads the final norm of the embedding
            x = model.wte(idx) + model.wpe.weight[:5]  # (B, T, C)
            want_logits = model.transformer["ln_f"](x) @ model.lm_head.weight.T  # (B, T, V)
            torch.testing.assert_close(model(idx).logits, want_logits, rtol=0, atol=1e-12)
    default = gpt()
    assert all(p.any() for n, p in default.named_parameters() if n.endswith("proj.weight"))


def test_zero_init_projections_learn():
    model = gpt(zero_init_proj=True).float().train()
    opt = configure_optimizer(model, TrainConfig(optimizer="muon", lr=1e-2))
    idx = torch.randint(0, 13, (4, 8))
    for _ in range(2):  # the first step moves the projections, the second the rest
        opt.zero_grad()
        model(idx, targets=idx).loss.backward()
        opt.step()
    assert all(p.any() for n, p in model.named_parameters() if n.endswith(".weight"))


@pytest.mark.parametrize(
    "options, message",
    [
        ({"logit_softcap": 0.0}, r"logit_softcap must be None or a float in \(0, 10000\], got 0.0"),
        ({"logit_softcap": -15.0}, r"logit_softcap must be .*, got -15.0"),
        ({"logit_softcap": float("nan")}, r"logit_softcap must be .*, got nan"),
        ({"logit_softcap": float("inf")}, r"logit_softcap must be .*, got inf"),
        ({"logit_softcap": True}, r"logit_softcap must be None or a float, got True"),
        ({"logit_softcap": "15"}, r"logit_softcap must be None or a float, got '15'"),
        ({"zero_init_proj": 1}, r"zero_init_proj must be a bool, got 1"),
    ],
)
def test_bad_values_name_the_value(options, message):
    with pytest.raises((ValueError, TypeError), match=message):
        GPTConfig(13, 8, 1, 2, 16, **options)


def test_the_config_round_trips_and_old_configs_have_neither():
    config = GPTConfig(13, 8, 1, 2, 16, logit_softcap=15, zero_init_proj=True)
    assert config.logit_softcap == 15.0 and isinstance(config.logit_softcap, float)
    assert GPTConfig(**dataclasses.asdict(config)) == config
    meta = RunMeta(config, CharTokenizer(list("abcdefghijklm")))
    assert RunMeta.from_json(meta.to_json(), "test").model_config == config
    old = GPTConfig(vocab_size=13, block_size=8, n_layer=1, n_head=2, n_embd=16)
    assert old.logit_softcap is None and old.zero_init_proj is False


RUN = dict(
    n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=4, max_iters=4, eval_interval=2,
    eval_iters=1, warmup=1, progress=False, device="cpu", logit_softcap=5.0, zero_init_proj=True,
    muon_momentum=0.8,
)  # fmt: skip


def test_a_capped_gpt_trains_saves_loads_and_resumes(tmp_path):
    from gptblock import load_gpt, train_gpt
    from gptblock.data.text import default_corpus
    from gptblock.runs.checkpoint import load_checkpoint
    from gptblock.train.run import prepare_run

    text = default_corpus()[:3000]
    run = train_gpt(text=text, out_dir=tmp_path, seed=3, **RUN)
    assert run.train_config.muon_momentum == 0.8
    model, tok, _ = load_gpt(tmp_path, kind="last")
    assert model.config == run.meta.model_config and model.config.logit_softcap == 5.0
    idx = torch.tensor([tok.encode("The ")])
    torch.testing.assert_close(model(idx).logits, run.model.eval()(idx).logits, rtol=0, atol=0)
    with prepare_run(text=text, out_dir=tmp_path, seed=3, resume=True, **{**RUN, "max_iters": 6}) as again:  # fmt: skip
        again.fit()
    assert load_checkpoint(tmp_path).meta["step"] == 6
    with pytest.raises(ValueError, match=r"logit_softcap=5\.0 in the checkpoint"):
        train_gpt(text=text, out_dir=tmp_path, resume=True, **{**RUN, "logit_softcap": 6.0, "max_iters": 8})  # fmt: skip


@pytest.mark.parametrize("family", [None, "gpt2", "llama"])
def test_the_hugging_face_formats_refuse_a_soft_cap(tmp_path, family):
    model = GPT(GPTConfig(13, 8, 1, 2, 16, logit_softcap=15.0))
    with pytest.raises(ValueError, match=r"^Hugging Face's formats have no logit_softcap=15\.0$"):
        to_hf(model, family)
    with pytest.raises(ValueError, match=r"logit_softcap=15\.0"):
        save_hf(model, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
    to_hf(GPT(GPTConfig(13, 8, 1, 2, 16, zero_init_proj=True)))  # only an initialisation


def test_muon_momentum_is_a_setting_of_muon_runs_only():
    s = preset_settings("shakespeare-cpu", {"muon_momentum": 0.9})
    config = s.train_config(dtype="float32")
    assert config.muon_momentum == 0.9
    groups = configure_optimizer(GPT(s.model_config(vocab_size=13)), config).param_groups
    assert {g["momentum"] for g in groups if g["algorithm"] == "muon"} == {0.9}
    with pytest.raises(ValueError, match=r"muon_momentum=0.9 acts only with optimizer='muon'"):
        preset_settings("tiny", {"muon_momentum": 0.9})
    with pytest.raises(ValueError, match=r"muon_momentum must be in \[0, 1\), got 1.0"):
        preset_settings("shakespeare-cpu", {"muon_momentum": 1.0})
