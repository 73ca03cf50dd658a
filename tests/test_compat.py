"""A run saved by an earlier release still loads, samples the same text and resumes.

``tests/fixtures/run-v1`` was written by ``gptblock train`` at commit 99454a3 (checkpoint format
version 1); ``v1-expected.json`` holds the command and what that release computed from it.
"""

import json
import shutil
from pathlib import Path

import torch

from gptblock import load_gpt
from gptblock.cli import main

FIXTURES = Path(__file__).parent / "fixtures"
RUN = FIXTURES / "run-v1"
EXPECTED = json.loads((FIXTURES / "v1-expected.json").read_text())


def test_v1_run_loads_and_computes_what_it_computed_when_saved():
    model, tok, ckpt = load_gpt(RUN, "best")
    assert ckpt.meta["step"] == EXPECTED["best_step"] and tok.vocab_size == EXPECTED["vocab_size"]
    idx = torch.tensor([tok.encode(EXPECTED["prompt"])])
    with torch.no_grad():
        logits = model(idx).logits[0, -1]
    assert torch.allclose(logits, torch.tensor(EXPECTED["last_logits_of_prompt"]), atol=1e-5)
    assert tok.decode(model.generate(idx, 40, temperature=0)[0]) == EXPECTED["greedy_40"]


def test_v1_run_resumes(tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    # The v1 run was the tiny preset (AdamW), the default of 0.1.
    args = ["train", "--data", str(FIXTURES / "v1-corpus.txt"), "--out", str(run), "--resume"]
    args += ["--preset", "tiny"]
    args += ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16"]
    args += ["--batch-size", "4", "--max-iters", "9", "--eval-interval", "3", "--eval-iters", "1"]
    assert main([*args, "--no-progress", "--seed", "7"]) == 0
    _, _, last = load_gpt(run, "last")
    assert last.meta["step"] == 9
    assert len(last.meta["history"]["loss"]) == 9
