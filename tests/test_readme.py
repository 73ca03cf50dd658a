"""Every command and Python snippet of the README and docs/ runs, so none can drift from the code.

What is checked, by fence:

* ```` ```python ````: run as written, each block in a fresh namespace.
* ```` ```bash ````: each line is one command (a trailing backslash continues it), split into
  words by bash itself (so quoting such as ``$'a\\nb'`` means what it means in a shell; pipes and
  redirections are refused). What the command is decides how it is checked:

  - ``gptblock ...`` in README.md runs for real, in-process, in a scratch directory that holds
    ``tests/`` and a tiny Hugging Face directory ``gpt2-dir``, after a tiny run was trained into
    ``out-gptblock``. Long jobs get tiny settings appended (argparse keeps the last value of a
    flag): ``train`` a 1-layer model for 2 steps into a fresh ``--out``, ``sample`` 20
    characters. ``check`` may exit 1 (a block with a mistake is what its example shows).
    ``bench`` is only parsed (``tests/test_bench.py`` runs ``--quick``).
  - ``gptblock ...`` anywhere else, and ``torchrun ... -m gptblock ...``: parsed by the real
    argument parser (every flag, choice and type), not run.
  - ``python SCRIPT ...``: the script exists and names every ``--flag`` used.
  - ``python -m MODULE``: the module can be imported; ``pytest PATH``, ``bash FILE``: the path
    exists; ``pip install``: every extra named is one of pyproject.toml's.
  - anything else fails: teach this file about it.

* ```` ```text ```` and other fences: output, not run.

Every relative link resolves (a file, and a heading for ``#anchor``), and the README stays under
300 lines: it is the front door; the rest belongs in docs/.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import pathlib
import re
import subprocess

import pytest
import torch

from gptblock.cli import build_parser, main

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
PAGES.append(ROOT / "benchmarks" / "README.md")

# Appended to a README command that would run long; argparse keeps the last value of a flag.
# (Not a smaller batch: the whole validation split is scored at the end, a batch at a time.)
TINY_TRAIN = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--max-iters", "2"]
TINY_TRAIN += ["--eval-interval", "2", "--eval-iters", "1", "--no-progress"]
TINY = {"train": TINY_TRAIN, "sample": ["--max-new-tokens", "20"]}
# `check` exits 1 when the block has a mistake, which is what a README example of it shows.
EXIT_CODES = {"check": (0, 1)}
PARSE_ONLY = {"bench"}  # minutes at its defaults; tests/test_bench.py runs --quick
FRESH = itertools.count()  # a new --out for each README train command


def fenced(path: pathlib.Path) -> list[tuple[str, int, str]]:
    """Every fenced block of a Markdown file: (language, line of the fence, body)."""
    blocks, lang, start, body = [], None, 0, []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("```"):
            if lang is None:
                lang, start, body = line[3:].strip(), n, []
            else:
                blocks.append((lang, start, "\n".join(body) + "\n"))
                lang = None
        elif lang is not None:
            body.append(line)
    assert lang is None, f"{path.name}: the fence opened at line {start} is never closed"
    return blocks


def commands(body: str) -> list[str]:
    """The command lines of a bash block, continuation lines joined; comments stay (bash
    drops them)."""
    joined = re.sub(r"\\\n", " ", body)
    return [
        line for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")
    ]


def words(line: str) -> list[str]:
    """``line`` split into words as bash splits a command: quotes and ``$'...'`` resolved,
    comments dropped, no globbing; a pipe, redirection or second command is a syntax error."""
    script = f"set -f\nargs=( {line}\n)\nprintf '%s\\0' \"${{args[@]}}\""
    done = subprocess.run(["bash", "-c", script], capture_output=True, check=False)
    assert done.returncode == 0, f"bash cannot read {line!r} as one command: {done.stderr!r}"
    return done.stdout.decode().split("\0")[:-1]


def _page_id(path: pathlib.Path) -> str:
    return str(path.relative_to(ROOT))


SNIPPETS = [
    pytest.param(path, body, id=f"{_page_id(path)}:{line}")
    for path in PAGES
    for lang, line, body in fenced(path)
    if lang == "python"
]
COMMANDS = [
    pytest.param(path, command, id=f"{_page_id(path)}:{line}:{command.split('#')[0].strip()}")
    for path in PAGES
    for lang, line, body in fenced(path)
    if lang == "bash"
    for command in commands(body)
]


def test_the_pages_have_examples():
    assert len(SNIPPETS) >= 15 and len(COMMANDS) >= 40


def test_the_readme_is_a_front_door():
    assert len(README.read_text(encoding="utf-8").splitlines()) < 300


@pytest.mark.parametrize(("path", "code"), SNIPPETS)
def test_python_snippet_runs(path, code):
    exec(compile(code, str(path), "exec"), {"__name__": "readme"})


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """A directory to run the README's commands in: ``tests/``, a tiny run in
    ``out-gptblock`` and a tiny Hugging Face GPT-2 directory with its tokenizer, ``gpt2-dir``."""
    d = tmp_path_factory.mktemp("readme")
    (d / "tests").symlink_to(ROOT / "tests")
    old = os.getcwd()
    os.chdir(d)
    try:
        assert main(["train", *TINY_TRAIN]) == 0
    finally:
        os.chdir(old)
    transformers = pytest.importorskip("transformers")
    from gptblock.data.bpe import BPETokenizer
    from gptblock.data.text import shakespeare

    tok = BPETokenizer.train(shakespeare()[:20_000], vocab_size=300)
    (d / "gpt2-dir").mkdir()
    tok.tokenizer.save(str(d / "gpt2-dir" / "tokenizer.json"))
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=300, n_positions=32, n_layer=1, n_head=2,
                                     n_embd=16, bos_token_id=None, eos_token_id=None)  # fmt: skip
    transformers.GPT2LMHeadModel(config).save_pretrained(d / "gpt2-dir")
    return d


def _run(argv: list[str]) -> int:
    """``gptblock ARGV`` in this process; its exit code (``--help`` exits through SystemExit)."""
    try:
        return main(argv)
    except SystemExit as e:
        return int(e.code or 0)


def _parses(argv: list[str]) -> None:
    parser = build_parser()
    try:
        parser.parse_args(argv)
    except SystemExit as e:  # --help exits 0; a bad flag, choice or type exits 2
        assert e.code == 0, f"gptblock {' '.join(argv)}: the parser refuses it"


def _script_names_its_flags(script: pathlib.Path, args: list[str]) -> None:
    assert script.is_file(), f"no script {script}"
    source = script.read_text(encoding="utf-8")
    for flag in (a.split("=")[0] for a in args if a.startswith("--")):
        assert f'"{flag}"' in source, f"{script.name} has no option {flag}"


def _extras(args: list[str]) -> None:
    # The names of pyproject.toml's [project.optional-dependencies] (tomllib is 3.11+).
    table = (ROOT / "pyproject.toml").read_text().split("[project.optional-dependencies]")[1]
    known = set(re.findall(r"^(\w+) = \[", table.split("\n[")[0], flags=re.M))
    for arg in args:
        for extras in re.findall(r"^(?:\.|gptblock)\[([\w,]+)\]$", arg):
            assert set(extras.split(",")) <= known, f"pip install {arg}: no such extra"


@pytest.mark.parametrize(("path", "command"), COMMANDS)
def test_command_works(path, command, request, monkeypatch, capsys):
    argv = words(command)
    if argv[0] == "time":
        argv = argv[1:]
    program, args = argv[0], argv[1:]
    if program == "gptblock" and path == README and not set(args) & PARSE_ONLY:
        monkeypatch.chdir(request.getfixturevalue("scratch"))
        sub = next((a for a in args if not a.startswith("-")), "")
        extra = TINY.get(sub, [])
        if sub == "train" and "--resume" not in args:
            extra = [*extra, "--out", f"out-{next(FRESH)}"]
        if args == ["check"]:  # gptblock's own blocks: one run a session (conftest.py)
            code = request.getfixturevalue("own_blocks_checked")[0]
        else:
            code = _run([*args, *extra])
        assert code in EXIT_CODES.get(sub, (0,)), f"{command!r}: {code}, {capsys.readouterr().err}"
    elif program == "gptblock":
        _parses(args)
    elif program == "torchrun":
        assert args[args.index("-m") + 1] == "gptblock", command
        _parses(args[args.index("-m") + 2 :])
    elif program in ("python", "python3") and args[0] == "-m":
        module, rest = args[1], args[2:]
        if module == "gptblock":
            _parses(rest)
        else:
            assert importlib.util.find_spec(module), f"no module {module}"
        if module == "pytest":
            assert all((ROOT / a.split("::")[0]).exists() for a in rest if not a.startswith("-"))
    elif program in ("python", "python3"):
        _script_names_its_flags(ROOT / args[0], args[1:])
    elif program == "pytest":
        assert all((ROOT / a.split("::")[0]).exists() for a in args if not a.startswith("-"))
    elif program == "bash":
        assert (ROOT / args[0]).is_file(), command
    elif program == "pip" and args[0] == "install":
        _extras(args[1:])
    else:
        pytest.fail(f"{command!r}: tests/test_readme.py does not know how to check {program!r}")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


LINKS = [
    pytest.param(path, target, id=f"{_page_id(path)}->{target}")
    for path in PAGES
    for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text(encoding="utf-8"))
    if not re.match(r"[a-z]+:", target)
]


@pytest.mark.parametrize(("path", "target"), LINKS)
def test_link_resolves(path, target):
    file, _, anchor = target.partition("#")
    linked = (path.parent / file).resolve() if file else path
    assert linked.exists(), f"{path.name} links to {target}, which does not exist"
    if anchor:
        headings = re.findall(r"^#+ (.*)$", linked.read_text(encoding="utf-8"), flags=re.M)
        assert anchor in {_slug(h) for h in headings}, f"{target}: no such heading"
