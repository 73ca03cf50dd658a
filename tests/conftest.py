import collections
import contextlib
import io
import json
import os
from pathlib import Path

import pytest
import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `pytest -n 2` on the 2-core CI machine: one thread a worker, and one for each process a
    # test starts (they inherit the environment). Two 2-thread workers on 2 cores made PyTorch
    # 3-5x slower.
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
else:
    # Two threads on the 2-core CI machine; the tests are small and more threads only add noise.
    torch.set_num_threads(min(torch.get_num_threads(), 2))


@pytest.fixture(scope="session")
def own_blocks_checked(tmp_path_factory):
    """``gptblock check`` without a target (gptblock's own blocks, each in a child process), run
    once a session: its exit code, stdout and stderr. The README's command and
    tests/test_check_cli.py both read this one run; under xdist the workers share it through
    the session's temporary folder (the parent of each worker's)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return _check_own_blocks()
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp().parent / "own_blocks_checked.json"
    with FileLock(f"{shared}.lock"):
        if not shared.exists():
            shared.write_text(json.dumps(_check_own_blocks()))
        return tuple(json.loads(shared.read_text()))


def _check_own_blocks():
    from gptblock.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["check"])
    return code, out.getvalue(), err.getvalue()


# Seconds each xdist group (a file, or a group a test names) took in a quiet `pytest -n2` run:
# the groups start longest first, so that the short ones fill in around them and no worker ends
# alone on a long one. `TESTS_STORE_DURATIONS=1 pytest -n2` measures them again.
DURATIONS = Path(__file__).with_name("durations.json")


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """``-n N`` without ``--dist``: one file to one worker (``loadgroup``, each file its own group
    unless a test names another), not test by test, so that a file's module fixtures (trained
    runs, checked blocks, built models) are made once; the real-world zoo names two groups.
    The groups keep the order ``pytest_collection_modifyitems`` gives them (xdist would sort them
    by their number of tests). The workers parse the command line again (no ``--dist`` there):
    the environment they inherit tells them. Whether xdist's own hook ran first (it turns "no"
    into "load") depends on pytest's version: the command line says whether ``--dist`` was given."""
    given = any(a.startswith(("--dist", "-d")) for a in config.invocation_params.args)
    if getattr(config.option, "numprocesses", None) and not given:
        config.option.dist = "loadgroup"
        config.option.loadscopereorder = False
        os.environ["TESTS_XDIST_GROUP_BY_FILE"] = "1"


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get("TESTS_XDIST_GROUP_BY_FILE"):
        config.option.loadgroup = True  # read by xdist's worker when it names the groups


def pytest_itemcollected(item):
    # here, not in pytest_collection_modifyitems: xdist's worker reads the groups into the node
    # ids there, before or after this file's hook as pytest's version orders them
    if getattr(item.config.option, "loadgroup", False):
        _file_group(item)


def _file_group(item):
    if item.get_closest_marker("xdist_group") is None:
        item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


def pytest_collection_modifyitems(config, items):
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:  # src/'s doctests: this file's pytest_itemcollected sees only tests/
        _file_group(item)
    measured = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    group = {item: item.get_closest_marker("xdist_group").args[0] for item in items}
    count = collections.Counter(group.values())
    # a group not measured yet: half a second a test, about the suite's mean
    items.sort(key=lambda item: -measured.get(group[item], 0.5 * count[group[item]]))


_took: collections.Counter[str] = collections.Counter()


def pytest_runtest_logreport(report):
    """On the controller, with TESTS_STORE_DURATIONS=1: the seconds of each group (named after
    the ``@`` of an xdist node id), written to tests/durations.json when the session ends."""
    if os.environ.get("TESTS_STORE_DURATIONS") and not os.environ.get("PYTEST_XDIST_WORKER"):
        _, at, group = report.nodeid.rpartition("@")
        _took[group if at else report.nodeid.split("::")[0]] += report.duration


def pytest_sessionfinish(session, exitstatus):
    if _took and exitstatus == 0:
        rounded = {group: round(seconds, 1) for group, seconds in _took.most_common()}
        partial = DURATIONS.with_suffix(".part")  # written whole or not at all
        partial.write_text(json.dumps(rounded, indent=0) + "\n")
        partial.replace(DURATIONS)
