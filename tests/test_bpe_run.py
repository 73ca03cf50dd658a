"""BPE end to end: `gptblock train --tokenizer bpe`, per-character losses, and `--hf` directories
for `gptblock sample` and `gptblock inspect`."""

import json
import math

import pytest
import torch

pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")

from gptblock import load_gpt  # noqa: E402
from gptblock.cli import main  # noqa: E402
from gptblock.data.batches import split_text  # noqa: E402
from gptblock.data.bpe import BPETokenizer  # noqa: E402
from gptblock.data.text import shakespeare  # noqa: E402
from gptblock.sampling import _pieces  # noqa: E402
from gptblock.train.run import prepare_run  # noqa: E402

# The validation part (the last 10%) holds a word the training part never does.
TEXT = shakespeare()[:18_000] + " zqxv" * 300
SMALL = dict(n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=8, max_iters=6,
             eval_interval=3, eval_iters=1, warmup=1, dtype="float32", progress=False)  # fmt: skip


def test_the_tokenizer_learns_from_the_training_part_alone(tmp_path):
    run = prepare_run(text=TEXT, out_dir=None, tokenizer="bpe", vocab_size=300, **SMALL)
    train_text, val_text = split_text(TEXT)
    assert "zqxv" in val_text and "zqxv" not in train_text
    assert run.tokenizer == BPETokenizer.train(train_text, 300)
    assert len(run.tokenizer.encode(" zqxv")) == 5  # no merge of its letters was ever learnt
    assert run.tokenizer.decode(run.splits.val.tolist()) == val_text


def test_a_bpe_run_saves_its_tokenizer_and_reports_losses_per_character(tmp_path, capsys):
    data = tmp_path / "input.txt"
    data.write_text(TEXT, encoding="utf-8")
    out = tmp_path / "run"
    args = ["train", "--data", str(data), "--out", str(out), "--tokenizer", "bpe"]
    args += ["--vocab-size", "300", "--n-layer", "1", "--n-head", "2", "--n-embd", "16"]
    args += ["--block-size", "16", "--batch-size", "8", "--max-iters", "6", "--eval-interval", "3"]
    args += ["--eval-iters", "1", "--dtype", "float32", "--no-progress"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    meta = json.loads((out / "last.json").read_text())
    assert meta["tokenizer"]["kind"] == "bpe" and "vocab" not in meta
    model, tok, ckpt = load_gpt(out, "last")
    assert isinstance(tok, BPETokenizer) and tok.vocab_size == model.config.vocab_size
    # The per-character loss is the per-token loss times tokens over characters, scored here.
    run = prepare_run(text=TEXT, out_dir=None, tokenizer="bpe", vocab_size=300, **SMALL)
    per_token = float(printed.split("validation loss ")[1].split()[0])
    val = run.splits.val
    chars = len(tok.decode(val[1:].tolist()))
    per_char = per_token * (len(val) - 1) / chars
    nats, bits = (
        printed.split(" characters): ")[1].split(" bits per character")[0].split(" nats = ")
    )
    assert float(nats) == pytest.approx(per_char, abs=1e-3)  # per_token was printed rounded
    assert float(bits) == pytest.approx(float(nats) / math.log(2), abs=1e-4)
    assert main(["sample", "--out", str(out), "--prompt", "ROMEO: é", "--max-new-tokens", "5"]) == 0
    assert capsys.readouterr().out.startswith("ROMEO: é")


def test_streamed_pieces_are_whole_characters():
    tok = BPETokenizer.train("abc " * 100, vocab_size=260)
    ids = tok.encode("aé€😀 b")  # several tokens spell one character's bytes
    pieces = list(_pieces(tok, iter(ids)))
    assert "".join(pieces) == "aé€😀 b" and not any("\ufffd" in p for p in pieces)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf")
    tok = BPETokenizer.train(shakespeare()[:30_000], vocab_size=300)
    tok.tokenizer.save(str(d / "tokenizer.json"))
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=300, n_positions=32, n_layer=2, n_head=2, n_embd=16,
        bos_token_id=None, eos_token_id=None, initializer_range=0.3,
    )  # fmt: skip
    transformers.GPT2LMHeadModel(config).save_pretrained(d)
    return d, tok


def test_sample_hf_continues_as_hugging_face_does(hf_dir, capsys):
    d, tok = hf_dir
    assert main(["sample", "--hf", str(d), "--prompt", "The ", "--max-new-tokens", "12",
                 "--temperature", "0"]) == 0  # fmt: skip
    ours = capsys.readouterr().out.rstrip("\n")
    hf = transformers.GPT2LMHeadModel.from_pretrained(d).eval()
    prompt = torch.tensor([tok.encode("The ")])
    theirs = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12,
                         do_sample=False, pad_token_id=0)  # fmt: skip
    assert ours == tok.decode(theirs[0].tolist())


def test_inspect_hf_reads_a_gpt2_directory(hf_dir, capsys):
    d, _ = hf_dir
    assert main(["inspect", "--hf", str(d), "--prompt", "The king"]) == 0
    out = capsys.readouterr().out
    assert "Hugging Face GPT-2" in out and "n_layer 2" in out


def test_a_missing_tokenizer_is_one_line(tmp_path, capsys):
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=300, n_positions=8, n_layer=1, n_head=1,
                                     n_embd=8, bos_token_id=None, eos_token_id=None)  # fmt: skip
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path)
    assert main(["sample", "--hf", str(tmp_path)]) == 2
    assert "no tokenizer in" in capsys.readouterr().err


def test_resuming_a_character_run_with_bpe_is_refused_naming_both(tmp_path):
    out = tmp_path / "run"
    with prepare_run(text=TEXT, out_dir=out, **SMALL) as run:
        run.fit()
    again = prepare_run(
        text=TEXT, out_dir=out, resume=True, tokenizer="bpe", vocab_size=300, **SMALL
    )
    with again, pytest.raises(ValueError, match="a different tokenizer: char in the checkpoint"):
        again.fit()
