"""gptblock.load: a run, a Hugging Face GPT-2 directory and a nanoGPT checkpoint through one call,
each answered in one shape; and `gptblock sample` / `inspect` reading all three by one option
group."""

import pathlib
import pickle

import pytest
import torch

from gptblock import GPT, CharTokenizer, load, load_gpt
from gptblock.cli import main
from gptblock.data.bpe import BPETokenizer
from gptblock.data.text import shakespeare
from gptblock.errors import UserError
from gptblock.interop import hf, nanogpt
from gptblock.loading import Loaded, Source
from nanogpt_style import NanoGPT

RUN = pathlib.Path(__file__).parent / "fixtures" / "run-v1"  # written by gptblock 0.1's train
CHARS = ["\n", " ", "a", "b", "e", "é"]


@pytest.fixture
def nanogpt_dir(tmp_path):
    torch.manual_seed(0)
    theirs = NanoGPT(len(CHARS), 8, 1, 2, 8).eval()
    torch.save(theirs.checkpoint(), tmp_path / "ckpt.pt")
    meta = {"vocab_size": len(CHARS), "itos": dict(enumerate(CHARS))}
    (tmp_path / "meta.pkl").write_bytes(pickle.dumps(meta))
    return tmp_path, theirs


def test_a_run_loads_as_load_gpt_reads_it():
    loaded = load(RUN)
    model, tok, ckpt = load_gpt(RUN)
    assert isinstance(loaded, Loaded) and not loaded.model.training
    assert loaded.tokenizer == tok and loaded.source == Source("run", ckpt.path, ckpt.meta["step"])
    theirs = model.state_dict()
    assert all(torch.equal(t, theirs[k]) for k, t in loaded.model.state_dict().items())
    assert str(loaded.source) == f"{ckpt.path} (step {ckpt.meta['step']})"


def test_a_nanogpt_checkpoint_loads_with_its_vocabulary(nanogpt_dir):
    d, theirs = nanogpt_dir
    model, tok, source = load(nanogpt=d)
    assert source == Source("nanogpt", d / "ckpt.pt") and not model.training
    assert isinstance(tok, CharTokenizer) and tok.chars == tuple(CHARS)
    idx = torch.tensor([tok.encode("abé")])
    with torch.no_grad():
        torch.testing.assert_close(model(idx).logits, theirs(idx), atol=1e-5, rtol=1e-5)


def test_a_hugging_face_directory_loads_with_its_tokenizer(tmp_path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    BPETokenizer.train(shakespeare()[:5000], vocab_size=260).tokenizer.save(
        str(tmp_path / "tokenizer.json")
    )
    config = transformers.GPT2Config(vocab_size=260, n_positions=8, n_layer=1, n_head=2,
                                     n_embd=8, bos_token_id=None, eos_token_id=None)  # fmt: skip
    torch.manual_seed(0)
    theirs = transformers.GPT2LMHeadModel(config).eval()
    theirs.save_pretrained(tmp_path)
    model, tok, source = load(hf=tmp_path)
    assert source == Source("hf", tmp_path) and tok.vocab_size == 260 and not model.training
    idx = torch.tensor([tok.encode("To be")])
    with torch.no_grad():
        torch.testing.assert_close(model(idx).logits, theirs(idx).logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("given", [{}, {"out_dir": RUN, "nanogpt": RUN}])
def test_one_source_exactly(given):
    with pytest.raises(UserError, match=r"give one of out_dir .* got"):
        load(**given)


def test_a_vocabulary_larger_than_the_model_is_refused(nanogpt_dir):
    d, _ = nanogpt_dir
    more = [*CHARS, "z"]
    (d / "meta.pkl").write_bytes(pickle.dumps({"itos": dict(enumerate(more))}))
    with pytest.raises(UserError, match="its tokenizer has 7 tokens, more than the model's"):
        load(nanogpt=d)


def test_other_tools_files_are_functions_of_interop_not_attributes_of_the_gpt():
    # The model imports no I/O, and nothing attaches methods to the GPT at import (issue 30).
    assert {"from_hf", "to_hf", "save_hf"} <= set(hf.__all__) and "from_nanogpt" in nanogpt.__all__
    assert not {"from_hf", "to_hf", "save_hf", "from_nanogpt"} & set(dir(GPT))


def test_sample_reads_a_nanogpt_checkpoint_greedily_as_nanogpt_would(nanogpt_dir, capsys):
    d, theirs = nanogpt_dir
    args = ["sample", "--nanogpt", str(d), "--prompt", "ab", "--max-new-tokens", "5"]
    assert main([*args, "--temperature", "0"]) == 0
    idx = torch.tensor([[CHARS.index("a"), CHARS.index("b")]])
    with torch.no_grad():
        for _ in range(5):  # nanoGPT's own greedy decoding, on its own model
            idx = torch.cat([idx, theirs(idx[:, -8:])[:, -1:].argmax(-1)], dim=1)
    assert capsys.readouterr().out == "".join(CHARS[i] for i in idx[0]) + "\n"


def test_inspect_names_the_nanogpt_checkpoint(nanogpt_dir, capsys):
    d, _ = nanogpt_dir
    assert main(["inspect", "--nanogpt", str(d / "ckpt.pt"), "--prompt", "abe"]) == 0
    assert f"'abe' on {d / 'ckpt.pt'} (nanoGPT, n_layer 1, n_head 2)" in capsys.readouterr().out


def test_a_nanogpt_checkpoint_without_its_vocabulary_is_one_line(nanogpt_dir, capsys):
    d, _ = nanogpt_dir
    (d / "meta.pkl").unlink()
    assert main(["sample", "--nanogpt", str(d)]) == 2
    err = capsys.readouterr().err
    assert "no meta.pkl beside it" in err and len(err.strip().splitlines()) == 1


def test_two_sources_on_the_command_line_are_refused(nanogpt_dir, capsys):
    d, _ = nanogpt_dir
    with pytest.raises(SystemExit) as stop:
        main(["sample", "--out", str(RUN), "--nanogpt", str(d)])
    assert stop.value.code == 2 and "not allowed with" in capsys.readouterr().err
