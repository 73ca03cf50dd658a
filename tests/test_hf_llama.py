"""Hugging Face Llama, Mistral and Qwen2 on gptblock's modern block: the same logits, the same
greedy tokens, both ways; what the parts do not compute refused by name.

The models are tiny and random, built here from a config (nothing is downloaded). transformers
starts every norm at 1 and every bias at 0, which would hide a norm or a bias copied to the wrong
place, so both are drawn at random too.
"""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gptblock import GPT, GPTConfig
from gptblock.blocks.config import applicable
from gptblock.cli import main
from gptblock.errors import UserError
from gptblock.interop.hf import from_hf, save_hf

transformers = pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast  # noqa: E402

SRC = Path(__file__).resolve().parents[1] / "src"
# Weights of std 0.1 give logits of a few units. gptblock computes the rotary angles in float64,
# Hugging Face in float32: at std 0.2 and 64 positions that alone moves a logit by ~1.5e-5
# (with float32 angles the two agree exactly), so the weights stay at the scale the 1e-5 covers.
SIZE = dict(vocab_size=300, hidden_size=64, intermediate_size=96, max_position_embeddings=64,
            bos_token_id=None, eos_token_id=None, initializer_range=0.1)  # fmt: skip
CASES = {  # id -> (model_type, config fields)
    "llama-gqa": ("llama", dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)),
    "llama-mqa-tied-attention-bias-theta500": (
        "llama",
        dict(
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=1,
            tie_word_embeddings=True,
            attention_bias=True,
            rope_parameters={"rope_type": "default", "rope_theta": 500.0},
        ),
    ),
    "llama-mha-mlp-bias-eps": (
        "llama",
        dict(
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            mlp_bias=True,
            rms_norm_eps=1e-5,
        ),
    ),
    "mistral-gqa": (
        "mistral",
        dict(
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, sliding_window=None
        ),
    ),
    "mistral-window-as-long-as-the-context": (
        "mistral",
        dict(num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2, sliding_window=64),
    ),
    "qwen2-gqa-tied": (
        "qwen2",
        dict(
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=True,
        ),
    ),
}
NAMES = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2"}


def hf_model(model_type, fields, seed=0):
    torch.manual_seed(seed)
    name = NAMES[model_type]
    config = getattr(transformers, f"{name}Config")(**SIZE | fields)
    model = getattr(transformers, f"{name}ForCausalLM")(config)
    with torch.no_grad():
        for key, p in model.named_parameters():
            if key.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
            elif key.endswith("bias"):
                p.normal_(0, 0.1)
    return model.eval()


def random_gpt(seed=0, **options):
    """A gptblock GPT of the modern block, with random norms and biases too."""
    torch.manual_seed(seed)
    config = dict(vocab_size=300, block_size=64, n_layer=2, n_head=4, n_embd=64, bias=False,
                  norm="rmsnorm", mlp="swiglu", d_ff=96, n_kv_head=2, position="rope",
                  norm_eps=1e-6, tie_embeddings=False, rope_theta=1000.0)  # fmt: skip
    # the base's rope_theta is dropped where the options leave it unable to act
    model = GPT(GPTConfig(**applicable(GPTConfig, config | options, given=options))).eval()
    with torch.no_grad():
        for key, p in model.named_parameters():
            p.copy_((1 + 0.3 * torch.randn_like(p)) if p.dim() == 1 and "norm" in key else
                    0.1 * torch.randn_like(p))  # fmt: skip
    return model


@pytest.mark.parametrize("model_type, fields", CASES.values(), ids=CASES.keys())
def test_logits_agree_within_1e5(model_type, fields, tmp_path):
    hf = hf_model(model_type, fields)
    idx = torch.randint(0, 300, (3, 64))
    with torch.no_grad():
        theirs = hf(idx).logits
        ours = from_hf(hf)
        torch.testing.assert_close(ours(idx).logits, theirs, atol=1e-5, rtol=0)
        hf.save_pretrained(tmp_path)
        saved = from_hf(tmp_path)
        torch.testing.assert_close(saved(idx).logits, theirs, atol=1e-5, rtol=0)
    assert saved.config == ours.config
    assert ours.config.n_kv_head == fields["num_key_value_heads"]
    assert ours.config.n_head == fields["num_attention_heads"]


@pytest.mark.parametrize("model_type, fields", CASES.values(), ids=CASES.keys())
def test_greedy_generation_is_token_for_token_huggingfaces(model_type, fields):
    # 60 tokens after a 4-token prompt, to the last position the config defines: gptblock's KV
    # cache (n_kv_head heads) against Hugging Face's.
    hf = hf_model(model_type, fields)
    ours = from_hf(hf)
    prompt = torch.randint(0, 300, (2, 4))
    theirs = hf.generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=60, do_sample=False,
        pad_token_id=0,
    )  # fmt: skip
    assert theirs.shape == (2, 64)
    assert torch.equal(ours.generate(prompt, 60, temperature=0), theirs)
    assert torch.equal(ours.generate(prompt, 60, temperature=0, use_cache=False), theirs)


EXPORTS = {  # id -> (gptblock options, family or None, the transformers class it becomes)
    "llama-gqa-untied": ({}, None, "LlamaForCausalLM"),
    "llama-mqa-tied-bias": (dict(n_kv_head=1, tie_embeddings=True, bias=True), "llama", "Llama"),
    "llama-adjacent-pairing": (dict(rope_pairing="adjacent"), None, "LlamaForCausalLM"),
    "mistral": (dict(n_kv_head=4), "mistral", "MistralForCausalLM"),
    "qwen2": (dict(tie_embeddings=True), "qwen2", "Qwen2ForCausalLM"),
}


@pytest.mark.parametrize("options, family, cls", EXPORTS.values(), ids=EXPORTS.keys())
def test_save_hf_loads_in_transformers_with_the_same_logits(options, family, cls, tmp_path):
    model = random_gpt(**options)
    idx = torch.randint(0, 300, (2, 64))
    save_hf(model, tmp_path, family=family)
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(theirs).__name__.startswith(cls)
    with torch.no_grad():
        expected = model(idx).logits
        torch.testing.assert_close(theirs(idx).logits, expected, atol=1e-5, rtol=0)
        back = from_hf(tmp_path)
        torch.testing.assert_close(back(idx).logits, expected, atol=1e-5, rtol=0)
    if model.config.rope_pairing == "halves":  # else back is the halves model, permuted
        same = model.config
        if family == "qwen2":  # Qwen2 always has q/k/v biases: they come back, zeros, as bias=True
            same = dataclasses.replace(same, bias=True)
            assert not any(p.any() for k, p in back.state_dict().items() if k.endswith("bias"))
        assert back.config == same
        for key, p in model.state_dict().items():
            assert torch.equal(back.state_dict()[key], p), key


def test_a_qwen2_checkpoint_goes_back_to_qwen2_exactly(tmp_path):
    hf = hf_model(*CASES["qwen2-gqa-tied"])
    save_hf(from_hf(hf), tmp_path, family="qwen2")
    again = AutoModelForCausalLM.from_pretrained(tmp_path)
    for key, p in hf.state_dict().items():
        assert torch.equal(again.state_dict()[key], p), key


REFUSED_EXPORTS = {  # id -> (gptblock options, family, what the one line names)
    "learned positions": (dict(position="learned"), "llama", "position='learned'"),
    "no positions": (dict(position="none"), "llama", "position='none'"),
    "qk_norm, Llama by default": (dict(qk_norm=True), None, "Llama's format cannot express qk_"),
    "no positions, GPT-2 by default": (dict(position="none"), None, "GPT-2's format cannot"),
    "layernorm": (dict(norm="layernorm"), "llama", "norm='layernorm'"),
    "dense mlp": (dict(mlp="dense"), "qwen2", "mlp='dense'"),
    "qk_norm": (dict(qk_norm=True), "llama", "qk_norm=True"),
    "parallel residual": (dict(parallel_residual=True), "mistral", "parallel_residual=True"),
    "partial rotation": (dict(rotary_dim=8), "llama", "rotary_dim=8"),
    "mistral with biases": (dict(bias=True), "mistral", "bias=True"),
    "qwen2 with an o_proj bias": (dict(bias=True), "qwen2", "bias on self_attn.o_proj"),
    "no such family": ({}, "gemma", "family must be one of"),
}


@pytest.mark.parametrize("options, family, needle", REFUSED_EXPORTS.values(), ids=REFUSED_EXPORTS)
def test_what_a_family_cannot_express_is_refused_with_one_line(options, family, needle, tmp_path):
    model = random_gpt(**options)
    with pytest.raises(UserError) as e:
        save_hf(model, tmp_path / "out", family=family)
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama")
    hf_model(*CASES["llama-gqa"]).save_pretrained(d)
    return d


def with_fields(directory, tmp_path, drop=(), **changes):
    fields = json.loads((directory / "config.json").read_text())
    fields = {k: v for k, v in fields.items() if k not in drop} | changes
    copy = tmp_path / "dir"
    copy.mkdir()
    for path in directory.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    (copy / "config.json").write_text(json.dumps(fields))
    return copy


REFUSED_CONFIGS = {  # id -> (fields dropped, fields changed, what the one line names)
    "hidden_size missing": (["hidden_size"], {}, "field hidden_size is missing"),
    "vocab_size a string": ([], {"vocab_size": "300"}, "vocab_size='300'"),
    "num_hidden_layers 0": ([], {"num_hidden_layers": 0}, "num_hidden_layers=0"),
    "kv heads not dividing": ([], {"num_key_value_heads": 3}, "num_key_value_heads=3: does not"),
    "hidden not divisible": ([], {"hidden_size": 66}, "hidden_size=66: not divisible"),
    "head_dim apart": ([], {"head_dim": 32}, "head_dim=32"),
    "gelu": ([], {"hidden_act": "gelu"}, "hidden_act='gelu'"),
    "attention dropout": ([], {"attention_dropout": 0.1}, "attention_dropout=0.1"),
    "yarn": ([], {"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "rope_parameters="),
    "linear scaling, transformers 4's spelling": (
        ["rope_parameters"],
        {"rope_theta": 10000.0, "rope_scaling": {"type": "linear", "factor": 2.0}},
        "rope_scaling=",
    ),
    "partial rotation": (
        [],
        {"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}},
        "rope_parameters=",
    ),
    "mistral window inside the context": (
        ["attention_bias", "mlp_bias"],  # Llama's fields, which a Mistral config does not have
        {"model_type": "mistral", "sliding_window": 16},
        "Mistral config field sliding_window=16",
    ),
    "qwen2 sliding layers": (
        ["attention_bias", "mlp_bias"],
        {
            "model_type": "qwen2",
            "use_sliding_window": True,
            "sliding_window": 16,
            "max_window_layers": 1,
        },
        "Qwen2 config field use_sliding_window=True",
    ),
    "unknown model type": ([], {"model_type": "gemma"}, "model_type='gemma'"),
    "model type a list": ([], {"model_type": ["llama"]}, "model_type=['llama']"),
    "eps 0": ([], {"rms_norm_eps": 0}, "rms_norm_eps=0: expected a positive number"),
    "tie a string": ([], {"tie_word_embeddings": "yes"}, "tie_word_embeddings='yes'"),
}


@pytest.mark.parametrize("drop, changes, needle", REFUSED_CONFIGS.values(), ids=REFUSED_CONFIGS)
def test_a_config_the_parts_do_not_compute_is_one_line_naming_file_and_field(
    llama_dir, tmp_path, drop, changes, needle
):
    d = with_fields(llama_dir, tmp_path, drop, **changes)
    with pytest.raises(UserError) as e:
        from_hf(d)
    message = str(e.value)
    assert message.startswith(f"{d / 'config.json'}: ") and needle in message, message
    assert "\n" not in message


def test_a_legacy_config_with_rope_theta_loads(llama_dir, tmp_path):
    # transformers 4 wrote rope_theta and rope_scaling at the top level, not rope_parameters
    d = with_fields(llama_dir, tmp_path, ["rope_parameters"], rope_theta=500.0, rope_scaling=None)
    assert from_hf(d).config.rope_theta == 500.0


def gptblock_cli(*args):
    env = dict(os.environ, PYTHONPATH=str(SRC), OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "gptblock", *args, "--threads", "1"]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize(
    "field, value", [("vocab_size", 10**9), ("num_hidden_layers", 10**7), ("hidden_size", 2**20)]
)
def test_an_absurd_size_is_refused_before_allocating(llama_with_tokenizer, tmp_path, field, value):
    from test_misuse_foreign import in_a_subprocess, one_line

    # head_dim, written as hidden_size / num_attention_heads, would be refused first
    d = with_fields(llama_with_tokenizer[0], tmp_path, ["head_dim"], **{field: value})
    r = in_a_subprocess("sample", "--hf", str(d), "--threads", "1")
    assert r.returncode == 2, r.stderr[-2000:]
    one_line(r.stderr, "sample", "config.json: a model of", "available")


@pytest.fixture(scope="module")
def llama_with_tokenizer(tmp_path_factory):
    """A saved tiny Llama with a byte-level BPE tokenizer (as Llama 3's) of 290 tokens: the
    embedding's last 10 rows are padding, made the likeliest, which must never be sampled."""
    from gptblock.data.bpe import BPETokenizer
    from gptblock.data.text import shakespeare

    d = tmp_path_factory.mktemp("llama-tok")
    tok = BPETokenizer.train(shakespeare()[:30_000], vocab_size=290)
    PreTrainedTokenizerFast(tokenizer_object=tok.tokenizer).save_pretrained(d)
    hf = hf_model(*CASES["llama-gqa"])
    with torch.no_grad():
        hf.lm_head.weight[290:] *= 20
    hf.save_pretrained(d)
    return d, tok, hf


def test_cli_sample_hf_reads_a_llama_directory_greedily_as_hugging_face(
    llama_with_tokenizer, capsys
):
    # in process (transformers is imported already); inspect below runs as a real process
    d, tok, hf = llama_with_tokenizer
    code = main(["sample", "--hf", str(d), "--prompt", "The ", "--max-new-tokens", "12",
                 "--temperature", "0"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err[-2000:]
    ids = prompt = torch.tensor([tok.encode("The ")])
    with torch.no_grad():  # Hugging Face's greedy steps over the tokenizer's ids only
        assert int(hf(prompt).logits[0, -1].argmax()) >= 290  # else the padding would win
        for _ in range(12):
            logits = hf(ids).logits[0, -1, :290]
            ids = torch.cat([ids, logits.argmax().view(1, 1)], dim=1)
    assert out.rstrip("\n") == tok.decode(ids[0].tolist())


def test_cli_inspect_hf_reads_a_llama_directory(llama_with_tokenizer, tmp_path):
    d, _, _ = llama_with_tokenizer
    r = gptblock_cli("inspect", "--hf", str(d), "--prompt", "The king", "--png", str(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Hugging Face Llama, n_layer 2, n_head 4" in r.stdout
    assert (tmp_path / "attention.png").stat().st_size > 0


def test_a_sharded_llama_directory_loads_and_a_wrong_shape_is_named(tmp_path):
    hf = hf_model(*CASES["llama-gqa"])
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="40KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    idx = torch.randint(0, 300, (1, 16))
    with torch.no_grad():
        torch.testing.assert_close(
            from_hf(tmp_path / "sharded")(idx).logits, hf(idx).logits, atol=1e-5, rtol=0
        )
    # k_proj of a model with as many key/value heads as query heads: refused from the header
    d = with_fields(tmp_path / "sharded", tmp_path, num_key_value_heads=4)
    with pytest.raises(
        UserError, match=r"self_attn\.k_proj\.weight has shape \(32, 64\).*\(64, 64\)"
    ):
        from_hf(d)
