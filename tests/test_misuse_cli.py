"""Misuse, class 3: the command line never shows a traceback for a user's mistake (issue 12).

Every case runs a command with one bad flag or file and asserts exit code 2 and exactly one
line on stderr, ``gptblock COMMAND: error: ...``, naming the flag's setting and its value;
a traceback there would fail the assertion. Cases that could hang (a FIFO: a writer lets it go
after a timeout) or exhaust the machine (an absurd size, ``/dev/zero``: under a memory limit, in
this process) fail the test on a regression instead of stalling or killing the machine. Cases that are not
mistakes get what they asked for: a temperature that underflows samples greedily (the same
text as temperature 0), a pipe with a writer is read. Ctrl-C stops ``sample`` cleanly, with
its text shown as it came, and a genuine bug still shows its traceback.
"""

import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from gptblock.cli import main
from gptblock.data import text as text_module
from gptblock.data.text import default_corpus
from gptblock.model import footprint
from gptblock.train import run as gpt_run

SRC = Path(__file__).resolve().parents[1] / "src"
SMALL = [
    "--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16",
    "--batch-size", "4", "--max-iters", "4", "--eval-interval", "2", "--eval-iters", "1",
    "--warmup", "1", "--device", "cpu", "--no-progress",
]  # fmt: skip
TIMEOUT = 120


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "input.txt"
    path.write_text(default_corpus()[:4000], encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, text_file):
    out = tmp_path_factory.mktemp("run")
    assert main(["train", "--data", text_file, "--out", str(out), *SMALL]) == 0
    return str(out)


def one_line(err, command, *needles):
    lines = err.splitlines()
    assert len(lines) == 1, err[-3000:]
    assert lines[0].startswith(f"gptblock {command}: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def env():
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(SRC), e.get("PYTHONPATH", "")])
    e["OMP_NUM_THREADS"] = "1"
    return e


def gptblock(*args):
    """``gptblock ARGS`` under a memory limit (tests/test_misuse_foreign.py's runner: in this
    process, its address-space limit lowered for the call)."""
    from test_misuse_foreign import in_a_subprocess

    return in_a_subprocess(*args)


# --- train ----------------------------------------------------------------------------------

TRAIN = {  # flags, then what the one line must name
    "device meta": (["--device", "meta"], ["device 'meta'"]),
    "device bogus": (["--device", "gpu0"], ["unknown device 'gpu0'"]),
    "device cuda:99": (["--device", "cuda:99"], ["device 'cuda:99'"]),
    "seed 2**64": (["--seed", str(2**64)], ["seed", str(2**64)]),
    "seed 2**63": (["--seed", str(2**63)], ["seed", str(2**63)]),
    "seed -1": (["--seed", "-1"], ["seed", "-1"]),
    "batch-size 0": (["--batch-size", "0"], ["batch_size", "0"]),
    "n-embd 0": (["--n-embd", "0"], ["n_embd", "0"]),
    "n-head 3": (["--n-head", "3"], ["n_embd=16 is not divisible by n_head=3"]),
    "block-size 0": (["--block-size", "0"], ["block_size", "0"]),
    "block-size 10**6": (["--block-size", "1000000"], ["too short for block_size=1000000"]),
    "dropout 1": (["--dropout", "1"], ["dropout", "1"]),
    "dropout nan": (["--dropout", "nan"], ["dropout", "nan"]),
    "lr 0": (["--lr", "0"], ["lr", "0"]),
    "lr inf": (["--lr", "inf"], ["lr", "inf"]),
    "max-iters 0": (["--max-iters", "0"], ["max_iters", "0"]),
    "eval-interval 0": (["--eval-interval", "0"], ["eval_interval", "0"]),
    "eval-iters -1": (["--eval-iters", "-1"], ["eval_iters", "-1"]),
    "warmup -1": (["--warmup", "-1"], ["warmup", "-1"]),
    "data /dev/null": (["--data", "/dev/null"], ["/dev/null is empty"]),
    # a setting that cannot act beside another's value: both named (issue 31, item 2)
    "activation with swiglu": (
        ["--mlp", "swiglu", "--activation", "relu"],
        ["activation='relu' acts only with mlp='dense'", "mlp is 'swiglu'"],
    ),
    "rotary-dim, learned": (["--rotary-dim", "4"], ["rotary_dim=4", "position is 'learned'"]),
    "muon-lr with adamw": (
        ["--optimizer", "adamw", "--muon-lr", "0.1"],
        ["muon_lr=0.1", "optimizer is 'adamw'"],
    ),
    "decay-fraction, cosine": (
        ["--schedule", "cosine", "--decay-fraction", "0.3"],
        ["decay_fraction=0.3", "schedule is 'cosine'"],
    ),
}


@pytest.mark.parametrize("flags, names", TRAIN.values(), ids=TRAIN.keys())
def test_a_bad_train_flag_is_one_line_and_exit_2(tmp_path, text_file, capsys, flags, names):
    if "cuda" in flags[-1] and torch.cuda.is_available():
        pytest.skip("a GPU is here: cuda:99 may exist")
    args = ["train", "--data", text_file, "--out", str(tmp_path / "o"), *SMALL, *flags]
    assert main(args) == 2
    one_line(capsys.readouterr().err, "train", *names)


def test_data_from_dev_zero_is_capped_and_said(tmp_path):
    r = gptblock("train", "--data", "/dev/zero", "--out", str(tmp_path / "o"), *SMALL)
    assert r.returncode == 2, r.stderr[-3000:]
    one_line(r.stderr, "train", "/dev/zero holds more than 268,435,456 bytes")


def test_data_from_a_fifo_nobody_writes_does_not_hang(tmp_path, capsys, monkeypatch):
    # In process, the wait for a writer cut from 5 s to 0.2 s: the same code gives up sooner. A
    # read that blocked would be let go by a writer after TIMEOUT, and fail the test.
    monkeypatch.setattr(text_module, "PIPE_WAIT", 0.2)
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    late = threading.Timer(TIMEOUT, lambda: open(pipe, "wb").close())
    late.start()
    started = time.monotonic()
    try:
        code = main(["train", "--data", str(pipe), "--out", str(tmp_path / "o"), *SMALL])
    finally:
        late.cancel()
    assert code == 2 and time.monotonic() - started < TIMEOUT
    one_line(capsys.readouterr().err, "train", f"{pipe} is a pipe that nobody wrote to (in 0.2 s)")


def test_data_from_a_pipe_with_a_writer_is_read(tmp_path, text_file, capsys):
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    text = Path(text_file).read_bytes()

    def write():
        with open(pipe, "wb") as f:  # blocks until the reader opens its end
            f.write(text)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    assert main(["train", "--data", str(pipe), "--out", str(tmp_path / "o"), *SMALL]) == 0
    writer.join(timeout=TIMEOUT)
    assert f"{len(text.decode()):,} characters" in capsys.readouterr().out


@pytest.mark.parametrize(
    "flags",
    [
        ["--batch-size", "100000000"],
        ["--n-embd", "1000000", "--n-head", "1"],
        ["--n-layer", "100000", "--n-embd", "1024", "--n-head", "8"],
        ["--block-size", "16", "--batch-size", "5000000"],
    ],
    ids=["batch-size", "n-embd", "n-layer", "tokens-per-step"],
)
def test_a_run_too_big_for_the_machine_is_refused_with_the_number(tmp_path, text_file, flags):
    r = gptblock("train", "--data", text_file, "--out", str(tmp_path / "o"), *SMALL, *flags)
    assert r.returncode == 2, r.stderr[-3000:]
    one_line(r.stderr, "train", "a run of this size needs about", "GiB", "available")
    assert not (tmp_path / "o").exists()  # refused before anything was made


def test_the_memory_refusal_compares_with_what_is_available(
    tmp_path, text_file, capsys, monkeypatch
):
    monkeypatch.setattr(footprint, "available_memory", lambda device: 2**15)  # 32 KiB
    assert main(["train", "--data", text_file, "--out", str(tmp_path / "o"), *SMALL]) == 2
    one_line(capsys.readouterr().err, "train", "cpu has 32.0 KiB available", "batch_size=4")
    monkeypatch.setattr(footprint, "available_memory", lambda device: None)  # unknown: go on
    assert main(["train", "--data", text_file, "--out", str(tmp_path / "o"), *SMALL]) == 0


def test_a_bug_in_train_keeps_its_traceback(tmp_path, text_file, monkeypatch):
    def bug(self):
        raise RuntimeError("an internal invariant broke")

    monkeypatch.setattr(gpt_run.GPTRun, "fit", bug)
    with pytest.raises(RuntimeError, match="internal invariant"):
        main(["train", "--data", text_file, "--out", str(tmp_path / "o"), *SMALL])


# --- sample ---------------------------------------------------------------------------------

SAMPLE = {
    "temperature -1": (["--temperature", "-1"], ["temperature", "-1.0"]),
    "temperature nan": (["--temperature", "nan"], ["temperature", "nan"]),
    "temperature inf": (["--temperature", "inf"], ["temperature", "inf"]),
    "top-k 0": (["--top-k", "0"], ["top_k", "0"]),
    "top-k -5": (["--top-k", "-5"], ["top_k", "-5"]),
    "max-new-tokens -1": (["--max-new-tokens", "-1"], ["max_new_tokens", "-1"]),
    "seed -1": (["--seed", "-1"], ["seed", "-1"]),
    "seed 2**64": (["--seed", str(2**64)], ["seed", str(2**64)]),
    "device meta": (["--device", "meta"], ["device 'meta'"]),
    "empty prompt": (["--prompt", ""], ["the prompt must not be empty"]),
    "unknown prompt": (["--prompt", "€"], ["outside the model's vocabulary: '€'"]),
}


@pytest.mark.parametrize("flags, names", SAMPLE.values(), ids=SAMPLE.keys())
def test_a_bad_sample_flag_is_one_line_and_exit_2(trained, capsys, flags, names):
    assert main(["sample", "--out", trained, "--max-new-tokens", "5", *flags]) == 2
    captured = capsys.readouterr()
    one_line(captured.err, "sample", *names)
    assert captured.out == ""  # refused before any text


def a_file(directory):
    path = directory / "f.txt"
    path.write_text("x")
    return path


@pytest.mark.parametrize(
    "out, names",
    [
        (lambda d: d / "missing", ["no best checkpoint in"]),
        (lambda d: Path("/dev/null"), ["no best checkpoint in /dev/null"]),
        (a_file, ["no best checkpoint in"]),
    ],
    ids=["missing", "dev-null", "a-file"],
)
def test_sample_from_no_run_is_one_line(tmp_path, capsys, out, names):
    assert main(["sample", "--out", str(out(tmp_path))]) == 2
    one_line(capsys.readouterr().err, "sample", *names)


def test_a_temperature_that_underflows_samples_greedily(trained, capsys):
    args = ["sample", "--out", trained, "--max-new-tokens", "30", "--prompt", "The "]
    assert main([*args, "--temperature", "0"]) == 0
    greedy = capsys.readouterr().out
    for tiny in ("1e-45", "5e-324", "1e-300"):
        assert main([*args, "--temperature", tiny]) == 0
        captured = capsys.readouterr()
        assert captured.out == greedy and captured.err == "", tiny


def start_sample(run):
    # So many tokens that it runs until stopped: at ~1000 per second, for days.
    cmd = [
        sys.executable,
        "-m",
        "gptblock",
        "sample",
        "--out",
        run,
        "--max-new-tokens",
        "100000000",
    ]
    return subprocess.Popen(cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def read_at_least(proc, n, seconds=TIMEOUT):
    got, deadline = b"", time.monotonic() + seconds
    while len(got) < n:
        assert time.monotonic() < deadline, f"only {got!r} after {seconds} s"
        assert proc.poll() is None, (got, proc.stderr.read())
        ready, _, _ = select.select([proc.stdout], [], [], 1.0)
        if ready:
            got += os.read(proc.stdout.fileno(), 4096)
    return got


@pytest.mark.slow
def test_sample_streams_its_text_and_ctrl_c_stops_it_cleanly(trained):
    proc = start_sample(trained)
    try:
        first = read_at_least(proc, 200)  # text arrives while the process is still generating
    finally:
        proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 130, err.decode()[-3000:]
    assert err.decode() == "gptblock sample: interrupted\n"
    assert len(first) >= 200 and (first + out).endswith(b"\n")


@pytest.mark.slow
def test_sample_into_a_closed_pipe_ends_quietly(trained):
    proc = start_sample(trained)
    read_at_least(proc, 50)
    proc.stdout.close()  # as `gptblock sample | head -c 50` does
    _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 141 and err == b"", err.decode()[-3000:]


# --- bench, example, exercises ----------------------------------------------------------------


@pytest.mark.parametrize(
    "flags",
    [
        ["--batch", "100000000"],
        ["--d-model", "1000000", "--heads", "1"],
        ["--peak-sizes", "1000000"],
        ["--seq-len", "1000000", "--sweep"],
    ],
    ids=["batch", "d-model", "peak-sizes", "seq-len"],
)
def test_a_benchmark_too_big_for_the_machine_is_refused_with_the_number(flags):
    r = gptblock("bench", "--no-progress", *flags)
    assert r.returncode == 2, r.stderr[-3000:]
    one_line(r.stderr, "bench", "the benchmark needs about", "GiB", "available")


OTHERS = {
    "bench threads 0": (["bench", "--threads", "0"], ["threads must be a positive int, got 0"]),
    "bench threads -2": (["bench", "--threads", "-2"], ["threads", "-2"]),
    "bench threads 100000": (["bench", "--threads", "100000"], ["threads must be at most"]),
    "bench d-model 0": (["bench", "--d-model", "0"], ["d_model", "0"]),
    "bench heads 5": (["bench", "--heads", "5"], ["d_model=384 is not divisible by n_heads=5"]),
    "bench repeats 0": (["bench", "--repeats", "0"], ["repeats", "0"]),
    "bench warmup -1": (["bench", "--warmup", "-1"], ["warmup", "-1"]),
    "bench sweep 0": (["bench", "--sweep", "0"], ["sweep", "0"]),
    "bench device meta": (["bench", "--device", "meta"], ["'meta'"]),
    "bench json nowhere": (
        ["bench", "--json", "/nonexistent/b.json"],
        ["cannot write /nonexistent/b.json"],
    ),
    "bench json a directory": (["bench", "--json", "/tmp"], ["cannot write /tmp: it is a"]),
    "example seed 2**64": (["example", "--seed", str(2**64)], ["seed", str(2**64)]),
    "example seed -1": (["example", "--seed", "-1"], ["seed", "-1"]),
    "exercises seed -1": (["exercises", "--seed", "-1"], ["seed", "-1"]),
}


@pytest.mark.parametrize("args, names", OTHERS.values(), ids=OTHERS.keys())
def test_a_bad_flag_of_the_other_commands_is_one_line_and_exit_2(capsys, args, names):
    assert main(args) == 2
    one_line(capsys.readouterr().err, args[0], *names)
