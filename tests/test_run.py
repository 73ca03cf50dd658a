"""gptblock.train.run: a GPT trained on a text by one library call, and the same run read back."""

import dataclasses
import json

import pytest
import torch

from gptblock import RunMeta, load_gpt, train_gpt
from gptblock.data.text import default_corpus
from gptblock.runs.checkpoint import load_checkpoint
from gptblock.sampling import sample_text
from gptblock.train.config import TrainConfig
from gptblock.train.presets import PRESETS, preset_settings
from gptblock.train.run import prepare_run
from gptblock.train.settings import RunSettings

TEXT = default_corpus()[:3000]
SMALL = dict(
    n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=4, max_iters=6,
    eval_interval=3, eval_iters=1, warmup=1, progress=False,
)  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    return train_gpt(text=TEXT, out_dir=out, seed=3, **SMALL), out


def test_train_gpt_writes_a_run_that_load_gpt_reads(trained):
    run, out = trained
    assert run.result.step == 6 and not run.result.interrupted
    model, tok, ckpt = load_gpt(out)
    assert RunMeta.from_checkpoint(ckpt) == run.meta
    assert (
        run.meta.corpus.characters == len(TEXT) and run.meta.corpus.source == "text given in Python"
    )
    assert tok == run.tokenizer and model.config == run.meta.model_config
    # The run's own fields are exactly what RunMeta writes.
    saved = json.loads((out / "last.json").read_text())
    assert {k: saved[k] for k in ("model_config", "vocab", "data")} == run.meta.to_json()


def test_the_seed_decides_the_run(tmp_path, trained):
    run, out = trained
    again = train_gpt(text=TEXT, out_dir=tmp_path, seed=3, **SMALL)
    assert again.trainer.losses == run.trainer.losses
    other = train_gpt(text=TEXT, out_dir=None, seed=4, **SMALL)
    assert other.trainer.losses != run.trainer.losses


def test_an_existing_run_is_kept_unless_resume_is_asked_for(trained):
    run, out = trained
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(FileExistsError, match="already holds a training run"):
        train_gpt(text=TEXT, out_dir=out, seed=3, **SMALL)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    with prepare_run(text=TEXT, out_dir=out, seed=3, resume=True, **{**SMALL, "max_iters": 9}) as r:
        r.fit()
    assert load_checkpoint(out).meta["step"] == 9


def test_resume_refuses_another_model(tmp_path):
    train_gpt(text=TEXT, out_dir=tmp_path, **SMALL)
    with pytest.raises(ValueError, match="n_embd=16 in the checkpoint, 32 now"):
        train_gpt(text=TEXT, out_dir=tmp_path, resume=True, **{**SMALL, "n_embd": 32})


def test_settings_come_from_the_preset_with_overrides():
    tiny = preset_settings("tiny")
    assert tiny == PRESETS["tiny"] and tiny.optimizer == "adamw" and isinstance(tiny, RunSettings)
    # The training settings a preset leaves are TrainConfig's defaults.
    assert (tiny.weight_decay, tiny.schedule) == (
        TrainConfig().weight_decay,
        TrainConfig().schedule,
    )
    assert preset_settings("tiny", {"lr": 1e-2, "n_layer": None}) == dataclasses.replace(
        tiny, lr=1e-2
    )
    with pytest.raises(ValueError, match="unknown setting 'layers'"):
        preset_settings("tiny", {"layers": 2})
    # A setting is checked when the settings are made, before any text is read.
    with pytest.raises(ValueError, match="n_layer must be a positive int, got 0"):
        preset_settings("tiny", {"n_layer": 0})
    with pytest.raises(
        ValueError, match=r"optimizer must be one of \('adamw', 'muon'\), got 'sgd'"
    ):
        preset_settings("tiny", {"optimizer": "sgd"})
    with pytest.raises(ValueError, match="tokenizer='bpe' needs a vocab_size"):
        prepare_run("no-such-file.txt", out_dir=None, tokenizer="bpe")
    with pytest.raises(ValueError, match=r"give data .* or text, not both"):
        prepare_run("input.txt", text=TEXT)


def test_sample_text_is_seeded_and_checks_the_prompt(trained):
    run, _ = trained
    a = sample_text(run.model, run.tokenizer, "The ", max_new_tokens=20, seed=5)
    assert a == run.sample("The ", max_new_tokens=20, seed=5) and a.startswith("The ")
    assert len(a) == 24
    with pytest.raises(ValueError, match="must not be empty"):
        sample_text(run.model, run.tokenizer, "")
    with pytest.raises(ValueError, match="outside the model's vocabulary: '€'"):
        sample_text(run.model, run.tokenizer, "€")
    assert torch.is_grad_enabled()
