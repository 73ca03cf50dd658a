"""`gptblock check`: targets from files and modules, --arg, --map, --timeout, --json, and the exit
codes 0 / 1 / 2. Every check runs in a child process (tests/test_check_isolation.py tests what
that protects against)."""

import json
import textwrap

import pytest

from gptblock.check import check_block
from gptblock.cli import main

POST_NORM_FILE = textwrap.dedent(
    """
    import torch
    import torch.nn as nn
    from torch.nn import functional as F


    class MyBlock(nn.Module):
        def __init__(self, n_embd, n_head, block_size, dropout=0.0):
            super().__init__()
            self.n_head = n_head
            self.ln_1 = nn.LayerNorm(n_embd)
            self.attn = nn.Module()
            self.attn.c_attn = nn.Linear(n_embd, 3 * n_embd)
            self.attn.c_proj = nn.Linear(n_embd, n_embd)
            self.ln_2 = nn.LayerNorm(n_embd)
            self.mlp = nn.Module()
            self.mlp.c_fc = nn.Linear(n_embd, 4 * n_embd)
            self.mlp.c_proj = nn.Linear(4 * n_embd, n_embd)

        def attention(self, x):
            B, T, C = x.shape
            q, k, v = self.attn.c_attn(x).split(C, dim=2)
            q, k, v = (t.view(B, T, self.n_head, -1).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.attn.c_proj(y.transpose(1, 2).reshape(B, T, C))

        def forward(self, x):
            x = self.ln_1(x + self.attention(x))  # normalising after adding: post-norm
            return self.ln_2(x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(x))))
    """
)


@pytest.fixture
def block_file(tmp_path):
    path = tmp_path / "my_block.py"
    path.write_text(POST_NORM_FILE)
    return path


def test_without_target_gptblocks_own_blocks_pass(own_blocks_checked):
    code, out, _ = own_blocks_checked  # one run a session (conftest.py): the README's too
    assert code == 0
    assert out.count("result: PASS") >= 2
    assert "check Block(" in out and "check TransformerBlock(" in out


def test_file_target_with_a_mistake_exits_1_and_says_how_to_fix_it(block_file, capsys):
    assert main(["check", f"{block_file}:MyBlock"]) == 1
    out = capsys.readouterr().out
    assert "diagnosis: post_norm" in out
    assert "FAIL  residual stream" in out
    assert "fix:" in out and "from:   lesson 1: x = x + self.sa(self.ln1(x))" in out
    assert "MyBlock(n_embd=32, n_head=4, block_size=16, dropout=0.1)" in out  # filled defaults


def test_module_target_and_args(capsys):
    code = main(
        ["check", "zoo:LessonNoScaling", "--arg", "n_embd=16", "--arg", "n_head=2", "--json"]
    )
    data = json.loads(capsys.readouterr().out)
    assert code == 1 and data["passed"] is False
    (report,) = data["reports"]
    assert report["diagnosis"] == ["no_scaling"]
    assert report["target"].startswith("LessonNoScaling(n_embd=16, n_head=2,")


def test_json_of_a_passing_block(capsys):
    code = main(["check", "gptblock:TransformerBlock", "--arg", "activation=relu", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["passed"] is True
    (report,) = data["reports"]
    assert "activation='relu'" in report["target"]  # not a literal: kept as a string
    assert report["diagnosis"] == [] and all(f["passed"] for f in report["findings"])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["check", "missing.py:Block"], "no such file"),
        (["check", "gptblock.lesson:NoSuchBlock"], "has no 'NoSuchBlock'"),
        (["check", "gptblock.lesson:block"], "has no 'block' (did you mean 'Block'?)"),
        (["check", "missing.py"], "no such file: missing.py"),
        (["check", "no_such_package_xyz:Block"], "cannot import no_such_package_xyz"),
        (["check", "gptblock.lesson"], "TARGET must be"),
        (["check", "gptblock.lesson:Block", "--arg", "n_head=3"], "not divisible"),
        (["check", "gptblock.lesson:Block", "--arg", "oops"], "NAME=VALUE"),
        (["check", "--arg", "n_embd=16"], "need a TARGET"),
        (["check", "--map", "q=a"], "need a TARGET"),
        (["check", "gptblock.lesson:Block", "--map", "q"], "ROLE=NAME"),
        (
            ["check", "gptblock.lesson:Block", "--map", "query=sa.heads.0.query"],
            "unknown role 'query'",
        ),
        (["check", "gptblock.lesson:Block", "--timeout", "0"], "--timeout must be a positive"),
        (["check", "gptblock.lesson:Block", "--timeout", "nan"], "--timeout must be a positive"),
    ],
)
def test_targets_that_cannot_be_loaded_or_built_exit_2_with_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_a_file_alone_is_checked_at_the_block_found_in_it(block_file, tmp_path, capsys):
    assert main(["check", str(block_file)]) == 1  # MyBlock: the one class with "block" in it
    assert "check MyBlock(" in capsys.readouterr().out
    assert check_block(str(block_file)).diagnosis == ["post_norm"]  # the same from Python
    two = tmp_path / "two.py"
    two.write_text("import torch.nn as nn\nclass A(nn.Module): pass\nclass B(nn.Module): pass\n")
    assert main(["check", str(two)]) == 2
    said = f"several classes could be the block: A, B; pick one as {two}:NAME"
    assert said in capsys.readouterr().err


def test_a_file_that_fails_to_import_exits_2(tmp_path, capsys):
    path = tmp_path / "broken.py"
    path.write_text("import torch\nraise RuntimeError('boom\\nsecond line')\n")
    assert main(["check", f"{path}:Block"]) == 2
    err = capsys.readouterr().err
    assert "RuntimeError: boom" in err and len(err.strip().splitlines()) == 1


GENERIC_NORMS_FILE = textwrap.dedent(
    """
    import torch.nn as nn
    from torch.nn import functional as F


    class Block(nn.Module):
        def __init__(self, n_embd, n_head):
            super().__init__()
            self.nh = n_head
            self.na, self.nb, self.nc = (nn.LayerNorm(n_embd) for _ in range(3))
            self.qkv, self.out = nn.Linear(n_embd, 3 * n_embd), nn.Linear(n_embd, n_embd)
            self.fc1, self.fc2 = nn.Linear(n_embd, 4 * n_embd), nn.Linear(4 * n_embd, n_embd)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = (t.view(B, T, self.nh, -1).transpose(1, 2) for t in self.qkv(self.nc(x)).chunk(3, -1))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.out(y.transpose(1, 2).reshape(B, T, C))
            x = x + self.fc2(F.gelu(self.fc1(self.na(x))))
            return x + 0 * self.nb(x)
    """
)


def test_map_names_the_roles_and_the_dataflow_tells_them_without_it(tmp_path, capsys):
    path = tmp_path / "generic.py"
    path.write_text(GENERIC_NORMS_FILE)
    # nb is called to no effect (0 * nb(x)): read right, the block's one fault is that nb never acts
    assert main(["check", f"{path}:Block", "--json"]) == 1
    (report,) = json.loads(capsys.readouterr().out)["reports"]
    assert report["confident"] is True and any("ln1=nc, ln2=na" in n for n in report["notes"])
    assert report["diagnosis"] == ["unused_parameters"], report
    assert main(["check", f"{path}:Block", "--map", "ln1=nc", "ln2=na", "--json"]) == 1
    (report,) = json.loads(capsys.readouterr().out)["reports"]
    assert report["confident"] is True and report["compared"] is True
    assert any("ln1=nc, ln2=na" in n for n in report["notes"])
    assert report["diagnosis"] == ["unused_parameters"], report


def test_help_shows_the_filled_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["check", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "n_embd=32" in out and "block_size=16" in out and "dropout=0.1" in out
    assert "--map ROLE=NAME" in out and "ln1 ln2 q k v qkv proj fc1 fc2" in out
    assert "--timeout SECONDS" in out and "(default: 60.0)" in out
