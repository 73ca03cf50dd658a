"""A command imports only what it runs (issue 30): `gptblock train` and `gptblock sample` load
nothing of the checker, the lens or the benchmark, `gptblock check` nothing of the training code,
the lens, the benchmark or other tools' files. Each command's import costs it time: `gptblock
check` was asked to start in at most 3 s, when `import torch` alone takes 2.

Two ways: the modules a command's code can reach by its imports, read from the sources (every
import counted, those inside functions too, so a run's later imports are included), and the
modules one process really loads to parse the command's arguments."""

import ast
import os
import pathlib
import subprocess
import sys

import pytest

import gptblock
from gptblock.cli.formatting import COMMANDS

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "gptblock"

# What each command runs, and the packages it must not load.
RUNS = {"train": "train", "sample": "sampling", "check": "check", "grade": "check"}
NOT_LOADED = {
    "train": {"check", "lens", "bench"},
    "sample": {"check", "lens", "bench"},
    "check": {"train", "lens", "bench", "interop", "runs", "loading"},
    "grade": {"train", "lens", "bench", "interop", "runs", "loading"},
}


def source(module):
    """The file of ``module`` (dotted, under gptblock), or None where there is none."""
    path = SRC.joinpath(*module.split(".")[1:])
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imports(path):
    """The gptblock modules ``path`` imports when it runs (imports for type checkers aside)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            node.body = []
    package = ["gptblock", *path.relative_to(SRC).parent.parts]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("gptblock"))
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            if not module.startswith("gptblock"):
                continue
            found.add(module)
            for alias in node.names:  # a submodule, or a name gptblock imports at first use
                if source(f"{module}.{alias.name}"):
                    found.add(f"{module}.{alias.name}")
                elif module == "gptblock" and alias.name in gptblock.NAMES:
                    found.add(f"gptblock.{gptblock.NAMES[alias.name]}")
    return found


def reachable(*modules):
    """Every gptblock module importing ``modules`` can load, their parent packages included."""
    seen, todo = set(), list(modules)
    while todo:
        parts = todo.pop().split(".")
        for i in range(1, len(parts) + 1):
            module = ".".join(parts[:i])
            if module not in seen and (path := source(module)):
                seen.add(module)
                todo.extend(imports(path))
    return seen


def packages(modules):
    return {m.split(".")[1] for m in modules if m.count(".")}


def test_every_command_module_is_listed():
    modules = {p.stem for p in (SRC / "cli").glob("*.py") if "def register(" in p.read_text()}
    assert modules == set(COMMANDS)


@pytest.mark.parametrize("command", sorted(NOT_LOADED))
def test_a_command_can_reach_only_what_it_runs(command):
    loaded = packages(reachable("gptblock.cli", f"gptblock.cli.{command}"))
    assert RUNS[command] in loaded and not loaded & NOT_LOADED[command], loaded


CHILD = """
import os, sys
import torch  # once, before the forks: each child pays only for gptblock's own modules
import gptblock
print("gptblock", *(m for m in sys.modules if m.startswith("gptblock.")), file=sys.stderr)
from gptblock.cli import main
for command in sys.argv[1:]:
    pid = os.fork()
    if pid == 0:
        try:
            main([command, "--help"])
        except SystemExit:
            pass
        loaded = sorted(m for m in sys.modules if m.startswith("gptblock."))
        print(command, *loaded, file=sys.stderr)
        os._exit(0)
    os.waitpid(pid, 0)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the parent forks one child per command")
def test_a_command_loads_only_what_it_runs():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    commands = sorted(NOT_LOADED)
    r = subprocess.run(
        [sys.executable, "-c", CHILD, *commands], env=env, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    loaded = {line.split()[0]: line.split()[1:] for line in r.stderr.splitlines() if line}
    assert loaded.pop("gptblock") == []  # `import gptblock` imports a name at its first use
    assert set(loaded) == set(commands), r.stderr
    for command in commands:
        assert f"gptblock.cli.{command}" in loaded[command]
        assert not packages(loaded[command]) & NOT_LOADED[command], (command, loaded[command])
        # what the sources say it can reach is all it loads
        assert set(loaded[command]) <= reachable("gptblock.cli", f"gptblock.cli.{command}")


@pytest.mark.parametrize("words", [["--version"], ["--help"]])
def test_gptblock_version_and_help_import_no_torch(words):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    code = f"import sys\nfrom gptblock.cli import main\ntry:\n    main({words!r})\nexcept SystemExit:\n    pass\nprint('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.splitlines()[-1] == "False", (r.stdout, r.stderr)
