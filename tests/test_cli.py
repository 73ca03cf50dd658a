"""The command line: one entry point, thin over the library, clean errors."""

import subprocess
import sys

import pytest

from gptblock.cli import main
from gptblock.cli.formatting import COMMANDS


def test_help_lists_the_commands(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for command, line in COMMANDS.items():  # registered by name alone: no module imported
        assert command in out and " ".join(line.split()[:3]) in " ".join(out.split())


def test_python_dash_m_runs_the_cli():
    r = subprocess.run(
        [sys.executable, "-m", "gptblock", "--version"], capture_output=True, text=True
    )
    assert r.returncode == 0 and r.stdout.startswith("gptblock ")


def test_example_passes(capsys):
    assert main(["example", "--seed", "3"]) == 0
    assert "PASS" in capsys.readouterr().out


def test_info(capsys):
    assert main(["info"]) == 0
    assert "torch" in capsys.readouterr().out


def test_unknown_command_exits_2(capsys):
    with pytest.raises(SystemExit) as e:
        main(["nope"])
    assert e.value.code == 2


def test_a_bug_keeps_its_traceback_while_a_user_error_is_one_line(monkeypatch, capsys):
    from gptblock.cli import example as example_cli
    from gptblock.errors import UserValueError

    def bug(args):
        raise ValueError("an internal invariant broke")  # not a UserError: a bug

    monkeypatch.setattr(example_cli, "worked_example", lambda seed: bug(None))
    with pytest.raises(ValueError, match="internal invariant"):
        main(["example"])

    def user_error(seed):
        raise UserValueError("seed must be lucky")

    monkeypatch.setattr(example_cli, "worked_example", user_error)
    assert main(["example"]) == 2
    assert capsys.readouterr().err == "gptblock example: error: seed must be lucky\n"
