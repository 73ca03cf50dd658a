"""benchmarks/speedrun.py runs end to end (tiny settings here; the real run is documented in
benchmarks/README.md), and every preset setting is a flag of gptblock train."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gptblock.cli import main
from gptblock.train.settings import SETTINGS

SPEEDRUN = Path(__file__).resolve().parents[1] / "benchmarks" / "speedrun.py"


def test_every_setting_is_a_train_flag_with_each_presets_value(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # no line breaks inside preset names
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for name in SETTINGS:
        assert "--" + name.replace("_", "-") in out, name
    assert "shakespeare-cpu muon" in out and "nanogpt-cpu adamw" in out


@pytest.mark.slow
def test_the_speedrun_script_checks_the_whole_split_and_records_it(tmp_path):
    record = tmp_path / "run.json"
    tiny = ["n_layer=1", "n_embd=16", "n_head=2", "batch_size=8", "max_iters=4", "warmup=1"]
    cmd = [
        sys.executable,
        str(SPEEDRUN),
        "--target",
        "10",
        "--check-at",
        "2",
        "--json",
        str(record),
    ]
    for item in tiny:
        cmd += ["--set", item]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    rec = json.loads(record.read_text())
    assert rec["reached"] and rec["steps"] == 2  # stopped at the first check that reached it
    assert rec["tokens"] == 2 * 8 * 32 and rec["settings"]["optimizer"] == "muon"
    assert rec["checks"][0]["step"] == 2 and rec["wall_seconds"] > 0
    # The start (process start to the first step) is the sum of its parts, within the run.
    parts = ("imports_seconds", "prepare_seconds", "step0_estimate_seconds")
    assert 0 < rec["start_seconds"] < rec["checks"][0]["seconds"]
    assert abs(sum(rec[p] for p in parts) - rec["start_seconds"]) < 1e-6
    assert (
        all(rec[p] >= 0 for p in parts) and "start (process start to the first step)" in done.stdout
    )
    assert "reached 10.0" in done.stdout


def test_the_speedrun_takes_the_modern_blocks_settings(tmp_path):
    """A tiny run (a few seconds: a small text, so the whole-validation check is quick) of a
    Llama-shaped GPT, recorded with its settings."""
    record, text = tmp_path / "run.json", tmp_path / "small.txt"
    text.write_text("the king shall not be mine, good lord; what say you?\n" * 40)
    tiny = ["n_layer=1", "n_embd=16", "n_head=2", "batch_size=4", "max_iters=2", "warmup=1"]
    modern = ["norm=rmsnorm", "position=rope", "rope_pairing=adjacent", "rope_theta=500.0",
              "mlp=swiglu", "d_ff=40", "n_kv_head=1", "qk_norm=True", "parallel_residual=True",
              "bias=False", "tie_embeddings=False"]  # fmt: skip
    cmd = [sys.executable, str(SPEEDRUN), "--target", "10", "--json", str(record), "--data"]
    cmd.append(str(text))
    for item in tiny + modern:
        cmd += ["--set", item]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    settings = json.loads(record.read_text())["settings"]
    for item in modern:
        name, _, value = item.partition("=")
        assert repr(settings[name]) in (value, repr(value)), (name, settings[name])
