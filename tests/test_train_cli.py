"""`gptblock train` and `gptblock sample`, in process: options, errors, resume, sampling."""

import dataclasses
import json

import pytest

from gptblock import load_gpt, train_gpt
from gptblock.cli import build_parser, main
from gptblock.data.text import default_corpus
from gptblock.devices import resolve_device
from gptblock.runs.checkpoint import load_checkpoint
from gptblock.train.presets import PRESETS, preset_settings
from gptblock.train.settings import RunSettings

SMALL = [
    "--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16",
    "--batch-size", "4", "--max-iters", "20", "--eval-interval", "10", "--eval-iters", "2",
    "--warmup", "2", "--device", "cpu", "--no-progress",
]  # fmt: skip


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "input.txt"
    path.write_text(default_corpus()[:4000], encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory, text_file):
    out = tmp_path_factory.mktemp("run")
    code = main(["train", "--data", str(text_file), "--out", str(out), *SMALL])
    assert code == 0
    return out


def test_help_shows_every_option_and_the_presets(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # no line breaks inside preset names
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for flag in (
        "--data", "--out", "--preset", "--n-layer", "--n-head", "--n-embd", "--block-size",
        "--dropout", "--max-iters", "--batch-size", "--lr", "--warmup", "--eval-interval",
        "--seed", "--device", "--dtype", "--compile", "--resume", "--allow-other-data",
    ):  # fmt: skip
        assert flag in out, flag
    assert (
        "(preset: shakespeare-cpu 3, shakespeare-cpu-modern 3, shakespeare-cpu-long 3, nanogpt-cpu 4, tiny 4, shakespeare 6)"
        in out
    )
    assert (
        "(preset: shakespeare-cpu 32, shakespeare-cpu-modern 32, shakespeare-cpu-long 64, nanogpt-cpu 64, tiny 64, shakespeare 256)"
        in out
    )
    assert "(default: None)" not in out


def test_every_setting_is_a_flag_made_from_its_field():
    # The flags are derived from RunSettings: name, type, choices and help come from the field.
    parser = build_parser()
    train = parser._subparsers._group_actions[0].choices["train"]
    flags = {a.dest: a for a in train._actions}
    for f in dataclasses.fields(RunSettings):
        action = flags[f.name]
        assert action.option_strings[0] == "--" + f.name.replace("_", "-")
        assert action.help.startswith(f.metadata["help"]) and action.default is None
        assert tuple(action.choices or ()) == f.metadata["choices"]
    assert flags["n_layer"].type is int and flags["lr"].type is float
    assert flags["vocab_size"].type is int and flags["compile"].type is None  # --[no-]compile
    args = parser.parse_args(["train", "--no-compile", "--vocab-size", "300", "--lr", "0.01"])
    assert (args.compile, args.vocab_size, args.lr, args.n_layer) == (False, 300, 0.01, None)


def test_the_library_and_the_command_line_make_the_same_run(tmp_path, text_file):
    # No --device, --seed, --dtype, ...: both take RunSettings' defaults (device "auto").
    flags = [f for f in SMALL if f not in ("--device", "cpu")]
    flags[flags.index("20")] = "2"  # --max-iters 2
    cli, lib = tmp_path / "cli", tmp_path / "lib"
    assert main(["train", "--data", str(text_file), "--out", str(cli), *flags]) == 0
    train_gpt(text_file, out_dir=lib, progress=False, n_layer=1, n_head=2, n_embd=16,
              block_size=16, batch_size=4, max_iters=2, eval_interval=10, eval_iters=2, warmup=2)  # fmt: skip
    ours, theirs = (load_checkpoint(d, "last").meta for d in (cli, lib))
    assert ours["train_config"] == theirs["train_config"]
    assert ours["train_config"]["device"] == resolve_device("auto")
    assert ours["model_config"] == theirs["model_config"]


def test_explicit_flags_override_the_preset():
    args = build_parser().parse_args(["train", "--preset", "shakespeare", "--n-layer", "2"])
    settings = preset_settings(args.preset, {"n_layer": args.n_layer, "lr": args.lr})
    assert settings == dataclasses.replace(preset_settings("shakespeare"), n_layer=2)
    assert PRESETS["shakespeare"] == RunSettings(
        n_layer=6, n_head=6, n_embd=384, block_size=256, dropout=0.2, batch_size=64, lr=1e-3,
        max_iters=5000, warmup=100, eval_interval=250, eval_iters=200,
    )  # fmt: skip


def test_a_run_reports_saves_and_samples(trained, capsys):
    meta = load_checkpoint(trained, "last").meta
    assert meta["step"] == 20 and meta["model_config"]["n_embd"] == 16
    assert meta["data"]["characters"] == 4000
    assert (trained / "loss.png").exists() and load_checkpoint(trained, "best")
    model, tok, _ = load_gpt(trained)
    assert model.config.vocab_size == tok.vocab_size == len(set(default_corpus()[:4000]))


def test_the_run_prints_the_whole_split_loss_and_a_sample(tmp_path, text_file, capsys):
    assert main(["train", "--data", str(text_file), "--out", str(tmp_path), *SMALL]) == 0
    out = capsys.readouterr().out
    assert "validation loss" in out and "over the whole validation split (399 tokens, " in out
    assert "--- sample" in out and len(out.split("--- sample")[1]) > 300


def test_same_seed_same_text(trained, capsys):
    def sample(*extra):
        assert main(["sample", "--out", str(trained), "--max-new-tokens", "60", *extra]) == 0
        return capsys.readouterr().out

    a, b, c = sample("--seed", "1"), sample("--seed", "1"), sample("--seed", "2")
    assert a == b and a != c
    assert sample("--prompt", "The ", "--top-k", "5").startswith("The ")
    greedy = sample("--temperature", "0", "--seed", "3")
    assert greedy == sample("--temperature", "0", "--seed", "4")


def test_prompt_outside_the_vocabulary_is_listed(trained, capsys):
    assert main(["sample", "--out", str(trained), "--prompt", "héllo €"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "2 character(s) outside the model's vocabulary: 'é', '€'" in err


def test_sample_without_a_run(tmp_path, capsys):
    assert main(["sample", "--out", str(tmp_path)]) == 2
    assert "no best checkpoint" in capsys.readouterr().err


def write(tmp_path, name, data):
    p = tmp_path / name
    p.write_bytes(data)
    return str(p)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d: str(d / "missing.txt"), "no such file"),
        (lambda d: str(d), "is a directory"),
        (lambda d: write(d, "empty.txt", b""), "is empty"),
        (lambda d: write(d, "bin.txt", b"\xff\xfe\x00abc"), "is not UTF-8 text"),
        (lambda d: write(d, "short.txt", b"a short text"), "too short for block_size=16"),
    ],
    ids=["missing", "directory", "empty", "not-utf8", "too-short"],
)
def test_bad_data_is_one_line_and_exit_2(tmp_path, capsys, make, message):
    code = main(["train", "--data", make(tmp_path), "--out", str(tmp_path / "o"), *SMALL])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1, err
    assert err.startswith("gptblock train: error: ")


def test_an_existing_run_is_not_overwritten(trained, text_file, capsys):
    before = (trained / "last.json").read_bytes()
    assert main(["train", "--data", str(text_file), "--out", str(trained), *SMALL]) == 2
    assert "already holds a training run; pass --resume" in capsys.readouterr().err
    assert (trained / "last.json").read_bytes() == before


def test_resume_with_another_shape_names_the_fields(trained, text_file, capsys):
    args = ["train", "--data", str(text_file), "--out", str(trained), *SMALL, "--resume"]
    assert main([*args, "--n-embd", "32", "--n-layer", "2"]) == 2
    err = capsys.readouterr().err
    assert "n_embd=16 in the checkpoint, 32 now; n_layer=1 in the checkpoint, 2 now" in err


def test_resume_continues_to_more_steps(tmp_path, text_file, capsys):
    args = ["train", "--data", str(text_file), "--out", str(tmp_path), *SMALL]
    assert main(args) == 0
    assert main([*args, "--resume", "--max-iters", "30"]) == 0
    meta = json.loads((tmp_path / "last.json").read_text())
    assert meta["step"] == 30 and len(meta["history"]["loss"]) == 30
