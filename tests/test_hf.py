"""Hugging Face GPT-2 on gptblock's blocks: the same logits, the same greedy tokens, both ways."""

import sys

import pytest
import torch

from gptblock import GPT, GPTConfig
from gptblock.errors import UserImportError
from gptblock.interop.hf import from_hf, save_hf, to_hf

transformers = pytest.importorskip("transformers")
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

SHAPES = [  # (vocab, n_positions, n_layer, n_head, n_embd, activation_function)
    (50, 40, 1, 1, 8, "gelu_new"),
    (97, 48, 2, 4, 32, "gelu_new"),
    (64, 40, 3, 2, 16, "relu"),
    (80, 40, 2, 2, 24, "gelu"),
]


def hf_model(vocab, n_positions, n_layer, n_head, n_embd, act, seed=0, **kw):
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=vocab, n_positions=n_positions, n_layer=n_layer, n_head=n_head,
        n_embd=n_embd, activation_function=act, bos_token_id=None, eos_token_id=None,
        initializer_range=0.2, **kw,
    )  # fmt: skip
    return GPT2LMHeadModel(config).eval()


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[2]}x{s[4]}-{s[5]}")
def test_logits_agree_within_1e5(shape):
    hf = hf_model(*shape)
    ours = from_hf(hf)
    idx = torch.randint(0, shape[0], (3, shape[1]))
    with torch.no_grad():
        torch.testing.assert_close(ours(idx).logits, hf(idx).logits, atol=1e-5, rtol=0)
        mha = from_hf(hf, block="mha")
        torch.testing.assert_close(mha(idx).logits, hf(idx).logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[2]}x{s[4]}-{s[5]}")
def test_greedy_generation_is_token_for_token_huggingfaces(shape):
    # 32 tokens after a 4-token prompt and on to the last position GPT-2 has (n_positions):
    # gptblock's KV cache against Hugging Face's, over the whole context both define.
    hf = hf_model(*shape)
    ours = from_hf(hf)
    prompt = torch.randint(0, shape[0], (2, 4))
    new = shape[1] - 4
    # An explicit attention mask: otherwise generate reads token 0 (the pad id) as padding.
    mask = torch.ones_like(prompt)
    theirs = hf.generate(
        prompt, attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=0
    )
    assert theirs.shape[1] == shape[1] and new >= 32
    assert torch.equal(ours.generate(prompt, new, temperature=0), theirs)
    assert torch.equal(ours.generate(prompt, new, temperature=0, use_cache=False), theirs)


def test_gptblock_to_hf_and_back_is_exact():
    torch.manual_seed(1)
    config = GPTConfig(vocab_size=33, block_size=16, n_layer=2, n_head=2, n_embd=16,
                       activation="gelu_tanh")  # fmt: skip
    model = GPT(config).eval()
    back = from_hf(to_hf(model))
    assert back.config == config
    for name, p in model.state_dict().items():
        assert torch.equal(back.state_dict()[name], p), name


def test_every_block_form_exports(tmp_path):
    torch.manual_seed(2)
    config = GPTConfig(vocab_size=20, block_size=8, n_layer=2, n_head=2, n_embd=8,
                       activation="relu", block="lesson")  # fmt: skip
    model = GPT(config).eval()
    idx = torch.randint(0, 20, (2, 8))
    with torch.no_grad():
        torch.testing.assert_close(to_hf(model)(idx).logits, model(idx).logits, atol=1e-5, rtol=0)


def test_a_trained_run_exported_with_save_hf_loads_in_transformers(tmp_path):
    from gptblock import train_gpt
    from gptblock.data.text import default_corpus

    run = train_gpt(text=default_corpus()[:3000], out_dir=None, n_layer=1, n_head=2, n_embd=16,
                    block_size=16, batch_size=4, max_iters=5, eval_interval=5, eval_iters=1,
                    progress=False)  # fmt: skip
    model = run.model.eval()
    save_hf(model, tmp_path / "hf")
    loaded = GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    idx = torch.tensor([run.tokenizer.encode("The block ")])
    with torch.no_grad():
        torch.testing.assert_close(loaded(idx).logits, model(idx).logits, atol=1e-5, rtol=0)
    again = from_hf(tmp_path / "hf")  # a directory, as save_pretrained wrote it
    assert again.config == model.config


def test_a_saved_directory_loads_even_sharded_and_untied(tmp_path):
    hf = hf_model(60, 16, 2, 2, 16, "gelu_new", tie_word_embeddings=False)
    hf.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    ours = from_hf(tmp_path)
    assert not ours.config.tie_embeddings
    idx = torch.randint(0, 60, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(ours(idx).logits, hf(idx).logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "field, value",
    [
        ("scale_attn_by_inverse_layer_idx", True),
        ("reorder_and_upcast_attn", True),
        ("add_cross_attention", True),
        ("scale_attn_weights", False),
        ("n_inner", 40),
        ("activation_function", "silu"),
        ("attn_pdrop", 0.3),
    ],
)
def test_configs_the_blocks_cannot_compute_are_refused_by_name(field, value):
    config = GPT2Config(n_layer=1, n_head=2, n_embd=8, n_positions=8, vocab_size=10)
    setattr(config, field, value)
    with pytest.raises(ValueError, match=f"GPT-2 config field {field}="):
        from_hf(GPT2LMHeadModel(config))


def test_what_gpt2_cannot_express_is_refused():
    model = GPT(GPTConfig(vocab_size=10, block_size=8, n_layer=1, n_head=1, n_embd=8, bias=False))
    with pytest.raises(ValueError, match="GPT-2 has biases in every layer"):
        to_hf(model)


def test_only_local_safetensors_directories_are_read(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"gpt2 is not a directory.*nothing is downloaded"):
        from_hf("gpt2")
    hf = hf_model(10, 8, 1, 1, 8, "gelu_new")
    hf.save_pretrained(tmp_path, safe_serialization=False)
    if (tmp_path / "model.safetensors").exists():  # this transformers always writes safetensors
        (tmp_path / "model.safetensors").unlink()
        (tmp_path / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(FileNotFoundError, match="does not unpickle"):
        from_hf(tmp_path)


def test_without_transformers_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    model = GPT(GPTConfig(vocab_size=10, block_size=8, n_layer=1, n_head=1, n_embd=8))
    with pytest.raises(UserImportError, match=r'pip install "gptblock\[hf\]"'):
        to_hf(model)
