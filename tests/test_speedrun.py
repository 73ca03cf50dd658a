"""benchmarks/speedrun.py runs end to end (tiny settings here; the real run is documented in
benchmarks/README.md), and every preset setting is a flag of gptblock train."""

import itertools
import json
import subprocess
import sys
import time
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
    # A small text: its whole validation split is a few windows (the corpus's is thousands).
    record, text = tmp_path / "run.json", tmp_path / "small.txt"
    text.write_text("the king shall not be mine, good lord; what say you?\n" * 40)
    tiny = ["n_layer=1", "n_embd=16", "n_head=2", "batch_size=8", "max_iters=4", "warmup=1"]
    cmd = [sys.executable, str(SPEEDRUN), "--target", "10", "--check-at", "2", "--json"]
    cmd += [str(record), "--data", str(text)]
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


def test_the_speedrun_takes_the_modern_blocks_settings(tmp_path, monkeypatch):
    """A tiny run (a small text, so the whole-validation check is quick) of a Llama-shaped GPT,
    recorded with its settings; in process (the script's process is the test above's)."""
    record, text = tmp_path / "run.json", tmp_path / "small.txt"
    text.write_text("the king shall not be mine, good lord; what say you?\n" * 40)
    tiny = ["n_layer=1", "n_embd=16", "n_head=2", "batch_size=4", "max_iters=2", "warmup=1"]
    modern = ["norm=rmsnorm", "position=rope", "rope_pairing=adjacent", "rope_theta=500.0",
              "mlp=swiglu", "d_ff=40", "n_kv_head=1", "qk_norm=True", "parallel_residual=True",
              "bias=False", "tie_embeddings=False"]  # fmt: skip
    argv = ["--target", "10", "--json", str(record), "--data", str(text)]
    argv += [a for item in tiny + modern for a in ("--set", item)]
    load_speedrun(monkeypatch, *argv).main()
    settings = json.loads(record.read_text())["settings"]
    for item in modern:
        name, _, value = item.partition("=")
        assert repr(settings[name]) in (value, repr(value)), (name, settings[name])


# Track 2: speedrun.py --budget. The planner is checked on a simulated clock (no test times
# anything); the script's refusals and one tiny run end to end.
sys.path.insert(0, str(SPEEDRUN.parent))
from speedrun_budget import BudgetPlan  # noqa: E402

from gptblock.train.config import TrainConfig, lr_at  # noqa: E402


def simulate(step_seconds, deadline=100.0, start=1.0):
    """A run on a fake clock: each step takes ``step_seconds(step)``; after each, the plan sets
    max_iters as speedrun.py does. Returns (steps done, end time, each step's lr, the config)."""
    cfg = TrainConfig(max_iters=10**7, lr=1.0, min_lr_ratio=0.0, warmup=10, schedule="wsd",
                      decay_fraction=0.5)  # fmt: skip
    plan, now, step, lrs = BudgetPlan(deadline, window=50, skip=5), start, 0, []
    while True:
        lrs.append(lr_at(step, cfg))
        now += step_seconds(step)
        step += 1
        total = plan.after_step(step, now)
        if total is not None and total <= step:
            return step, now, lrs, cfg
        if total is not None:
            cfg = TrainConfig(**{**cfg.__dict__, "max_iters": total})


@pytest.mark.parametrize("change", [1.0, 1.2, 0.8])  # steady; 20% slower or faster mid-run
def test_the_budget_plan_ends_the_decay_at_the_deadline_when_the_clock_drifts(change):
    steps, end, lrs, cfg = simulate(lambda s: 0.1 if s < 400 else 0.1 * change)
    assert end <= 100.0  # the last step ended in time...
    assert end > 100.0 - 0.1 * change * 2  # ...and the budget was used: at most a step left
    expected = 400 + (99.0 - 40.0) / (0.1 * change)  # steps at 0.1 s to 40 s, then the rest
    assert abs(steps - expected) <= 2
    assert cfg.max_iters == steps  # the schedule's end is the last step...
    assert lrs[-1] <= 2 / (0.5 * (steps - 10))  # ...and its decay reached it, not cut short
    decay = lrs[steps // 2 + 10 :]
    assert max(decay) < 1.0 and all(b <= a + 0.01 for a, b in itertools.pairwise(decay))
    assert min(lrs[10 : steps // 2 - 10]) == 1.0  # the stable phase is whole


def test_the_budget_plan_waits_for_timed_steps_and_stops_at_the_deadline():
    plan = BudgetPlan(10.0, window=3, skip=2)
    assert plan.after_step(1, 1.0) is None and plan.after_step(2, 2.0) is None  # one timed
    assert plan.after_step(3, 3.0) == 10  # 1 s a step: 7 more fit
    assert plan.after_step(4, 9.5) == 4  # slow now: no step fits before 10 s


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--budget", "nan"], "--budget must be a finite number of seconds"),
        (["--budget", "-5"], "got -5.0"),
        (["--budget", "0.01"], "above the"),  # less than the start already took
        (["--budget", "60", "--baseline"], "does not take --baseline"),
        (["--budget", "60", "--check-at", "5"], "does not take --check-at"),
    ],
)
def test_a_bad_budget_is_one_line_and_exit_code_2(flags, says, monkeypatch, capsys):
    # In process: the refusal comes before anything is built, and main() prints it as the
    # script does (the script's own process start and exit are the tests above).
    with pytest.raises(SystemExit) as exit_:
        load_speedrun(monkeypatch, *flags).main()
    out, err = capsys.readouterr()
    assert exit_.value.code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and says in err, err


def test_a_budget_run_plans_its_steps_and_records_them(tmp_path, monkeypatch, capsys):
    # In process, the budget counted from the call (the process's start, read from /proc, is the
    # subprocess test's): 4 s is hundreds of this model's steps.
    record, text = tmp_path / "run.json", tmp_path / "small.txt"
    text.write_text("the king shall not be mine, good lord; what say you?\n" * 40)
    tiny = ["n_layer=1", "n_embd=16", "n_head=2", "batch_size=4", "block_size=16", "warmup=2"]
    argv = ["--budget", "4", "--json", str(record), "--data", str(text)]
    argv += ["--preset", "shakespeare-cpu", *(a for item in tiny for a in ("--set", item))]
    load_speedrun(monkeypatch, *argv, started=time.time()).main()
    out = capsys.readouterr().out
    rec = json.loads(record.read_text())
    assert rec["kind"] == "track2" and rec["budget_seconds"] == 4.0
    assert rec["steps"] > 5 and rec["settings"]["max_iters"] == rec["steps"]
    assert rec["plans"][-1]["planned_steps"] == rec["steps"] and rec["check_estimate_seconds"] > 0
    assert 0 < rec["val_loss"] < 5 and "track 2 (shakespeare-cpu, seed 1337)" in out


def load_speedrun(monkeypatch, *argv, started=None):
    """benchmarks/speedrun.py as a module of this process, its main() to run with ``argv``;
    ``started`` stands for the process's start (a budget counts from it; this one started long
    ago). The script's own process (its start read from /proc, its exit) is the subprocess test's.
    """
    import importlib.util

    spec = importlib.util.spec_from_file_location("speedrun_in_process", SPEEDRUN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if started is not None:
        monkeypatch.setattr(module, "process_start", lambda: started)
    monkeypatch.setattr(sys, "argv", ["speedrun.py", *argv])
    return module


def test_a_speedrun_stopped_before_its_first_check_says_so(monkeypatch, capsys):
    # A signal (SIGTERM, Ctrl-C) ends the trainer's fit early: here a callback asks it to stop
    # after one step, as the signal handler does. One line, exit 1, no traceback.
    tiny = ["n_layer=1", "n_embd=16", "n_head=2", "batch_size=4", "max_iters=50", "warmup=1"]
    module = load_speedrun(monkeypatch, *(a for item in tiny for a in ("--set", item)))
    real = module.prepare_run

    def prepare_and_stop(*args, **kwargs):
        run = real(*args, **kwargs)
        run.trainer.add_callback("on_step_end", lambda trainer: trainer.request_stop())
        return run

    monkeypatch.setattr(module, "prepare_run", prepare_and_stop)
    with pytest.raises(SystemExit) as exit_:
        module.main()
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "speedrun.py: stopped at step 1, before any check: no result"
    ]


def _speedrun_module(name):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, SPEEDRUN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--budget", "1e9", "--set", "max_iters=5"], "--set max_iters=5 cannot act: --budget"),
        (["--budget", "1e9", "--set", "eval_iters=5"], "--set eval_iters=5 cannot act"),
        (["--set", "eval_interval=3"], "--set eval_interval=3 cannot act"),
        (["--set", "seed=5"], "--set seed=5 cannot act: --seed decides seed"),
        (["--preset", ""], "preset must be one of"),
        (["--set", "bias=None"], "--set bias=None: None means 'keep the preset's value'"),
        (["--set", "activation=relu", "--set", "mlp=swiglu"], "activation='relu' acts only"),
    ],
)
def test_a_setting_the_speedrun_would_ignore_is_one_line_and_exit_code_2(
    monkeypatch, capsys, flags, says
):
    module = _speedrun_module("speedrun_owned")
    monkeypatch.setattr(module, "prepare_run", None)  # refused before anything is built
    monkeypatch.setattr(module, "set_threads", lambda n: None)
    monkeypatch.setattr(sys, "argv", ["speedrun.py", *flags])
    with pytest.raises(SystemExit) as exit_:
        module.main()
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1 and says in err, err
