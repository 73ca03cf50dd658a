"""Hugging Face directories read strictly (issue 31, class 1), and a run exported whole (class 7).

Reading: every tensor of the safetensors is read or refused by name (a layer the config does
not have, a bias it does not enable, a stray tensor, NaN); every field of config.json is computed
(the logits are transformers' own model's, built here from a tiny random config: nothing is
downloaded), refused by name, or metadata by the table of ``interop.hf_fields``; a context too
long for the KV cache is refused from its estimate. Exporting: ``gptblock export`` writes a
character-level or BPE run with its tokenizer, and what reads it back (``sample --hf``,
transformers' ``AutoTokenizer`` and ``AutoModelForCausalLM``) sees the run.
"""

import json
import shutil

import pytest
import safetensors.torch
import torch

from gptblock import load, load_gpt, train_gpt
from gptblock.cli import main
from gptblock.data.batches import CharTokenizer
from gptblock.data.bpe import tokenizers_of
from gptblock.errors import UserError
from gptblock.interop.hf import from_hf
from gptblock.interop.hf_fields import check_fields

transformers = pytest.importorskip("transformers")

TINY = dict(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            bos_token_id=None, eos_token_id=None)  # fmt: skip
NAMES = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2"}


def saved(family, directory, **fields):
    """A tiny random ``family`` model saved in ``directory``, and the model."""
    torch.manual_seed(0)
    config = getattr(transformers, f"{NAMES[family]}Config")(**TINY | fields)
    model = getattr(transformers, f"{NAMES[family]}ForCausalLM")(config).eval()
    with torch.no_grad():  # transformers starts biases at 0 and norms at 1: a misplaced one hides
        for key, p in model.named_parameters():
            if key.endswith("bias") or key.endswith("norm.weight"):
                p.add_(0.2 * torch.randn_like(p))
    model.save_pretrained(directory)
    return model


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama")
    saved("llama", d)
    digits = CharTokenizer([chr(48 + i) for i in range(50)])  # for sample --hf
    tokenizers_of(digits).save(str(d / "tokenizer.json"))
    return d


def copy_of(directory, tmp_path, fields=None, tensors=None):
    """A copy of ``directory`` with ``fields(config)`` and ``tensors(state)`` applied."""
    d = tmp_path / "copy"
    shutil.copytree(directory, d)
    if fields:
        config = json.loads((d / "config.json").read_text())
        fields(config)
        (d / "config.json").write_text(json.dumps(config))
    if tensors:
        state = safetensors.torch.load_file(d / "model.safetensors")
        tensors(state)
        safetensors.torch.save_file(state, d / "model.safetensors")
    return d


def refused(d, *needles):
    with pytest.raises(UserError) as e:
        from_hf(d)
    message = str(e.value)
    assert "\n" not in message and all(n in message for n in needles), message


@pytest.mark.parametrize("family", ["gpt2", *NAMES])
def test_every_field_of_transformers_own_configs_is_in_the_table(family):
    name = "GPT2" if family == "gpt2" else NAMES[family]
    check_fields(getattr(transformers, f"{name}Config")().to_dict(), family)


def put(key, t):
    return lambda state: state.__setitem__(key, t)


def spoil(key, value):
    return lambda state: state[key].view(-1).__setitem__(0, value)


TENSORS = {  # how the weights disagree with config.json -> what the one line names
    "a sixth layer": (put("model.layers.5.input_layernorm.weight", torch.ones(32)), "layers.5"),
    "a bias the config does not enable": (
        put("model.layers.0.self_attn.q_proj.bias", torch.zeros(32)),
        "model.layers.0.self_attn.q_proj.bias, which config.json's model has no place for",
    ),
    "a junk tensor": (put("junk", torch.zeros(3)), "holds junk"),
    "NaN": (spoil("model.layers.1.mlp.up_proj.weight", float("nan")), "up_proj.weight holds 1 NaN"),
    "infinity": (spoil("model.norm.weight", float("inf")), "model.norm.weight holds 1 NaN or inf"),
    "a tensor twice, with and without model.": (
        put("layers.0.input_layernorm.weight", torch.ones(32)),
        "input_layernorm.weight is given twice",
    ),
}


@pytest.mark.parametrize("change, needle", TENSORS.values(), ids=TENSORS.keys())
def test_weights_the_config_has_no_place_for_are_refused_naming_the_tensor(
    llama, tmp_path, change, needle
):
    refused(copy_of(llama, tmp_path, tensors=change), "model.safetensors: ", needle)


def test_a_config_with_fewer_layers_than_the_weights_is_refused(llama, tmp_path, capsys):
    d = copy_of(llama, tmp_path, fields=lambda c: c.update(num_hidden_layers=1))
    refused(d, "holds model.layers.1.")
    assert main(["sample", "--hf", str(d), "--threads", "1"]) == 2
    assert "model.layers.1." in capsys.readouterr().err


def test_qwen2_biases_outside_q_k_v_and_a_gpt2_stray_tensor_are_refused(tmp_path):
    saved("qwen2", tmp_path / "q")
    o_bias = put("model.layers.0.self_attn.o_proj.bias", torch.zeros(32))
    refused(copy_of(tmp_path / "q", tmp_path / "a", tensors=o_bias), "o_proj.bias")
    gpt2 = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=32, vocab_size=40)
    transformers.GPT2LMHeadModel(gpt2).save_pretrained(tmp_path / "g")
    third = put("transformer.h.1.ln_1.weight", torch.ones(16))
    refused(copy_of(tmp_path / "g", tmp_path / "b", tensors=third), "holds transformer.h.1.ln_1")


FIELDS = {  # config.json's change -> what the one line names
    "linear rope scaling beside default rope_parameters": (
        {"rope_scaling": {"type": "linear", "factor": 2.0}},
        "rope_scaling={'type': 'linear', 'factor': 2.0}",
    ),
    "a default rope with a factor": (
        {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "factor": 2.0}},
        "rope_parameters=",
    ),
    "partial rotation at the top level": ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    "a field of another architecture": ({"num_experts": 4}, "num_experts=4: not a field"),
    "quantized": ({"quantization_config": {"bits": 4}}, "quantization_config="),
    "custom code": ({"auto_map": {"AutoModel": "x.Model"}}, "auto_map="),
    "cross-attention": ({"add_cross_attention": True}, "add_cross_attention=True"),
}


@pytest.mark.parametrize("change, needle", FIELDS.values(), ids=FIELDS.keys())
def test_a_field_that_is_not_computed_is_refused_by_name(llama, tmp_path, change, needle):
    refused(copy_of(llama, tmp_path, fields=lambda c: c.update(change)), "config.json: ", needle)


def test_a_gpt2_field_gptblock_does_not_know_is_refused(tmp_path):
    transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2,
                                                         n_positions=32, vocab_size=40)).save_pretrained(tmp_path / "g")  # fmt: skip
    d = copy_of(tmp_path / "g", tmp_path, fields=lambda c: c.update(attn_logit_softcapping=30.0))
    refused(d, "GPT-2 config field attn_logit_softcapping=30.0")


LOADED = {  # family, fields: what transformers computes as full attention and plain rope
    "metadata set": ("llama", dict(pad_token_id=0, use_cache=False, pretraining_tp=1)),
    "qwen2 window over layers layer_types keeps full": (
        "qwen2",
        dict(use_sliding_window=True, sliding_window=8, layer_types=["full_attention"] * 2),
    ),
    "qwen2 window switched off": ("qwen2", dict(use_sliding_window=False, sliding_window=8)),
    "mistral window as long as the context": ("mistral", dict(sliding_window=64)),
}


@pytest.mark.parametrize("family, fields", LOADED.values(), ids=LOADED.keys())
def test_what_is_read_computes_transformers_logits(tmp_path, family, fields):
    theirs = saved(family, tmp_path, **fields)
    idx = torch.randint(0, 50, (2, 64))  # longer than the windows: a window would show
    with torch.no_grad():
        torch.testing.assert_close(from_hf(tmp_path)(idx).logits, theirs(idx).logits, atol=1e-5,
                                   rtol=0)  # fmt: skip


def test_a_sliding_window_transformers_computes_is_refused(tmp_path):
    saved("qwen2", tmp_path, use_sliding_window=True, sliding_window=8, max_window_layers=1)
    refused(tmp_path, "Qwen2 config field use_sliding_window=True", "sliding window of 8")


def test_buffers_older_transformers_saved_are_not_read(llama, tmp_path):
    inv_freq = put("model.layers.0.self_attn.rotary_emb.inv_freq", torch.ones(4))
    idx = torch.randint(0, 50, (1, 16))
    with torch.no_grad():
        expected = from_hf(llama)(idx).logits
        torch.testing.assert_close(from_hf(copy_of(llama, tmp_path, tensors=inv_freq))(idx).logits,
                                   expected)  # fmt: skip


def test_a_context_of_1e12_is_refused_from_its_kv_cache_before_allocating(llama, tmp_path, capsys):
    d = copy_of(llama, tmp_path, fields=lambda c: c.update(max_position_embeddings=10**12))
    assert main(["sample", "--hf", str(d), "--threads", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "KV cache of 1,000,000,000,000 positions" in err, err
    assert "available" in err


# --- gptblock export -----------------------------------------------------------------------------

TEXT = "the cat sat on the mat.\nthe dog ate the hat!\n" * 40


@pytest.fixture(scope="module", params=["char", "bpe"])
def run(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"run-{request.param}")
    extra = dict(tokenizer="bpe", vocab_size=280) if request.param == "bpe" else {}
    train_gpt(text=TEXT, out_dir=out, n_layer=2, n_head=2, n_embd=32, block_size=32, batch_size=4,
              max_iters=3, eval_interval=3, eval_iters=1, warmup=1, progress=False,
              **extra)  # fmt: skip
    return out


def cli(capsys, *args):
    code = main([*args])
    out, err = capsys.readouterr()
    return code, out, err


def test_export_samples_as_the_run_does_and_transformers_reads_it(run, tmp_path, capsys):
    d = tmp_path / "hf"
    code, out, err = cli(capsys, "export", "--out", str(run), "--hf", str(d))
    assert code == 0 and err == "" and out.startswith(f"wrote {d}: Hugging Face GPT-2"), err
    for temperature in ("0", "0.8"):
        same = ["--temperature", temperature, "--max-new-tokens", "60", "--threads", "1"]
        assert (
            cli(capsys, "sample", "--out", str(run), *same)[1:]
            == cli(capsys, "sample", "--hf", str(d), *same)[1:]
        )
    model, tokenizer, _ = load_gpt(run)
    text = "the hat sat on the dog.\n"
    back = load(hf=d).tokenizer  # a character vocabulary comes back as the CharTokenizer it was
    assert type(back) is type(tokenizer) and back.encode(text) == tokenizer.encode(text)
    assert back == tokenizer or tokenizer.kind == "bpe"  # transformers adds a no-op post-processor
    hf_tok = transformers.AutoTokenizer.from_pretrained(d)
    ids = hf_tok(text)["input_ids"]
    assert ids == tokenizer.encode(text) and hf_tok.decode(ids) == text
    theirs = transformers.AutoModelForCausalLM.from_pretrained(d).eval()
    with torch.no_grad():
        x = torch.tensor([ids])
        torch.testing.assert_close(theirs(x).logits, model(x).logits, atol=1e-5, rtol=0)


def test_export_misuse_is_one_line_and_writes_nothing(run, tmp_path, capsys):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    (tmp_path / "file").write_text("mine")
    cases = {
        "full": "it is not empty",
        "file": "it exists and is not a directory",
        "file/sub": "no directory can be made there",
    }
    for where, needle in cases.items():
        code, _, err = cli(capsys, "export", "--out", str(run), "--hf", str(tmp_path / where))
        assert code == 2 and err.count("\n") == 1 and needle in err, err
    code, _, err = cli(
        capsys, "export", "--out", str(tmp_path / "none"), "--hf", str(tmp_path / "a")
    )
    assert code == 2 and err.count("\n") == 1 and "no best checkpoint" in err, err
    code, _, err = cli(capsys, "export", "--out", str(run), "--hf", str(tmp_path / "b"),
                       "--family", "llama")  # fmt: skip
    assert code == 2 and err.count("\n") == 1 and "position='learned'" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "full"]
    assert (tmp_path / "full" / "notes.txt").read_text() == "mine"
