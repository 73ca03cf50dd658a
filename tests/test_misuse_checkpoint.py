"""Misuse, class 2: a checkpoint says what it holds, all of it (issue 12).

Every field of a checkpoint is covered by a hash or refused on load: an edited JSON is refused
as changed; a JSON whose hash was recomputed (a forger, a bug, a format-1 file) is refused field
by field, naming the field; tied weights are stored once or checked equal; the corpus is
fingerprinted, and resuming on other data is refused unless asked for. Each case asserts the
error type and the field named: none gives a traceback (a non-UserError fails the test) or a
silently wrong result (the refusal is the result).
"""

import hashlib
import re
import shutil
import warnings
from pathlib import Path

import pytest
import torch

from forge import edit_json, edit_tensors, read_json, set_path, write_json
from gptblock import CheckpointError, load_gpt, train_gpt
from gptblock.cli import main
from gptblock.data.text import default_corpus
from gptblock.errors import UserError
from gptblock.runs.checkpoint import load_checkpoint
from gptblock.train.run import prepare_run

TEXT = default_corpus()[:3000]
SMALL = dict(
    n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=4, max_iters=6,
    eval_interval=3, eval_iters=1, warmup=1, progress=False,
)  # fmt: skip
FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    out = tmp_path_factory.mktemp("saved")
    train_gpt(text=TEXT, out_dir=out, seed=5, **SMALL)
    return out


@pytest.fixture
def run(saved, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(saved, copy)
    return copy


def resume(run, text=TEXT, **kwargs):
    with prepare_run(text=text, out_dir=run, seed=5, resume=True, **{**SMALL, **kwargs}) as r:
        return r.fit()


SCALER = dict(
    scale=1.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=9, _growth_tracker=0
)


def swap_two_vocabulary_characters(meta):
    meta["vocab"][10], meta["vocab"][11] = meta["vocab"][11], meta["vocab"][10]


# --- an edited JSON is refused as changed ------------------------------------------------------

EDITS = {
    "vocab swapped": swap_two_vocabulary_characters,
    "step -5": lambda m: set_path(m, "step", -5),
    "step 1000000": lambda m: set_path(m, "step", 1_000_000),
    "step 3": lambda m: set_path(m, "step", 3),
    "best_val_loss": lambda m: set_path(m, "best_val_loss", 0.01),
    "a loss in the history": lambda m: m["history"]["loss"].__setitem__(0, 0.5),
    "model_config": lambda m: set_path(m, "model_config.dropout", 0.5),
    "data source": lambda m: set_path(m, "data.source", "elsewhere.txt"),
    "corpus hash": lambda m: set_path(m, "data.sha256", "0" * 64),
    "learning rate": lambda m: set_path(m, "train_config.lr", 1.0),
    "a new field": lambda m: set_path(m, "note", "hello"),
    "a field removed": lambda m: m.pop("world_size"),
    "tied removed": lambda m: m.pop("tied"),
    "the hash itself": lambda m: set_path(m, "json_sha256", "0" * 64),
}


@pytest.mark.parametrize("edit", EDITS.values(), ids=EDITS.keys())
@pytest.mark.parametrize("kind", ["last", "best"])
def test_an_edited_json_is_refused_as_changed(run, edit, kind):
    edit_json(run, edit, kind=kind, rehash=False)
    with pytest.raises(CheckpointError, match=f"{kind}.json: its fields were changed"):
        load_checkpoint(run, kind)


def test_the_edits_reach_the_command_line_as_one_line(run, capsys):
    edit_json(run, swap_two_vocabulary_characters, kind="best", rehash=False)
    edit_json(run, lambda m: set_path(m, "step", -5), kind="last", rehash=False)
    assert main(["sample", "--out", str(run), "--max-new-tokens", "5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "best.json: its fields were changed" in err, err
    data = run / "input.txt"
    data.write_text(TEXT)
    args = ["train", "--data", str(data), "--out", str(run), "--resume", "--no-progress"]
    args += ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "last.json: its fields were changed" in err, err


# --- a JSON with a recomputed hash: each field is checked ---------------------------------------

FORGED = {
    "step -5": (lambda m: set_path(m, "step", -5), "field 'step' must be an int >= 0"),
    "step '6'": (lambda m: set_path(m, "step", "6"), "field 'step' must be an int >= 0"),
    "step True": (lambda m: set_path(m, "step", True), "field 'step' must be an int >= 0"),
    "step 1000000": (
        lambda m: set_path(m, "step", 1_000_000),
        "field 'step' is 1000000, beyond max_iters=6",
    ),
    "best_val_loss not the lowest": (
        lambda m: set_path(m, "best_val_loss", 0.01),
        "field 'best_val_loss' must be the lowest validation estimate",
    ),
    "best_val_loss a string": (
        lambda m: set_path(m, "best_val_loss", "low"),
        "field 'best_val_loss'",
    ),
    "history.loss too short": (
        lambda m: m["history"]["loss"].pop(),
        "field 'history.loss' must be a list of 6 finite losses",
    ),
    "history.loss not numbers": (
        lambda m: m["history"]["loss"].__setitem__(2, None),
        "field 'history.loss'",
    ),
    "history.evals out of order": (
        lambda m: m["history"]["evals"].reverse(),
        "field 'history.evals' must be estimates at increasing steps",
    ),
    "history.evals beyond step": (
        lambda m: set_path(m, "step", 2) or m["history"]["loss"].__delitem__(slice(2, None)),
        "field 'history.evals' must be estimates at increasing steps <= 2",
    ),
    "history.evals malformed": (
        lambda m: m["history"]["evals"].__setitem__(0, {"step": 0}),
        "field 'history.evals'",
    ),
    "history missing a part": (lambda m: m["history"].pop("evals"), "field 'history'"),
    "world_size 0": (lambda m: set_path(m, "world_size", 0), "field 'world_size'"),
    "train_config.max_iters": (
        lambda m: set_path(m, "train_config.max_iters", "many"),
        "invalid field 'train_config' \\(max_iters must be an int",
    ),
    "scaler a list": (lambda m: set_path(m, "scaler", [1]), "field 'scaler'"),
    "scaler of other keys": (lambda m: set_path(m, "scaler", {"scale": 1.0}), "field 'scaler'"),
    "scaler of the wrong types": (
        lambda m: set_path(m, "scaler", dict(SCALER, scale="1")),
        "field 'scaler.scale' must be a positive, finite number",
    ),
    "vocab with a duplicate": (
        lambda m: m["vocab"].__setitem__(1, m["vocab"][0]),
        "invalid field 'vocab'",
    ),
    "vocab of words": (lambda m: m["vocab"].__setitem__(1, "ab"), "invalid field 'vocab'"),
    "model_config n_head": (
        lambda m: set_path(m, "model_config.n_head", 3),
        "invalid field 'model_config'",
    ),
    "data.characters negative": (
        lambda m: set_path(m, "data.characters", -1),
        "field 'data.characters'",
    ),
    "tied to a missing tensor": (
        lambda m: set_path(m, "tied", {"model.lm_head.weight": "model.nothing"}),
        "field 'tied'",
    ),
    "tensors outside the directory": (
        lambda m: set_path(m, "tensors", "../best.safetensors"),
        "field 'tensors' must be a file name",
    ),
    "sha256 not a digest": (lambda m: set_path(m, "sha256", "abc"), "field 'sha256'"),
    "version 3": (lambda m: set_path(m, "version", 3), "a newer gptblock may read it"),
    "format": (lambda m: set_path(m, "format", "other"), "format 'other'"),
    "missing step": (lambda m: m.pop("step"), r"missing field\(s\) step"),
    "missing optimizer": (lambda m: m.pop("optimizer"), r"missing field\(s\) optimizer"),
}


@pytest.mark.parametrize("forge, message", FORGED.values(), ids=FORGED.keys())
def test_a_forged_field_is_refused_naming_it(run, forge, message):
    edit_json(run, forge, kind="last")
    with pytest.raises(CheckpointError, match=message):
        load_gpt(run, "last")
    with pytest.raises(CheckpointError, match=message):
        resume(run)


OPTIMIZER = {
    "betas a string": (
        lambda m: set_path(m["optimizer"]["param_groups"][0], "betas", "fast"),
        "optimizer group 0 has betas='fast'",
    ),
    "eps a flag": (
        lambda m: set_path(m["optimizer"]["param_groups"][1], "eps", True),
        "optimizer group 1 has eps=True",
    ),
    "a group too many": (
        lambda m: m["optimizer"]["param_groups"].append(m["optimizer"]["param_groups"][0]),
        "optimizer parameter groups of sizes",
    ),
    "one parameter ten times": (  # the group's size kept
        lambda m: set_path(m["optimizer"]["param_groups"][3], "params", [6] * 10),
        "optimizer group 3 lists parameters \\[6, 6, 6",
    ),
    "a step that is no count": (
        lambda m: set_path(m["optimizer"]["state_scalars"]["4"], "step", -2.5),
        "optimizer state 4.step must be an int >= 0",
    ),
    "state of a parameter it lacks": (
        lambda m: set_path(m["optimizer"]["state_scalars"], "99", {"x": 1}),
        "optimizer state for parameter 99",
    ),
}


@pytest.mark.parametrize("forge, message", OPTIMIZER.values(), ids=OPTIMIZER.keys())
def test_a_forged_optimizer_state_is_refused_naming_it(run, forge, message):
    edit_json(run, forge, kind="last")
    with pytest.raises(CheckpointError, match=message):
        resume(run)


def _retype(name, dtype):
    def change(tensors):
        key = next(k for k in sorted(tensors) if k.startswith(name))
        tensors[key] = tensors[key].to(dtype)

    return change


@pytest.mark.parametrize(
    "change, message",
    [
        (_retype("rng.data", torch.float32), "rng.data must be an RNG state .5056 uint8., got"),
        (_retype("rng.cpu.0", torch.int64), "rng.cpu.0 must be an RNG state"),
        (_retype("optim.", torch.int64), "must be a float tensor, got torch.int64"),
    ],
)
def test_a_forged_tensor_of_the_restored_state_is_refused_naming_it(run, change, message):
    edit_tensors(run, change, kind="last")
    with pytest.raises(CheckpointError, match=message):
        resume(run)


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "1e999"])
def test_json_numbers_that_are_no_json_are_refused(run, constant):
    path = run / "last.json"
    text = path.read_text().replace('"best_val_loss": ', f'"best_val_loss": {constant}, "x": ', 1)
    path.write_text(text)
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_checkpoint(run)


def test_a_deeply_nested_json_is_refused(run):
    (run / "last.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_checkpoint(run)


# --- tensors: tied weights and finite values -----------------------------------------------------


def test_tied_weights_are_stored_once(run):
    ckpt = load_checkpoint(run, "best")
    assert ckpt.meta["tied"] == {"model.lm_head.weight": "model.transformer.wte.weight"}
    stored = safetensors_names(run / ckpt.meta["tensors"])
    assert "model.transformer.wte.weight" in stored and "model.lm_head.weight" not in stored
    model, _, _ = load_gpt(run)
    assert model.lm_head.weight is model.transformer["wte"].weight


def safetensors_names(path):
    import safetensors

    with safetensors.safe_open(path, "pt") as f:
        return set(f.keys())


@pytest.mark.parametrize(
    "name", ["model.transformer.wte.weight", "model.transformer.h.0.linear1.weight"]
)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_weight_is_refused_naming_it(run, name, bad):
    def poison(tensors):
        tensors[name][0, 0] = bad

    edit_tensors(run, poison, kind="best")
    edit_tensors(run, poison, kind="last")
    with pytest.raises(CheckpointError, match=f"{name} holds 1 NaN or infinite value"):
        load_gpt(run)
    with pytest.raises(CheckpointError, match=f"{name} holds 1 NaN or infinite value"):
        resume(run)


def test_a_non_finite_optimizer_moment_is_refused(run):
    # AdamW's second moment, or Muon's momentum where the run trains with Muon.
    names = []

    def poison(tensors):
        names.append(
            next(k for k in sorted(tensors) if k.endswith(("exp_avg_sq", "momentum_buffer")))
        )
        tensors[names[0]].fill_(float("nan"))

    edit_tensors(run, poison)
    with pytest.raises(CheckpointError, match=rf"{re.escape(names[0])} holds \d+ NaN"):
        resume(run)


def v1_run(tmp_path):
    copy = tmp_path / "v1"
    shutil.copytree(FIXTURES / "run-v1", copy)
    return copy


def edit_v1_tensors(run, change, kind="best"):
    meta = read_json(run, kind)
    path = run / meta["tensors"]
    import safetensors.torch

    tensors = safetensors.torch.load(path.read_bytes())
    change(tensors)
    blob = safetensors.torch.save(tensors)
    path.write_bytes(blob)
    meta["sha256"] = hashlib.sha256(blob).hexdigest()
    write_json(run, meta, kind)  # format 1 has no JSON hash to recompute


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda t: t["model.transformer.wte.weight"].__setitem__((0, 0), float("nan")),
            "are one tensor in the model \\(tied\\) but hold different values",
        ),
        (
            lambda t: t["model.lm_head.weight"].__setitem__((0, 0), float("nan")),
            "are one tensor in the model \\(tied\\) but hold different values",
        ),
        (
            lambda t: t["model.lm_head.weight"].mul_(2),
            "model.transformer.wte.weight and model.lm_head.weight are one tensor",
        ),
        (
            lambda t: [
                t[k][0, 0].fill_(float("nan"))
                for k in ("model.lm_head.weight", "model.transformer.wte.weight")
            ],
            "model.transformer.wte.weight holds 1 NaN",
        ),
    ],
    ids=["nan-in-wte", "nan-in-lm_head", "head-differs", "nan-in-both"],
)
def test_a_format_1_checkpoint_with_two_copies_of_a_tied_weight_must_agree(
    tmp_path, change, message
):
    run = v1_run(tmp_path)
    edit_v1_tensors(run, change)
    with pytest.warns(UserWarning, match="format-1"), pytest.raises(CheckpointError, match=message):
        load_gpt(run)


# --- format 1 keeps loading, saying once what it cannot verify ----------------------------------


def test_a_format_1_checkpoint_loads_and_warns_once(tmp_path):
    run = v1_run(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for _ in range(3):
            load_gpt(run, "best")
    said = [w for w in caught if "format-1 checkpoint" in str(w.message)]
    assert len(said) == 1 and "its JSON fields cannot be" in str(said[0].message)


def test_a_format_1_checkpoint_edited_is_still_checked_field_by_field(tmp_path):
    run = v1_run(tmp_path)
    edit_json(run, lambda m: set_path(m, "step", -5), kind="best", rehash=False)
    with pytest.warns(UserWarning), pytest.raises(CheckpointError, match="field 'step'"):
        load_gpt(run, "best")


# --- the corpus fingerprint -------------------------------------------------------------------


def same_characters_other_text():
    other = TEXT[1500:] + TEXT[:1500]  # the same characters, the same size, another text
    assert sorted(set(other)) == sorted(set(TEXT)) and other != TEXT
    return other


def test_resume_on_other_data_is_refused_naming_both(run):
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    with pytest.raises(CheckpointError, match="other data") as e:
        resume(run, text=same_characters_other_text(), max_iters=9)
    mine = hashlib.sha256(TEXT.encode()).hexdigest()[:16]
    theirs = hashlib.sha256(same_characters_other_text().encode()).hexdigest()[:16]
    assert mine in str(e.value) and theirs in str(e.value)
    assert "--allow-other-data" in str(e.value) and f"{len(TEXT):,} characters" in str(e.value)
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.name != ".gptblock.lock"} == {
        k: v for k, v in before.items() if k != ".gptblock.lock"
    }


def test_resume_on_other_data_when_asked_records_the_new_data(run):
    other = same_characters_other_text()
    with pytest.warns(UserWarning, match="resuming on other data, as allowed"):
        result = resume(run, text=other, max_iters=9, allow_other_data=True)
    assert result.step == 9
    data = read_json(run)["data"]
    assert data["sha256"] == hashlib.sha256(other.encode()).hexdigest()


def test_resume_on_the_same_text_from_another_file_is_accepted(run, tmp_path):
    moved = tmp_path / "moved.txt"
    moved.write_text(TEXT)
    with prepare_run(moved, out_dir=run, seed=5, resume=True, **{**SMALL, "max_iters": 9}) as r:
        assert r.fit().step == 9
    assert read_json(run)["data"]["source"] == str(moved)


def test_the_command_line_refuses_other_data_unless_the_flag_is_given(run, tmp_path, capsys):
    other = tmp_path / "other.txt"
    other.write_text(same_characters_other_text())
    args = ["train", "--data", str(other), "--out", str(run), "--resume", "--no-progress"]
    args += ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16"]
    args += ["--batch-size", "4", "--max-iters", "9", "--eval-interval", "3", "--eval-iters", "1"]
    args += ["--warmup", "1", "--seed", "5"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "other data" in err and str(other) in err, err
    assert main([*args, "--allow-other-data"]) == 0
    err = capsys.readouterr().err
    assert err.count("warning: resuming on other data, as allowed") == 1, err
    assert read_json(run)["data"]["source"] == str(other)


def test_a_format_1_run_resumes_on_its_text_saying_it_cannot_verify_it(tmp_path, capsys):
    run = v1_run(tmp_path)
    args = ["train", "--data", str(FIXTURES / "v1-corpus.txt"), "--out", str(run), "--resume"]
    args += ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16"]
    args += ["--batch-size", "4", "--max-iters", "9", "--eval-interval", "3", "--eval-iters", "1"]
    args += ["--preset", "tiny"]  # the v1 run's, the default of 0.1 (AdamW)
    assert main([*args, "--no-progress", "--seed", "7"]) == 0
    err = capsys.readouterr().err
    assert err.count("recorded no hash of its text") == 1, err
    assert err.count("is a format-1 checkpoint") == 1, err
    assert read_json(run)["version"] == 2 and read_json(run)["data"]["sha256"]


def test_a_format_1_run_on_a_text_of_another_size_is_refused(tmp_path):
    run = v1_run(tmp_path)
    text = (FIXTURES / "v1-corpus.txt").read_text()
    short = dict(n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=4, max_iters=9)
    with (
        pytest.warns(UserWarning),
        prepare_run(text=text + text, out_dir=run, resume=True, progress=False, **short) as r,
        pytest.raises(CheckpointError, match=r"other data.*1,014 characters, no hash recorded"),
    ):
        r.fit()


def test_every_refusal_here_is_a_user_error():
    # What makes each refusal above one line on the command line, not a traceback.
    assert issubclass(CheckpointError, UserError) and issubclass(CheckpointError, ValueError)
