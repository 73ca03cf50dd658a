"""gptblock.runs.statedict: a module's and an optimizer's state in and out of a checkpoint, checked
(the round trips themselves are in test_checkpoint.py, the GPT's cases in
test_misuse_checkpoint.py)."""

import pytest
import torch
import torch.nn as nn

from gptblock.runs.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from gptblock.runs.statedict import load_model_state, load_optimizer_state, optimizer_parts


def tied():
    emb, head = nn.Embedding(5, 4), nn.Linear(4, 5, bias=False)
    head.weight = emb.weight
    return nn.ModuleDict({"emb": emb, "head": head})


def save_tensors(d, tensors, **meta):
    save_checkpoint(d, "last", tensors, {"step": 1, **meta})
    return load_checkpoint(d)


def test_two_copies_of_a_tied_weight_must_agree(tmp_path):
    w = torch.randn(5, 4)
    ckpt = save_tensors(tmp_path, {"model.emb.weight": w, "model.head.weight": w + 1})
    with pytest.raises(
        CheckpointError, match=r"model\.emb\.weight and model\.head\.weight are one"
    ):
        load_model_state(tied(), ckpt)
    ckpt = save_tensors(tmp_path, {"model.emb.weight": w, "model.head.weight": w.clone()})
    model = tied()
    load_model_state(model, ckpt)  # equal copies, as format 1 stored them: fine
    assert torch.equal(model["head"].weight, w)


def test_a_non_finite_parameter_is_refused_but_a_buffer_may_hold_inf(tmp_path):
    model = nn.BatchNorm1d(3)
    state = {f"model.{k}": v.clone() for k, v in model.state_dict().items()}
    state["model.running_var"][0] = float("inf")  # a buffer: not checked
    load_model_state(model, save_tensors(tmp_path, state))
    state["model.weight"][1] = float("nan")
    with pytest.raises(CheckpointError, match=r"model.weight holds 1 NaN or infinite value"):
        load_model_state(nn.BatchNorm1d(3), save_tensors(tmp_path, state))


def test_hyperparameters_keep_their_kind(tmp_path):
    model = nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters(), betas=(0.9, 0.95))
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    tensors, meta = optimizer_parts(opt)
    for key, value, said in [
        ("betas", [0.9], r"betas=\(0\.9,\)"),
        ("eps", "small", "eps='small'"),
        ("amsgrad", 0, "amsgrad=0"),
        ("lr", None, "lr=None"),
    ]:
        bad = {**meta, "param_groups": [{**meta["param_groups"][0], key: value}]}
        ckpt = save_tensors(tmp_path, tensors, optimizer=bad)
        with pytest.raises(CheckpointError, match=said):
            load_optimizer_state(torch.optim.AdamW(nn.Linear(2, 2).parameters()), ckpt)
