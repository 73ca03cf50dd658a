"""Checkpoints: round trips, crash safety, and clear errors for damaged or foreign files."""

import json
import os
import pickle

import pytest
import torch
import torch.nn as nn

from gptblock.runs import checkpoint as ck
from gptblock.runs.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from gptblock.runs.statedict import load_model_state, load_optimizer_state, optimizer_parts


def small_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(5, 4), nn.LayerNorm(4), nn.Linear(4, 5))


def save_model(d, model, step=3, kind="last", **meta):
    tensors = {f"model.{k}": v for k, v in model.state_dict().items()}
    return save_checkpoint(d, kind, tensors, {"step": step, **meta})


def test_round_trip_is_exact(tmp_path):
    model = small_model()
    save_model(tmp_path, model, step=12, vocab=["a", "é"], best_val_loss=None)
    ckpt = load_checkpoint(tmp_path, "last")
    assert ckpt.meta["step"] == 12 and ckpt.meta["vocab"] == ["a", "é"]
    other = nn.Sequential(nn.Embedding(5, 4), nn.LayerNorm(4), nn.Linear(4, 5))
    load_model_state(other, ckpt)
    for k, v in model.state_dict().items():
        assert torch.equal(other.state_dict()[k], v), k


def test_tied_weights_save(tmp_path):
    # safetensors refuses tensors sharing memory; GPT ties its head to the token embedding.
    emb = nn.Embedding(5, 4)
    head = nn.Linear(4, 5, bias=False)
    head.weight = emb.weight
    model = nn.ModuleDict({"emb": emb, "head": head})
    save_model(tmp_path, model)
    fresh = nn.ModuleDict({"emb": nn.Embedding(5, 4), "head": nn.Linear(4, 5, bias=False)})
    load_model_state(fresh, load_checkpoint(tmp_path))
    assert torch.equal(fresh["head"].weight, emb.weight)


def test_only_safetensors_and_json_no_pickle(tmp_path, monkeypatch):
    save_model(tmp_path, small_model())
    names = sorted(p.suffix for p in tmp_path.iterdir())
    assert names == [".json", ".safetensors", ".written"]  # .gptblock.written: runs.owned

    def refuse(*args, **kwargs):
        raise AssertionError("pickle used while loading a checkpoint")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(torch, "load", refuse)
    load_model_state(small_model(), load_checkpoint(tmp_path))


def test_optimizer_state_round_trip(tmp_path):
    model = small_model()
    opt = torch.optim.AdamW(
        [
            {"params": [model[0].weight, model[2].weight]},
            {"params": [model[1].weight, model[1].bias, model[2].bias], "weight_decay": 0.0},
        ],
        lr=0.01,
        betas=(0.9, 0.95),
    )
    for _ in range(3):
        model(torch.tensor([[1, 2, 3]])).sum().backward()
        opt.step()
    tensors, meta = optimizer_parts(opt)
    save_checkpoint(tmp_path, "last", tensors, {"step": 3, "optimizer": meta})
    fresh = small_model()
    opt2 = torch.optim.AdamW(
        [
            {"params": [fresh[0].weight, fresh[2].weight]},
            {"params": [fresh[1].weight, fresh[1].bias, fresh[2].bias], "weight_decay": 0.0},
        ],
        lr=0.5,
    )
    load_optimizer_state(opt2, load_checkpoint(tmp_path))
    a, b = opt.state_dict(), opt2.state_dict()
    assert a["param_groups"] == b["param_groups"]
    for idx, state in a["state"].items():
        for key, value in state.items():
            assert torch.equal(value, b["state"][idx][key]), (idx, key)


def test_optimizer_state_of_another_model_is_refused(tmp_path):
    model = small_model()
    opt = torch.optim.AdamW(model.parameters())
    model(torch.tensor([[1]])).sum().backward()
    opt.step()
    tensors, meta = optimizer_parts(opt)
    save_checkpoint(tmp_path, "last", tensors, {"step": 1, "optimizer": meta})
    other = nn.Sequential(nn.Embedding(5, 6), nn.LayerNorm(6), nn.Linear(6, 5))
    with pytest.raises(
        CheckpointError, match=r"optim\.0\.exp_avg has shape \(5, 4\), its parameter has \(5, 6\)"
    ):
        load_optimizer_state(torch.optim.AdamW(other.parameters()), load_checkpoint(tmp_path))


def test_a_different_model_names_the_tensors(tmp_path):
    save_model(tmp_path, small_model())
    other = nn.Sequential(nn.Embedding(5, 8), nn.LayerNorm(8), nn.Linear(8, 5), nn.ReLU())
    with pytest.raises(CheckpointError) as e:
        load_model_state(other, load_checkpoint(tmp_path))
    msg = str(e.value)
    assert ".safetensors: does not fit this model" in msg
    assert "0.weight has shape (5, 4), the model expects (5, 8)" in msg


def test_missing_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match="no last checkpoint in"):
        load_checkpoint(tmp_path, "last")
    with pytest.raises(ValueError, match="kind must be one of"):
        load_checkpoint(tmp_path, "newest")


def tensors_file(d):
    (p,) = d.glob("last-*.safetensors")
    return p


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete", "garbage"])
def test_damaged_tensors_file_is_named(tmp_path, damage):
    save_model(tmp_path, small_model())
    p = tensors_file(tmp_path)
    blob = p.read_bytes()
    if damage == "truncate":
        p.write_bytes(blob[: len(blob) // 2])
    elif damage == "flip":
        p.write_bytes(blob[:-5] + bytes([blob[-5] ^ 1]) + blob[-4:])
    elif damage == "delete":
        p.unlink()
    else:
        p.write_bytes(b"not a safetensors file")
    expected = "is missing" if damage == "delete" else "truncated or corrupted"
    with pytest.raises(CheckpointError, match=expected) as e:
        load_checkpoint(tmp_path)
    assert p.name in str(e.value)


def test_unreadable_safetensors_with_a_matching_hash_is_named(tmp_path):
    save_model(tmp_path, small_model())
    p = tensors_file(tmp_path)
    p.write_bytes(b"\x00" * 16)
    meta = json.loads((tmp_path / "last.json").read_text())
    meta["sha256"] = __import__("hashlib").sha256(p.read_bytes()).hexdigest()
    meta["json_sha256"] = ck._fields_sha256(meta)  # a forger who recomputes both hashes
    (tmp_path / "last.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        load_checkpoint(tmp_path)


@pytest.mark.parametrize(
    "text, expected",
    [
        ('{"step": 3, "tens', "last.json: not valid JSON"),
        ("[1, 2]", "expected a JSON object, got list"),
        (
            '{"format": "gptblock-checkpoint", "version": 1, "step": 1}',
            "missing field\\(s\\) tensors, sha256",
        ),
        (
            '{"format": "other", "version": 1, "step": 1, "tensors": "x", "sha256": ""}',
            "format 'other'",
        ),
    ],
)
def test_bad_json_is_named(tmp_path, text, expected):
    save_model(tmp_path, small_model())
    (tmp_path / "last.json").write_text(text)
    with pytest.raises(CheckpointError, match=expected):
        load_checkpoint(tmp_path)


def test_json_cannot_point_outside_its_directory(tmp_path):
    save_model(tmp_path, small_model())
    meta = json.loads((tmp_path / "last.json").read_text())
    meta["tensors"] = "../elsewhere.safetensors"
    meta["json_sha256"] = ck._fields_sha256(meta)  # so that the check of the name itself runs
    (tmp_path / "last.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="must be a file name"):
        load_checkpoint(tmp_path)


def test_crash_before_the_json_commit_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    model = small_model()
    save_model(tmp_path, model, step=1)
    real_replace = os.replace

    def crash_on_json(src, dst):
        if str(dst).endswith("last.json"):
            raise KeyboardInterrupt("killed between the two files")
        real_replace(src, dst)

    monkeypatch.setattr(ck.os, "replace", crash_on_json)
    with torch.no_grad():
        model[0].weight.add_(1.0)
    with pytest.raises(KeyboardInterrupt):
        save_model(tmp_path, model, step=2)
    monkeypatch.setattr(ck.os, "replace", real_replace)
    old = load_checkpoint(tmp_path)  # the old JSON and the old tensors, still a matching pair
    assert old.meta["step"] == 1
    assert len(list(tmp_path.glob("last-*.safetensors"))) == 2  # the new one, unreferenced
    save_model(tmp_path, model, step=3)  # the next save clears what the crash left
    assert load_checkpoint(tmp_path).meta["step"] == 3
    assert len(list(tmp_path.glob("last-*.safetensors"))) == 1
    assert not list(tmp_path.glob(".*.tmp"))


def test_last_and_best_are_separate(tmp_path):
    model = small_model()
    save_model(tmp_path, model, step=5, kind="best")
    save_model(tmp_path, model, step=9, kind="last")
    save_model(tmp_path, model, step=10, kind="last")
    assert load_checkpoint(tmp_path, "best").meta["step"] == 5
    assert load_checkpoint(tmp_path, "last").meta["step"] == 10
    assert len(list(tmp_path.glob("*.safetensors"))) == 2


def test_non_finite_numbers_are_not_written_as_json(tmp_path):
    with pytest.raises(ValueError, match="not JSON compliant"):
        save_model(tmp_path, small_model(), best_val_loss=float("nan"))
    with pytest.raises(TypeError, match=r"meta\['step'\] must be an int"):
        save_checkpoint(tmp_path, "last", {}, {"step": 1.0})


def test_check_same_field_names_the_differences(tmp_path):
    save_model(tmp_path, small_model())
    ckpt = load_checkpoint(tmp_path)
    ck.check_same_field(ckpt, "model_config", {"n_layer": 2}, {"n_layer": 2})
    with pytest.raises(
        CheckpointError,
        match=r"n_embd=32 in the checkpoint, 64 now; n_layer=2 in the checkpoint, 4 now",
    ):
        ck.check_same_field(
            ckpt,
            "model_config",
            {"n_layer": 2, "n_embd": 32, "n_head": 4},
            {"n_layer": 4, "n_embd": 64, "n_head": 4},
        )


def test_a_reader_racing_a_writer_gets_the_new_checkpoint(tmp_path, monkeypatch):
    model = small_model()
    save_model(tmp_path, model, step=1)
    real_load = ck._load
    calls = []

    def writer_commits_in_between(json_path, raw):
        calls.append(1)
        if len(calls) == 1:  # the JSON was read; now a save replaces it and deletes the old tensors
            save_model(tmp_path, model, step=2)
        return real_load(json_path, raw)

    monkeypatch.setattr(ck, "_load", writer_commits_in_between)
    assert load_checkpoint(tmp_path).meta["step"] == 2 and len(calls) == 2
