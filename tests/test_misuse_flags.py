"""Every numeric flag of every command, given absurd values: one clear line, or the right result.

The flags are read off the parser, so a numeric flag added to any command is swept too. Each
value is either refused (exit 2, one ``gptblock COMMAND: error:`` line, or argparse's own two
lines) or accepted, and the accepted ones are listed in ``ACCEPTED`` with why accepting them is
right. A command's work is stopped where it would begin (the training loop, the generation
loop, the checker's child, the exercises, the benchmark's first measurement; ``example`` runs, it is quick), after every check
of its arguments has run: what is refused is refused before any of it.
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path
from unittest import mock

import pytest

from gptblock.cli import build_parser, main

FIXTURE_RUN = Path(__file__).parent / "fixtures" / "run-v1"

INTS = ("0", "-1", str(-(10**20)), str(10**20))
FLOATS = ("0", "-1", "nan", "inf", "-inf", "1e308")

# (command, flag, value): why it is accepted.
ACCEPTED = {
    ("train", "--dropout", "0"): "no dropout (the default)",
    ("train", "--max-iters", str(10**20)): "a long run; Ctrl-C saves a resumable checkpoint",
    ("train", "--min-lr-ratio", "0"): "decay to zero",
    ("train", "--warmup", "0"): "no warmup",
    ("train", "--warmup", str(10**20)): "the whole run warms up: a schedule, if an odd one",
    ("train", "--weight-decay", "0"): "no decay",
    ("train", "--weight-decay", "1e308"): "diverges; the first non-finite loss is one line",
    ("train", "--beta2", "0"): "AdamW without a second-moment average is still AdamW",
    ("train", "--eval-interval", str(10**20)): "evaluate at the end only",
    ("train", "--eval-iters", str(10**20)): "an evaluation as long as asked; Ctrl-C stops it",
    ("train", "--seed", "0"): "a seed",
    ("train", "--rope-theta", "1e308"): "valid: every pair but the first turns by almost 0",
    ("train", "--rotary-dim", "0"): "rotary on no channels: no positions (a tested identity)",
    # TrainConfig's and GPTConfig's fields that became flags when the settings derived from them
    ("train", "--beta1", "0"): "AdamW without momentum (RMSprop's step) is still AdamW",
    ("train", "--grad-clip", "0"): "no clipping (TrainConfig's documented 0)",
    ("train", "--grad-clip", "1e308"): "a bound never reached: no clipping",
    ("train", "--log-interval", str(10**20)): "the loss is read before each evaluation only",
    (
        "train",
        "--norm-eps",
        "1e308",
    ): "a valid epsilon: each norm outputs its bias, the loss finite",
    (
        "train",
        "--muon-momentum",
        "0",
    ): "Muon without momentum: each step's gradient, orthogonalised",
    ("sample", "--max-new-tokens", "0"): "the prompt alone",
    ("sample", "--max-new-tokens", str(10**20)): "streams until Ctrl-C",
    ("sample", "--temperature", "0"): "greedy",
    ("sample", "--temperature", "1e308"): "uniform over the vocabulary",
    ("sample", "--top-k", str(10**20)): "clamped to the vocabulary (documented)",
    ("sample", "--seed", "0"): "a seed",
    ("inspect", "--top-k", str(10**20)): "clamped to the vocabulary (documented)",
    ("exercises", "--seed", "0"): "a seed",
    ("example", "--seed", "0"): "a seed",
    ("bench", "--warmup", "0"): "no warmup calls",
    ("bench", "--warmup", str(10**20)): "as many as asked; Ctrl-C stops it",
    ("bench", "--repeats", str(10**20)): "as many as asked; Ctrl-C stops it",
    ("grade", "--jobs", str(10**20)): "no more at once than there are submissions",
}


class Reached(Exception):
    """The command got past its checks to where its work starts."""


def _stop(*args: object, **kwargs: object) -> None:
    raise Reached


# Where each command's work begins, after its arguments are checked.
WORK = (
    "gptblock.train.run.GPTRun.fit",
    "gptblock.model.generation.decode._steps",
    "gptblock.cli.check.check_isolated",
    "gptblock.cli.grade.grade",
    "gptblock.cli.exercises.run_all",
    "gptblock.bench.suite.matmul_peak",
)


def _cases() -> list[tuple[str, str, str]]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    cases = []
    for command, p in sub.choices.items():
        for action in p._actions:
            if action.option_strings and action.type in (int, float):
                flag = action.option_strings[0]
                if flag == "--threads":  # test_misuse_values: it runs before any command
                    continue
                for value in INTS if action.type is int else FLOATS:
                    cases.append((command, flag, value))
    return cases


CASES = _cases()


def test_the_sweep_reaches_every_command_with_numeric_flags():
    commands = {c for c, _, _ in CASES}
    assert commands == {
        "train",
        "sample",
        "inspect",
        "check",
        "exercises",
        "bench",
        "example",
        "grade",
    }
    assert len({(c, f) for c, f, _ in CASES}) >= 35
    assert set(ACCEPTED) <= set(CASES)  # no stale entry


def _base(command: str, flag: str, tmp_path: Path) -> list[str]:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a small corpus of plain words, read by train.\n" * 200)
    base = {
        "train": ["train", "--data", str(corpus), "--out", str(tmp_path / "run"), "--no-progress"],
        "sample": ["sample", "--out", str(FIXTURE_RUN)],
        "inspect": ["inspect", "--out", str(FIXTURE_RUN), "--prompt", "ab"],
        "bench": ["bench", "--no-progress"],
        "grade": ["grade", str(corpus.with_suffix(".py"))],
    }.get(command, [command])
    corpus.with_suffix(".py").write_text("")  # a submission for grade
    if flag in ("--rotary-dim", "--rope-theta"):
        base = [*base, "--position", "rope"]
    return base


@pytest.mark.parametrize("command, flag, value", CASES, ids=[" ".join(c) for c in CASES])
def test_an_absurd_value_is_one_line_or_the_right_result(tmp_path, capsys, command, flag, value):
    argv = [*_base(command, flag, tmp_path), f"{flag}={value}"]
    with contextlib.ExitStack() as stack:
        for target in WORK:
            stack.enter_context(mock.patch(target, _stop))
        try:
            code = main(argv)
        except Reached:
            code = None
        except SystemExit as e:  # argparse's own refusal: usage and one error line
            code = e.code
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if ": error: " in line]
    others = [line for line in err.splitlines() if line and ": warning: " not in line]
    if (command, flag, value) in ACCEPTED:
        assert code in (None, 0), err
        assert not errors, err
        return
    assert code == 2, f"{argv} was accepted: {err}"
    assert len(errors) == 1, err
    assert "Traceback" not in err
    if not errors[0].startswith("gptblock: error: argument"):  # ours, not argparse's
        assert others == errors, err
        assert errors[0].startswith(f"gptblock {command}: error: "), err
