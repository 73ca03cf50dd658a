"""The trainer as real processes: two DDP ranks under torchrun, and a run killed with SIGKILL."""

import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from gptblock.checkpoint import load_checkpoint, load_model_state
from standin import Bigram

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src"
RUN = str(TESTS / "standin_run.py")


def env():
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(SRC), str(TESTS), e.get("PYTHONPATH", "")])
    e["OMP_NUM_THREADS"] = "1"
    return e


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun not installed")
def test_two_ddp_processes_follow_the_single_process_trajectory(tmp_path):
    ddp, single = tmp_path / "ddp", tmp_path / "single"
    cmd = ["torchrun", "--standalone", "--nproc_per_node=2", RUN, str(ddp), "10", "5", "8"]
    r = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run(
        [sys.executable, RUN, str(single), "10", "5", "8"],
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = load_checkpoint(ddp), load_checkpoint(single)
    assert a.meta["world_size"] == 2 and b.meta["world_size"] == 1
    assert len(a.meta["history"]["loss"]) == 10
    assert a.meta["history"]["loss"] == pytest.approx(b.meta["history"]["loss"], abs=1e-5, rel=0)
    for e1, e2 in zip(a.meta["history"]["evals"], b.meta["history"]["evals"], strict=True):
        assert e1 == pytest.approx(e2, abs=1e-5, rel=0)
    for name, t in b.tensors.items():
        if name.startswith("model."):
            torch.testing.assert_close(a.tensors[name], t, atol=1e-5, rtol=0)
    # Each rank's dropout RNG state is saved, so a DDP run can resume on each rank exactly.
    assert {"rng.cpu.0", "rng.cpu.1"} <= set(a.tensors)


@pytest.mark.slow
def test_sigkill_at_any_moment_leaves_a_loadable_checkpoint(tmp_path):
    # Checkpoints every step, so a kill lands during a save as often as not.
    seed = random.randrange(10**6)
    rng = random.Random(seed)
    for attempt in range(2):
        cmd = [sys.executable, RUN, str(tmp_path), "100000", "1", "4"] + (
            ["--resume"] if attempt else []
        )
        proc = subprocess.Popen(cmd, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while not (tmp_path / "last.json").exists() and proc.poll() is None:
            assert time.monotonic() < deadline, "no checkpoint after 120 s"
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 1.5))
        proc.kill()
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == -9, err.decode()[-2000:]
        ckpt = load_checkpoint(tmp_path)  # complete and consistent, or this raises
        load_model_state(Bigram(7, n_embd=8), ckpt)
        assert ckpt.meta["step"] >= 0, f"random seed {seed}"
