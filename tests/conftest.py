import contextlib
import io

import pytest
import torch

# Two threads on the 2-core CI machine; the tests are small and more threads only add noise.
torch.set_num_threads(min(torch.get_num_threads(), 2))


@pytest.fixture(scope="session")
def own_blocks_checked():
    """``gptblock check`` without a target (gptblock's own blocks, each in a child process), run
    once a session: its exit code, stdout and stderr. The README's command and
    tests/test_check_cli.py both read this one run."""
    from gptblock.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["check"])
    return code, out.getvalue(), err.getvalue()
