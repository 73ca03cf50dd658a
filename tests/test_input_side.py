"""The input side of issue 22: the bigram embedding and the smear (``gptblock.model.embeddings``).

Each against an independent NumPy computation; the cached decoder equal to a recomputation
(the decoder must know the previous tokens), sliding past block_size too; the lens's pass equal
to ``forward`` with its identities; a checkpoint's round trip and resume; Hugging Face's formats
refusing them by name; off by default, and starting at zero (the model without them).
"""

import dataclasses

import numpy as np
import pytest
import torch

from gptblock import GPT, GPTConfig, UserError
from gptblock.blocks.config import applicable
from gptblock.interop.hf import save_hf, to_hf
from gptblock.lens.readout import direct_logit_attribution
from gptblock.model.embeddings import BIGRAM_CAP, InputMix, Smear, bigram_rows
from gptblock.model.footprint import parameter_count
from gptblock.model.generation.decode import Decoder

OPTIONS = [
    {"bigram": True},
    {"smear": True},
    {"bigram": True, "smear": True},
    {"bigram": True, "smear": True, "position": "rope", "qk_norm": True, "norm": "rmsnorm"},
    {"bigram": True, "smear": True, "block": "mha"},
]


def gpt(seed=0, **options):
    """A small GPT in float64 whose input-side parameters are random (they start at zero)."""
    torch.manual_seed(seed)
    options = applicable(GPTConfig, options)  # a sampled value that could not act: dropped
    config = GPTConfig(vocab_size=13, block_size=10, n_layer=2, n_head=4, n_embd=16, **options)
    model = GPT(config).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("transformer.inputs."):
                p.normal_(0.0, 0.5)
    return model


def numpy_bigram(E, idx, V):
    """E[prev * V + cur] by hand: prev is V (no previous token) at the first position."""
    out = np.zeros((*idx.shape, E.shape[1]))
    for b in range(idx.shape[0]):
        for t in range(idx.shape[1]):
            prev = V if t == 0 else int(idx[b, t - 1])
            pair = prev * V + int(idx[b, t])
            if (V + 1) * V > BIGRAM_CAP:  # hashed: (36313 * cur) XOR (27191 * prev) mod cap
                pair = ((36313 * int(idx[b, t])) ^ (27191 * prev)) % BIGRAM_CAP
            out[b, t] = E[pair]
    return out


def numpy_smear(x, gate, scale):
    """x[t] + scale * sigmoid(x[t, :k] . gate) * x[t - 1], t >= 1, as a loop."""
    out = x.copy()
    k = gate.shape[0]
    for b in range(x.shape[0]):
        for t in range(1, x.shape[1]):
            g = 1.0 / (1.0 + np.exp(-(x[b, t, :k] @ gate)))
            out[b, t] = x[b, t] + scale * g * x[b, t - 1]
    return out


@pytest.mark.parametrize("V", [13, 300])  # 300: (V + 1) * V > BIGRAM_CAP, so hashed
def test_the_bigram_embedding_is_the_pairs_row_by_hand(V):
    torch.manual_seed(0)
    mix = InputMix(V, 8, bigram=True, smear=False).double()
    assert mix.bigram is not None and mix.bigram.weight.shape[0] == bigram_rows(V)
    torch.nn.init.normal_(mix.bigram.weight)
    wte = torch.nn.Embedding(V, 8).double()
    idx = torch.randint(0, V, (3, 7))
    expected = wte.weight.detach().numpy()[idx.numpy()] + numpy_bigram(
        mix.bigram.weight.detach().numpy(), idx.numpy(), V
    )
    np.testing.assert_allclose(mix(idx, wte).detach().numpy(), expected, rtol=0, atol=1e-12)


def test_the_exact_table_has_a_row_per_pair_and_one_per_first_token():
    assert bigram_rows(65) == 66 * 65  # the char vocabulary: exact
    assert bigram_rows(256) == BIGRAM_CAP  # 257 * 256 pairs do not fit: hashed


def test_the_smear_is_the_explicit_loop():
    torch.manual_seed(1)
    smear = Smear(16).double()
    with torch.no_grad():
        smear.gate.normal_()
        smear.scale.fill_(0.7)
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    expected = numpy_smear(x.numpy(), smear.gate.detach().numpy(), 0.7)
    np.testing.assert_allclose(smear(x).detach().numpy(), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("options", OPTIONS)
def test_cache_equals_recompute(options):
    model = gpt(**options)
    idx = torch.randint(0, 13, (2, 7), generator=torch.Generator().manual_seed(1))
    full = model(idx).logits  # (B, T, V)
    with torch.no_grad():
        decoder = Decoder(model)
        steps = [decoder.prefill(idx[:, :1])]  # one token: the steps read the ones before
        steps += [decoder.step(idx[:, t : t + 1]) for t in range(1, 7)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-10)
    prompt = idx[:, :3]
    a = model.generate(prompt, 12, temperature=0)  # slides past block_size (10)
    b = model.generate(prompt, 12, temperature=0, use_cache=False)
    assert torch.equal(a, b)
    cached = list(model.stream(prompt, 12, temperature=0))
    recomputed = list(model.stream(prompt, 12, temperature=0, use_cache=False))
    for s, r in zip(cached, recomputed, strict=True):
        torch.testing.assert_close(s.logits, r.logits, rtol=0, atol=1e-10)


def test_the_previous_token_changes_the_cached_step():
    # The decoder's step must read the token before it: the same last token after different
    # ones gives different logits (a decoder that forgot them would give equal ones).
    model = gpt(bigram=True)
    logits = []
    for first in (1, 2):
        decoder = Decoder(model)
        with torch.no_grad():
            decoder.prefill(torch.tensor([[first]]))
            logits.append(decoder.step(torch.tensor([[5]])))
    assert not torch.allclose(logits[0], logits[1])


@pytest.mark.parametrize("weights", ["bfloat16", "int8"])
def test_reduced_weights_cache_equals_their_recompute(weights):
    model = gpt(bigram=True, smear=True).float()
    prompt = torch.randint(0, 13, (2, 3), generator=torch.Generator().manual_seed(2))
    a = model.generate(prompt, 9, temperature=0, weights=weights)
    b = model.generate(prompt, 9, temperature=0, weights=weights, use_cache=False)
    assert torch.equal(a, b)


@pytest.mark.parametrize("options", OPTIONS)
def test_the_lens_runs_the_same_model(options):
    model = gpt(**options)
    idx = torch.randint(0, 13, (1, 6))
    run = model.run_with_cache(idx)
    torch.testing.assert_close(run.logits, model(idx).logits, rtol=0, atol=1e-12)
    direct_logit_attribution(model, run, token=3, position=-1)  # raises if the parts do not add
    # "embed" is everything the input side writes, by hand (learned positions where they are)
    mix = model.transformer["inputs"]
    embed = mix(idx, model.wte)
    if model.wpe is not None:
        embed = embed + model.wpe.weight[:6]
    torch.testing.assert_close(run.cache["embed"], embed, rtol=0, atol=1e-12)


@pytest.mark.parametrize("options", OPTIONS[:3])
def test_they_start_at_zero_and_train(options):
    torch.manual_seed(0)
    model = GPT(GPTConfig(13, 10, 2, 4, 16, **options))
    idx = torch.randint(0, 13, (2, 8))
    without = model._run(idx, model._parts()._replace(inputs=None))
    torch.testing.assert_close(model(idx).logits, without, rtol=0, atol=0)
    assert parameter_count(model.config) == model.num_params(exclude_position_embeddings=False)
    model(idx, targets=idx).loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_off_by_default_and_validated():
    config = GPTConfig(13, 8, 1, 2, 16)
    assert not config.bigram and not config.smear
    assert not any(k.startswith("transformer.inputs") for k in GPT(config).state_dict())
    with pytest.raises(UserError, match="bigram must be a bool, got 'yes'"):
        GPTConfig(13, 8, 1, 2, 16, bigram="yes")  # type: ignore[arg-type]
    with pytest.raises(UserError, match="smear must be a bool, got 1"):
        GPTConfig(13, 8, 1, 2, 16, smear=1)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "options, family", [({"bigram": True}, None), ({"smear": True}, "gpt2"),
                        ({"smear": True, "norm": "rmsnorm", "mlp": "swiglu", "position": "rope",
                          "bias": False}, "llama")],
)  # fmt: skip
def test_hugging_faces_formats_refuse_them_by_name(options, family, tmp_path):
    model = GPT(GPTConfig(13, 8, 1, 2, 16, **options))
    name = next(iter(options))
    with pytest.raises(UserError, match=f"cannot express {name}=True") as e:
        to_hf(model, family)
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match=f"cannot express {name}=True"):
        save_hf(model, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


RUN = dict(
    n_layer=1, n_head=4, n_embd=16, block_size=16, batch_size=4, max_iters=4, eval_interval=2,
    eval_iters=1, warmup=1, progress=False, device="cpu", bigram=True, smear=True,
)  # fmt: skip


def test_trains_saves_loads_and_resumes(tmp_path):
    from gptblock import load_gpt, train_gpt
    from gptblock.data.text import default_corpus
    from gptblock.runs.checkpoint import load_checkpoint
    from gptblock.train.run import prepare_run

    text = default_corpus()[:3000]
    run = train_gpt(text=text, out_dir=tmp_path, seed=3, **RUN)
    model, tok, _ = load_gpt(tmp_path, kind="last")
    assert model.config == run.meta.model_config and model.config.bigram and model.config.smear
    assert model.transformer["inputs"].smear.scale.item() != 0.0  # trained away from zero
    idx = torch.tensor([tok.encode("The ")])
    torch.testing.assert_close(model(idx).logits, run.model.eval()(idx).logits, rtol=0, atol=0)
    with prepare_run(text=text, out_dir=tmp_path, seed=3, resume=True,
                     **{**RUN, "max_iters": 6}) as again:  # fmt: skip
        again.fit()
    assert load_checkpoint(tmp_path).meta["step"] == 6
    with pytest.raises(ValueError, match="bigram=True in the checkpoint, False now"):
        train_gpt(text=text, out_dir=tmp_path, resume=True, **{**RUN, "bigram": False, "max_iters": 8})  # fmt: skip
    assert GPTConfig(**dataclasses.asdict(model.config)) == model.config


def test_the_cli_flag_sets_the_option(tmp_path):
    from gptblock.cli import build_parser
    from gptblock.train.settings import SETTINGS

    args = build_parser().parse_args(["train", "--bigram", "--no-smear"])
    assert args.bigram is True and args.smear is False
    assert {"bigram", "smear"} <= set(SETTINGS)
