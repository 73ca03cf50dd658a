"""Misuse, class 1: a run directory belongs to one run (issue 12).

Real processes race for one ``--out``; runs are pointed at directories holding other files, at
files, devices and places where no directory can be made. Each case asserts that the refused
run prints one line naming the directory with exit code 2 (no traceback), that nothing of the
first run or of the user's files is lost (their bytes are compared), and, where it matters,
that the refusal comes before the model is built. Subprocesses run under timeouts, so a hang
fails the test instead of stalling it.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from gptblock import GPT, GPTConfig, TrainConfig, Trainer, load_gpt, train_gpt
from gptblock.cli import main
from gptblock.data.batches import TokenSplits
from gptblock.data.text import default_corpus
from gptblock.runs.checkpoint import load_checkpoint, save_checkpoint
from gptblock.runs.owned import RECORD_FILE
from gptblock.runs.rundir import LOCK_FILE, RunInUseError, check_run_dir, locked_run_dir
from gptblock.train import run as gpt_run

SRC = Path(__file__).resolve().parents[1] / "src"
TEXT = default_corpus()[:4000]
SMALL = [
    "--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16",
    "--batch-size", "4", "--eval-iters", "1", "--warmup", "2", "--device", "cpu",
    "--no-progress",
]  # fmt: skip
PY_SMALL = dict(
    n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=4, max_iters=4,
    eval_interval=2, eval_iters=1, warmup=1, progress=False,
)  # fmt: skip
TIMEOUT = 240


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "input.txt"
    path.write_text(TEXT, encoding="utf-8")
    return str(path)


def env():
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(SRC), e.get("PYTHONPATH", "")])
    e["OMP_NUM_THREADS"] = "1"
    return e


def train_cmd(out, text_file, *extra):
    return [sys.executable, "-m", "gptblock", "train", "--data", text_file, "--out", str(out)]


def start(out, text_file, *extra):
    cmd = [*train_cmd(out, text_file), *SMALL, *extra]
    return subprocess.Popen(
        cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def one_line_error(err, *needles):
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gptblock train: error: "), err[-2000:]
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def snapshot(directory):
    return {p.name: p.read_bytes() for p in sorted(Path(directory).iterdir()) if p.is_file()}


def wait_for(path, proc, seconds=TIMEOUT):
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert time.monotonic() < deadline, f"no {path} after {seconds} s"
        time.sleep(0.05)


# --- concurrent runs ---------------------------------------------------------------------------


@pytest.mark.slow
def test_two_runs_started_at_the_same_moment_one_trains_and_the_other_is_refused(
    tmp_path, text_file
):
    out = tmp_path / "out"
    run = ["--max-iters", "60", "--eval-interval", "20"]  # the race is at the start
    procs = [start(out, text_file, *run) for _ in range(2)]
    results = [(p.wait(timeout=TIMEOUT), *p.communicate(timeout=TIMEOUT)) for p in procs]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 2], [(c, e[-1500:]) for c, _, e in results]
    (winner_out,) = [o for c, o, _ in results if c == 0]
    (loser_err,) = [e for c, _, e in results if c == 2]
    line = one_line_error(loser_err, str(out))
    # Either it met the lock, or the run had already finished and left its checkpoint.
    assert "is in use by another gptblock run" in line or "already holds a training run" in line
    assert "saved" in winner_out
    last = load_checkpoint(out)
    assert last.meta["step"] == 60 and len(last.meta["history"]["loss"]) == 60
    load_gpt(out, "best")  # complete and consistent, or this raises


@pytest.mark.slow
def test_a_run_started_while_another_trains_is_refused_and_the_first_loses_nothing(
    tmp_path, text_file, capsys
):
    out = tmp_path / "out"
    first = start(out, text_file, "--max-iters", "1000000", "--eval-interval", "5")
    try:
        wait_for(out / "last.json", first)
        # A second process; then, in this process (the lock is the other process's either way),
        # the same with --resume and with --allow-other-data.
        second = start(out, text_file, "--max-iters", "10", "--eval-interval", "5")
        _, err = second.communicate(timeout=TIMEOUT)
        assert second.returncode == 2
        one_line_error(err, str(out), "is in use by another gptblock run", LOCK_FILE)
        for extra in (["--resume"], ["--resume", "--allow-other-data"]):
            argv = [*train_cmd(out, text_file)[3:], *SMALL, "--max-iters", "10", *extra]
            assert main(argv) == 2
            one_line_error(capsys.readouterr().err, str(out), "is in use by another", LOCK_FILE)
        step_when_refused = load_checkpoint(out).meta["step"]
        # The first run keeps checkpointing (its temporaries were not deleted under it).
        deadline = time.monotonic() + TIMEOUT
        while load_checkpoint(out).meta["step"] <= step_when_refused + 10:
            assert first.poll() is None, first.communicate()[1][-2000:]
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        first.send_signal(signal.SIGINT)
        _, err = first.communicate(timeout=TIMEOUT)
    assert first.returncode == 130, err[-2000:]
    step = load_checkpoint(out).meta["step"]
    assert f"interrupted at step {step}" in err
    for kind in ("last", "best"):
        load_gpt(out, kind)


@pytest.mark.slow
def test_a_killed_run_leaves_no_stale_lock(tmp_path, text_file):
    out = tmp_path / "out"
    proc = start(out, text_file, "--max-iters", "1000000", "--eval-interval", "5")
    wait_for(out / "last.json", proc)
    with pytest.raises(RunInUseError), locked_run_dir(out, resume=True):  # held while it runs
        pass
    proc.kill()
    proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == -signal.SIGKILL
    with locked_run_dir(out, resume=True):  # the operating system released it
        assert (out / LOCK_FILE).exists()


def test_a_trainer_in_the_same_process_is_refused_while_the_directory_is_locked(tmp_path):
    data = TokenSplits(torch.arange(200) % 5, torch.arange(50) % 5)
    cfg = TrainConfig(block_size=4, batch_size=2, max_iters=2, eval_interval=1, eval_iters=1)
    model = torch.nn.Sequential(torch.nn.Embedding(5, 5))

    class Bigram(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = model

        def forward(self, idx, targets):
            logits = self.net(idx)
            return logits, torch.nn.functional.cross_entropy(
                logits.flatten(0, 1), targets.flatten()
            )

    with locked_run_dir(tmp_path, resume=False):
        with pytest.raises(RunInUseError, match=f"{tmp_path} is in use"):
            Trainer(Bigram(), data, cfg, out_dir=tmp_path, progress=False).fit()
        assert sorted(os.listdir(tmp_path)) == [LOCK_FILE]  # nothing written
    Trainer(Bigram(), data, cfg, out_dir=tmp_path, progress=False).fit()  # released: it trains


# --- files gptblock did not write ---------------------------------------------------------------

FOREIGN = {
    "a note": {"notes.txt": b"mine"},
    "checkpoint look-alikes": {
        "best.json": b'{"mine": true}',
        "loss.png": b"my picture",
        "last-00000010-abcdef12.safetensors": b"my tensors",
        "best-00000003-12345678.safetensors": b"more of mine",
    },
    "a hidden file": {".keep": b""},
    "a subdirectory": {"sub/data.txt": b"x"},
    "a gptblock directory with another file": {LOCK_FILE: b"", "notes.txt": b"mine"},
    "a best checkpoint without its last": {LOCK_FILE: b"", "best.json": b"{}"},
}


def populate(directory, files):
    for name, data in files.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


@pytest.mark.parametrize("files", FOREIGN.values(), ids=FOREIGN.keys())
def test_a_directory_with_files_gptblock_did_not_write_is_refused_and_kept(
    tmp_path, text_file, capsys, files
):
    out = tmp_path / "out"
    populate(out, files)
    before = snapshot(out)
    assert main(["train", "--data", text_file, "--out", str(out), *SMALL, "--max-iters", "2"]) == 2
    one_line_error(capsys.readouterr().err, str(out), "is not empty and holds no gptblock run")
    assert snapshot(out) == before
    with pytest.raises(FileExistsError, match="is not empty"):
        train_gpt(text=TEXT, out_dir=out, **PY_SMALL)
    assert snapshot(out) == before


def test_the_trainer_itself_refuses_a_foreign_directory(tmp_path):
    populate(tmp_path, {"last-00000001-aaaaaaaa.safetensors": b"mine"})
    before = snapshot(tmp_path)
    data = TokenSplits(torch.arange(200) % 5, torch.arange(50) % 5)
    cfg = TrainConfig(block_size=4, batch_size=2, max_iters=2, eval_interval=1, eval_iters=1)
    model = GPT(GPTConfig(5, 4, 1, 1, 4))
    with pytest.raises(FileExistsError, match="is not empty and holds no gptblock run"):
        Trainer(model, data, cfg, out_dir=tmp_path, progress=False).fit()
    assert snapshot(tmp_path) == before


def test_what_a_run_killed_before_its_first_checkpoint_leaves_is_its_own(tmp_path, text_file):
    out = tmp_path / "out"
    populate(
        out,
        {
            LOCK_FILE: b"",
            RECORD_FILE: b"last-00000000-0badc0de.safetensors\nlast.json\n"
            b"best-00000000-0badc0de.safetensors\nloss.png\n",
            "last-00000000-0badc0de.safetensors": b"half",
            ".last.json.1234abcd.tmp": b"{",
            ".best-00000000-0badc0de.safetensors.abcd1234.tmp": b"",
            "loss.png": b"half a picture",
        },
    )
    assert main(["train", "--data", text_file, "--out", str(out), *SMALL, "--max-iters", "2"]) == 0
    names = sorted(os.listdir(out))
    assert "last-00000000-0badc0de.safetensors" not in names  # its own leftovers, cleared
    assert not [n for n in names if n.endswith(".tmp")]
    assert load_checkpoint(out).meta["step"] == 2


def test_a_save_deletes_only_the_files_it_wrote(tmp_path):
    mine = {"last-model.safetensors": b"a", "last-1-2.safetensors": b"b", ".last.json.x.tmp": b"c"}
    populate(tmp_path, mine)
    save_checkpoint(tmp_path, "last", {"w": torch.ones(2)}, {"step": 1})
    save_checkpoint(tmp_path, "last", {"w": torch.ones(2)}, {"step": 2})
    assert {k: v for k, v in snapshot(tmp_path).items() if k in mine} == mine


# --- --out that cannot be a run directory -------------------------------------------------------


def a_file(tmp_path):
    path = tmp_path / "f.txt"
    path.write_text("x")
    return path


def fifo(tmp_path):
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


def dangling(tmp_path):
    path = tmp_path / "link"
    path.symlink_to(tmp_path / "nowhere")
    return path


def under_a_file(tmp_path):
    return a_file(tmp_path) / "run"


NO_RUN = "holds no run to resume"
BAD_OUT = {  # how to make it; the message of a fresh run; of --resume
    "a file": (a_file, "is a file, not a directory", "is a file, not a directory"),
    "/dev/null": (lambda d: Path("/dev/null"), "is a device, not a directory", "is a device"),
    "a FIFO": (fifo, "is a pipe (FIFO), not a directory", "is a pipe (FIFO)"),
    "under /proc": (lambda d: Path("/proc/gptblock-run"), "cannot create a directory", NO_RUN),
    "/proc itself": (lambda d: Path("/proc"), "is not empty and holds no gptblock run", NO_RUN),
    "a dangling link": (dangling, "is a symbolic link to nothing", "symbolic link to nothing"),
    "under a file": (under_a_file, "cannot create a directory there (Not a directory)", NO_RUN),
}


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs Linux's /proc")
@pytest.mark.parametrize("make, fresh, resumed", BAD_OUT.values(), ids=BAD_OUT.keys())
def test_an_out_that_is_no_directory_is_one_line_before_the_model_is_built(
    tmp_path, text_file, capsys, monkeypatch, make, fresh, resumed
):
    out = make(tmp_path)

    def never(*args, **kwargs):
        raise AssertionError("the model was built")

    monkeypatch.setattr(gpt_run, "GPT", never)
    for extra, message in (([], fresh), (["--resume"], resumed)):
        code = main(["train", "--data", text_file, "--out", str(out), *SMALL, *extra])
        assert code == 2
        one_line_error(capsys.readouterr().err, str(out), message)
    assert not Path("/proc/gptblock-run").exists()


def test_resume_where_there_is_no_run_is_one_line(tmp_path, text_file, capsys):
    code = main(["train", "--data", text_file, "--out", str(tmp_path / "new"), *SMALL, "--resume"])
    assert code == 2
    one_line_error(capsys.readouterr().err, "holds no run to resume", "leave out --resume")
    assert not (tmp_path / "new").exists()  # nothing made for a run that cannot start


def test_check_run_dir_accepts_what_it_should(tmp_path):
    check_run_dir(tmp_path / "new" / "deeper", resume=False)  # a path to create
    check_run_dir(tmp_path, resume=False)  # empty
    (tmp_path / LOCK_FILE).write_bytes(b"")
    check_run_dir(tmp_path, resume=False)  # a gptblock directory with nothing in it


# --- Trainer.save outside fit follows the same rules ---------------------------------------------


def small_trainer(out_dir):
    data = TokenSplits(torch.arange(200) % 5, torch.arange(50) % 5)
    cfg = TrainConfig(block_size=4, batch_size=2, max_iters=2, eval_interval=1, eval_iters=1)
    model = GPT(GPTConfig(5, 4, 1, 1, 4))
    return Trainer(model, data, cfg, out_dir=out_dir, progress=False)


def test_save_outside_fit_never_writes_over_another_run(tmp_path):
    first = small_trainer(tmp_path)
    first.fit()
    before = snapshot(tmp_path)
    with pytest.raises(FileExistsError, match="already holds a training run"):
        small_trainer(tmp_path).save("last")  # a trainer that never ran there
    assert snapshot(tmp_path) == before
    first.save("last")  # its own run: allowed
    assert load_checkpoint(tmp_path).meta["step"] == 2
    with locked_run_dir(tmp_path, resume=True), pytest.raises(RunInUseError):
        first.save("last")  # not while someone else holds the directory


def test_save_outside_fit_into_a_foreign_directory_is_refused(tmp_path):
    populate(tmp_path, {"notes.txt": b"mine"})
    with pytest.raises(FileExistsError, match="is not empty"):
        small_trainer(tmp_path).save("best")
    assert sorted(os.listdir(tmp_path)) == ["notes.txt"]
