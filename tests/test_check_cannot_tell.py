"""A block cannot tell that the checker runs it, so a block right only when watched fails.

Each block below is the lessons' block with its attention scores scaled by 1/sqrt(hs) only when
it believes a checker runs it, and left unscaled (``no_scaling``) otherwise: it looks for the
checker in its process's command line and its ancestors' (``/proc/PID/cmdline``), in its
environment, in ``sys.modules`` and on the stack. ``gptblock check`` runs it as a user would, on
the command line (whose own command line says ``gptblock check``), with a ``GPTBLOCK_*``
variable and the shell's ``_`` in the environment. Whatever it looks at, it must see nothing,
compute the mistake and get ``FAIL``; the block that always scales passes.

The answers that decide the verdict come from the runner, a process forked from a supervisor
that imported only torch, running a neutral copy of its files: no ``gptblock`` module in its
``sys.modules``, no gptblock file among the frames under the block's calls (docs/checker.md,
"What the block can still tell").
"""

import os
import subprocess
import sys
import textwrap

import pytest

BLOCKS = textwrap.dedent(
    '''
    import inspect
    import os
    import sys

    import torch
    import torch.nn as nn
    from torch.nn import functional as F

    WORDS = ("gptblock", "check")


    class Block(nn.Module):
        """The lessons' block: pre-norm, causal attention, a GELU MLP, both residuals."""

        def __init__(self, n_embd=32, n_head=4):
            super().__init__()
            self.n_head = n_head
            self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
            self.qkv, self.proj = nn.Linear(n_embd, 3 * n_embd), nn.Linear(n_embd, n_embd)
            self.fc1, self.fc2 = nn.Linear(n_embd, 4 * n_embd), nn.Linear(4 * n_embd, n_embd)

        def watched(self):
            return True

        def attn(self, h):
            B, T, C = h.shape
            q, k, v = (t.view(B, T, self.n_head, -1).transpose(1, 2) for t in self.qkv(h).chunk(3, -1))
            wei = q @ k.transpose(-2, -1)
            if self.watched():  # the scale, only for the checker's eyes
                wei = wei * k.shape[-1] ** -0.5
            wei = wei.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
            return self.proj((wei.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C))

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


    class ByAncestors(Block):
        def watched(self):
            pid = os.getpid()
            while pid > 1:
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        line = f.read().replace(b"\\0", b" ").decode(errors="replace").lower()
                    with open(f"/proc/{pid}/stat") as f:
                        pid = int(f.read().rsplit(")", 1)[1].split()[1])
                except (OSError, ValueError, IndexError):
                    return False
                if any(w in line for w in WORDS):
                    return True
            return False


    class ByEnviron(Block):
        def watched(self):
            return any("gptblock" in (k + v).lower() for k, v in os.environ.items())


    class ByModules(Block):
        def watched(self):
            return any("gptblock" in m for m in sys.modules)


    class ByFrames(Block):
        def watched(self):
            frame = sys._getframe()
            while frame is not None:
                code = frame.f_code
                if any(w in (code.co_filename + code.co_name).lower() for w in WORDS):
                    return True
                frame = frame.f_back
            return False


    class ByArgv(Block):
        def watched(self):  # run as any script but this file
            return os.path.basename(sys.argv[0]) != os.path.basename(__file__)


    class ByStack(Block):
        def watched(self):
            return any(
                any(w in (f.filename + f.function).lower() for w in WORDS)
                for f in inspect.stack(0)[1:]
            )
    '''
)


@pytest.fixture(scope="module")
def blocks(tmp_path_factory):
    path = tmp_path_factory.mktemp("learner") / "blocks.py"
    path.write_text(BLOCKS)
    return path


def _check(target):
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(sys.path),
        GPTBLOCK_SEEN="1",  # a variable of the checker's, and the shell's record of the command
        _=os.path.join(os.path.dirname(sys.executable), "gptblock"),
    )
    return subprocess.run(
        [sys.executable, "-m", "gptblock", "check", target],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


def test_the_block_that_always_scales_passes(blocks):
    done = _check(f"{blocks}:Block")
    assert done.returncode == 0 and "result: PASS" in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize(
    "name",
    ["ByAncestors", "ByEnviron", "ByModules", "ByFrames", "ByStack", "ByArgv"],
)
def test_a_block_right_only_when_watched_fails(blocks, name):
    done = _check(f"{blocks}:{name}")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "diagnosis: no_scaling" in done.stdout, done.stdout
