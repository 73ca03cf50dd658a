"""`gptblock train` as real processes: two DDP ranks under torchrun, Ctrl-C, and SIGKILL."""

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from gptblock import load_gpt
from gptblock.cli import main
from gptblock.data.text import default_corpus
from gptblock.runs.checkpoint import load_checkpoint

SRC = Path(__file__).resolve().parents[1] / "src"
SMALL = [
    "--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16",
    "--eval-iters", "2", "--warmup", "2", "--device", "cpu", "--no-progress",
    "--dtype", "float32",  # processes follow one process to 1e-5, as float32 can (Muon too)
]  # fmt: skip


def env():
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(SRC), e.get("PYTHONPATH", "")])
    e["OMP_NUM_THREADS"] = "1"
    return e


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "input.txt"
    path.write_text(default_corpus()[:4000], encoding="utf-8")
    return str(path)


def gptblock_train(out, text_file, *extra):
    return [
        sys.executable,
        "-m",
        "gptblock",
        "train",
        "--data",
        text_file,
        "--out",
        str(out),
        *SMALL,
        *extra,
    ]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun not installed")
def test_two_ddp_processes_follow_the_single_process_trajectory(tmp_path, text_file):
    ddp, single = tmp_path / "ddp", tmp_path / "single"
    run = ["--batch-size", "8", "--max-iters", "10", "--eval-interval", "5"]
    torchrun = ["torchrun", "--standalone", "--nproc_per_node=2", "-m", "gptblock", "train"]
    cmd = torchrun + gptblock_train(ddp, text_file, *run)[4:]
    r = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("--- sample") == 1  # rank 0 alone prints
    assert "on 2 x cpu" in r.stdout
    # The single process's run, in this process: what the trajectory is compared with.
    assert main(gptblock_train(single, text_file, *run)[3:]) == 0
    a, b = load_checkpoint(ddp), load_checkpoint(single)
    assert (a.meta["world_size"], b.meta["world_size"]) == (2, 1)
    assert len(a.meta["history"]["loss"]) == 10
    assert a.meta["history"]["loss"] == pytest.approx(b.meta["history"]["loss"], abs=1e-5, rel=0)
    for e1, e2 in zip(a.meta["history"]["evals"], b.meta["history"]["evals"], strict=True):
        assert e1 == pytest.approx(e2, abs=1e-5, rel=0)
    for name, t in b.tensors.items():
        if name.startswith("model."):
            torch.testing.assert_close(a.tensors[name], t, atol=1e-5, rtol=0)
    # Each rank's dropout RNG state is saved, so each rank of a DDP run resumes exactly.
    assert {"rng.cpu.0", "rng.cpu.1"} <= set(a.tensors)


def start_and_wait_for_a_checkpoint(cmd, out):
    proc = subprocess.Popen(
        cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    while not (out / "last.json").exists():
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert time.monotonic() < deadline, "no checkpoint after 120 s"
        time.sleep(0.05)
    return proc


@pytest.mark.slow
def test_ctrl_c_saves_and_sigkill_at_any_moment_leaves_a_loadable_checkpoint(tmp_path, text_file):
    # Checkpoints every step, so a kill lands during a save as often as not.
    cmd = gptblock_train(tmp_path, text_file, "--max-iters", "100000", "--eval-interval", "1")
    proc = start_and_wait_for_a_checkpoint(cmd, tmp_path)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    step = load_checkpoint(tmp_path).meta["step"]
    assert f"interrupted at step {step}; saved {tmp_path / 'last.json'}" in err

    seed = random.randrange(10**6)
    proc = start_and_wait_for_a_checkpoint([*cmd, "--resume"], tmp_path)
    time.sleep(random.Random(seed).uniform(0.0, 1.5))
    proc.kill()
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    for kind in ("last", "best"):  # complete and consistent, or these raise
        load_gpt(tmp_path, kind)
    assert load_checkpoint(tmp_path).meta["step"] >= step, f"random seed {seed}"
