"""Reduced-precision weights for generation (bfloat16, int8 with a scale per output row):
each product against a float64 reference of what it promises, generation against float32's
tokens where float32's choice is clear, the loss function against cached decoding token by
token, and the CLI's choice of default."""

import pytest
import torch
from torch.nn import functional as F

from gptblock import GPT, GPTConfig
from gptblock.cli import main
from gptblock.model.generation import weights as W
from gptblock.model.generation.decode import Decoder, GenerationModel
from gptblock.sampling import generation_weights, sample_text
from gptblock.train.evaluate import generation_loss, validation_loss

BF16_ULP = 2.0**-8  # bfloat16's relative rounding step (8 significant bits)


def bf16(t):
    return t.to(torch.bfloat16).double()


@pytest.mark.parametrize("rows", [1, 3, 16, 17, 40])  # the int8 kernel up to 16 rows, then not
@pytest.mark.parametrize("shape", [(48, 32), (65, 384), (7, 24)])  # 24: not a multiple of 16
def test_int8_linear_is_the_rounded_product_with_its_quantised_weight(rows, shape):
    torch.manual_seed(0)
    O, I = shape
    w, b, x = torch.randn(O, I) * 0.05, torch.randn(O), torch.randn(rows, 1, I)
    w[0] = 0.0  # a zero row: scale 1, no division by zero
    linear = W.Int8Linear(w, b)
    # The quantisation: symmetric, per row, the row's largest magnitude at 127.
    assert linear.q.dtype == torch.int8 and int(linear.q.abs().max()) <= 127
    scales = linear.scales.double()[:, None]  # (O, 1)
    assert torch.all((linear.weight.double() - w.double()).abs() <= scales * 0.5 + 1e-9)
    assert torch.equal(linear.weight.double(), linear.q.double() * scales)  # exact in float32
    # The product: the input rounded to bfloat16, times the quantised weight, the result rounded
    # to bfloat16 (a step of it allowed for the summation order), then the float32 bias.
    ref = (bf16(x) @ linear.weight.double().T).reshape(rows, 1, O)
    y = linear(x)
    assert y.dtype == torch.float32 and y.shape == (rows, 1, O)
    err = (y.double() - b.double() - ref).abs()
    assert torch.all(err <= 2 * BF16_ULP * ref.abs() + 1e-6), float(err.max())


def test_bfloat16_linear_is_the_rounded_product_with_its_rounded_weight():
    torch.manual_seed(0)
    w, b, x = torch.randn(40, 32), torch.randn(40), torch.randn(2, 5, 32)
    linear = W.BFloat16Linear(w, b)
    ref = bf16(x) @ bf16(w).T
    err = (linear(x).double() - b.double() - ref).abs()
    assert linear(x).shape == (2, 5, 40) and torch.all(err <= 2 * BF16_ULP * ref.abs() + 1e-6)
    assert torch.equal(linear.weight, w.to(torch.bfloat16).float())


def trained_like(n_embd=32, seed=0):
    """A small GPT whose logits have clear winners: random weights 10x GPT-2's scale."""
    torch.manual_seed(seed)
    cfg = GPTConfig(vocab_size=16, block_size=24, n_layer=2, n_head=2, n_embd=n_embd)
    model = GPT(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(10)
    return model.eval()


@pytest.mark.parametrize("weights", ["bfloat16", "int8"])
def test_generation_keeps_float32s_tokens_where_float32s_choice_is_clear(weights):
    # The reduced weights move these logits by up to 0.07; where float32's best token leads
    # its second by more than 0.2, the reduced weights must choose it too.
    model, prompt = trained_like(), torch.tensor([[1, 2, 3]])
    seq = model.generate(prompt, 40, temperature=0)  # float32's; past block_size 24: it slides
    decoder = Decoder(model, weights)
    with torch.no_grad():  # float32's tokens fed to the reduced cached path (21 positions)
        chosen = [decoder.prefill(seq[:, :3])[0, -1]]
        chosen += [decoder.step(seq[:, t : t + 1])[0, -1] for t in range(3, 23)]
        top2 = model(seq[:, :24]).logits[0, 2:23].topk(2).values  # (21, 2): float32's
    clear = top2[:, 0] - top2[:, 1] > 0.2
    assert int(clear.sum()) >= 10
    assert torch.equal(torch.stack(chosen).argmax(-1)[clear], seq[0, 3:24][clear])
    # End to end: the same tokens up to float32's first unclear choice, then its own.
    out = model.generate(prompt, 40, temperature=0, weights=weights)
    first = int((~clear).nonzero()[0]) if not clear.all() else len(clear)
    assert first >= 1 and torch.equal(out[0, : 3 + first], seq[0, : 3 + first])
    assert out.shape == seq.shape


@pytest.mark.parametrize("weights", ["bfloat16", "int8"])
def test_the_cache_and_the_prompt_path_compute_the_same_logits(weights):
    # Cached steps (the int8 kernel, one row each) against the whole sequence at once (the
    # dequantised product): the same function up to summation order, and both within a few
    # bfloat16 steps of float32's logits.
    model = trained_like()
    idx = torch.randint(0, 16, (2, 20), generator=torch.Generator().manual_seed(1))
    whole, _ = GenerationModel(model, weights)(idx)  # (B, T, V)
    decoder = Decoder(model, weights)
    with torch.no_grad():
        stepped = [decoder.prefill(idx[:, :1])[:, -1]]
        stepped += [decoder.step(idx[:, t : t + 1])[:, -1] for t in range(1, 20)]
        full = model(idx).logits
    scale = float(full.abs().max())
    assert torch.allclose(torch.stack(stepped, 1), whole, atol=0.02 * scale)
    assert torch.allclose(whole, full, atol=0.05 * scale)
    assert not torch.equal(whole, full)  # the reduced weights are in use


def test_generation_loss_is_the_loss_of_decoding_every_window_token_by_token():
    model = trained_like(n_embd=48, seed=2)
    tokens = torch.randint(0, 16, (100,), generator=torch.Generator().manual_seed(3))
    cpu, T = torch.device("cpu"), model.config.block_size
    got = generation_loss(model, tokens, weights="int8", block_size=T, batch_size=2, device=cpu)
    # The oracle: non-overlapping windows of T + 1 tokens, each decoded with the cache, every
    # target scored once, the mean over all of them (a shorter last window included).
    losses = []
    for start in range(0, len(tokens) - 1, T):
        window = tokens[start : start + T + 1]
        decoder = Decoder(model, "int8")
        with torch.no_grad():
            logits = [decoder.prefill(window[None, :1])[0, -1]]
            logits += [
                decoder.step(window[None, t : t + 1])[0, -1] for t in range(1, len(window) - 1)
            ]
        losses.append(F.cross_entropy(torch.stack(logits), window[1:], reduction="none"))
    expected = float(torch.cat(losses).double().mean())
    assert got == pytest.approx(expected, abs=2e-3)
    f32 = generation_loss(model, tokens, weights="float32", block_size=T, batch_size=2, device=cpu)
    assert f32 == validation_loss(model, tokens, block_size=T, batch_size=2, device=cpu)


def test_weights_refused_with_the_value_and_what_was_expected():
    model = trained_like()
    prompt = torch.tensor([[1]])
    with pytest.raises(
        ValueError, match="weights must be one of float32, bfloat16, int8, got 'int4'"
    ):
        model.generate(prompt, 2, weights="int4")
    with pytest.raises(ValueError, match=r"this model's are torch\.bfloat16"):
        model.to(torch.bfloat16).generate(prompt, 2, weights="int8")
    with pytest.raises(ValueError, match="weights must be one of auto, float32"):
        generation_weights("fast", model)


def test_auto_is_int8_only_for_a_large_float32_model_on_a_cpu_with_bfloat16(monkeypatch):
    import gptblock.sampling as sampling

    small = trained_like()  # 2 x 32: 25,000 weights
    large = GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=256))
    assert sum(p.numel() for p in large.parameters() if p.dim() == 2) - 8 * 256 > 1 << 20
    monkeypatch.setattr(sampling, "native_bfloat16", lambda device: True)
    assert generation_weights("auto", large) == "int8"
    assert generation_weights("auto", small) == "float32"
    assert generation_weights("bfloat16", small) == "bfloat16"
    assert generation_weights("auto", large.to(torch.bfloat16)) == "float32"
    monkeypatch.setattr(sampling, "native_bfloat16", lambda device: False)
    assert generation_weights("auto", large.float()) == "float32"


def test_the_cli_samples_with_the_weights_asked_for(monkeypatch, capsys):
    import gptblock.cli.sample as cli_sample

    seen = []
    real = cli_sample.stream_text

    def spy(*args, **kwargs):
        seen.append(kwargs["weights"])
        return real(*args, **kwargs)

    monkeypatch.setattr(cli_sample, "stream_text", spy)
    monkeypatch.setattr("gptblock.sampling.native_bfloat16", lambda device: True)
    run = ["sample", "--max-new-tokens", "3", "--prompt", "a", "--threads", "1"]
    for flags, expected in (([], "int8"), (["--weights", "bfloat16"], "bfloat16")):
        model = trained_like(n_embd=256)  # over a million weights: auto takes int8
        monkeypatch.setattr(cli_sample, "load_source", lambda args, m=model: (m, Chars(), None))
        assert main([*run, *flags]) == 0
        assert seen[-1] == expected
    assert capsys.readouterr().out.startswith("a")


class Chars:
    """A 16-character tokenizer for ``trained_like``'s vocabulary."""

    kind = "char"
    chars = tuple("abcdefghijklmnop")
    vocab_size = 16

    def encode(self, text):
        return [self.chars.index(c) for c in text]

    def decode(self, ids):
        return "".join(self.chars[i] for i in ids)

    def unknown(self, text):
        return sorted(set(text) - set(self.chars))


def test_sample_text_passes_the_weights_on():
    model = trained_like()
    a = sample_text(model, Chars(), "ab", max_new_tokens=8, weights="int8", temperature=0)
    b = sample_text(model, Chars(), "ab", max_new_tokens=8, weights="float32", temperature=0)
    assert len(a) == len(b) == 10 and a.startswith("ab")


def test_the_reduced_copy_is_kept_until_a_parameter_changes():
    from gptblock.model.generation.decode import forget_reduced_weights

    model = trained_like()
    first = Decoder(model, "int8").step_parts
    assert Decoder(model, "int8").step_parts is first  # kept: quantised once
    assert Decoder(model, "bfloat16").step_parts is not first  # another form: made anew
    again = Decoder(model, "int8").step_parts
    assert again is not first and Decoder(model, "int8").step_parts is again
    prompt = torch.tensor([[1, 2, 3]])
    before = model.generate(prompt, 10, temperature=0, weights="int8")
    with torch.no_grad():
        model.lm_head.weight.neg_()  # an in-place change: its version moves
    assert Decoder(model, "int8").step_parts is not again
    after = model.generate(prompt, 10, temperature=0, weights="int8")
    assert not torch.equal(before, after)
    model.load_state_dict(trained_like(seed=5).state_dict())
    kept = Decoder(model, "int8").step_parts
    assert kept is not again and Decoder(model, "int8").step_parts is kept
    forget_reduced_weights(model)
    assert Decoder(model, "int8").step_parts is not kept
