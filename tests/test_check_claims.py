"""A ``--map`` or ``--arg`` that makes no sense is refused in one line, never a PASS or a FAIL
(``gptblock.check.roles.given``, ``gptblock.check.building.build.check_sizes``; issue 21, class 2).

A role given by hand is the comparison's truth: a norm for a projection, a bias for a weight, a
shape the role cannot have, one weight for two roles, or a name the forward pass uses for another
role must each be a ``UserValueError`` naming the role, the name and why (exit 2 on the command
line), and so must a constructor argument no block can be built with.
"""

import subprocess
import sys
from pathlib import Path

import pytest

import zoo_lesson
from gptblock import FusedBlock, check_block
from gptblock.check.building.build import check_sizes
from gptblock.check.serve.subject import one_thread
from gptblock.errors import UserValueError

LESSON = {"n_embd": 32, "n_head": 4, "block_size": 16}
W = "self_attn.in_proj_weight"  # FusedBlock's packed q | k | v, (3C, C)


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.mark.parametrize("roles, why", [
    ({"q": "ln1"}, r"^q=ln1: ln1 is a norm of width 32, not a linear layer; q is a \(D, C\)"),
    ({"ln1": "sa.proj"}, r"^ln1=sa\.proj: sa\.proj is a linear layer .* not a norm"),
    ({"q": "ln1.weight"}, r"^q=ln1\.weight: a vector of shape \(32,\) \(a bias or a norm's"),
    ({"proj": "sa.proj.bias"}, r"^proj=sa\.proj\.bias: a vector of shape \(32,\)"),
    ({"fc1": "ffwd.net.2"}, r"^fc1=ffwd\.net\.2: .* \(32, 128\), but fc1 is \(H, C\) with C = 32"),
    ({"fc1": "sa.heads.*.query"}, r"^fc1=sa\.heads\.\*\.query matches 4 parts .* only q, k and v"),
    ({"q": "sa.heads.*.query", "k": "sa.heads.*.query"},
     r"^q=sa\.heads\.\*\.query and k=sa\.heads\.\*\.query: both name sa\.heads\.0\.query\.weight"),
    ({"fc1": "ffwd.net.0", "fc2": "ffwd.net.0"}, r"^fc1=ffwd\.net\.0 and fc2=ffwd\.net\.0"),
    ({"q": "sa.heads.*.key", "k": "sa.heads.*.query"},
     r"^q=sa\.heads\.\*\.key: the forward pass uses sa\.heads\.\*\.key as k, not q \(it reads q "
     r"from sa\.heads\.\*\.query\)"),
    ({"q": "sa.proj"}, r"^q=sa\.proj: the forward pass uses sa\.proj as proj, not q"),
    ({"fc2": "ffwd.net.0"}, r"^fc2=ffwd\.net\.0: .*, but fc2 is \(C, H\)"),
    ({"ln1": "ln2", "ln2": "ln1"}, r"^ln1=ln2: the forward pass uses ln2 as ln2, not ln1"),
])  # fmt: skip
@pytest.mark.parametrize("block", [zoo_lesson.LessonBlock, zoo_lesson.LessonPostNormNoScaling])
def test_a_role_that_cannot_be_what_it_claims_is_refused_saying_why(block, roles, why):
    with pytest.raises(UserValueError, match=why):
        check_block(block, roles=roles, **LESSON)


def test_roles_that_fit_still_pass_or_find_the_mistake():
    given = {"q": "sa.heads.*.query", "ln1": "ln1.weight", "proj": "sa.proj.weight"}
    assert check_block(zoo_lesson.LessonBlock, roles=given, **LESSON).passed
    report = check_block(zoo_lesson.LessonNoScaling, roles=given, **LESSON)
    assert report.diagnosis == ["no_scaling"] and report.confident, str(report)


@pytest.mark.parametrize("roles, why", [
    ({"q": f"{W}[32:64,:]", "k": f"{W}[0:32,:]"},
     r"^q=self_attn\.in_proj_weight\[32:64,:\]: it holds what the forward pass uses as k"),
    ({"q": f"{W}[1:33,:]"}, r"^q=.*\[1:33,:\]: it is not the matrix the forward pass uses as q"),
    ({"q": f"{W}[0:32,:]:in_out"}, r"its bias self_attn\.in_proj_bias gives 96 values for 32"),
    ({"q": "linear1.weight[0:32,:]"}, r"^q=linear1\.weight\[0:32,:\]: the forward pass uses"),
    ({"proj": "self_attn.out_proj.weight:in_out"}, r"it is not the matrix the forward pass uses"),
    ({"q": f"{W}[0:40,:]", "k": f"{W}[32:64,:]"}, r"overlapping slices of self_attn\.in_proj"),
    ({"q": f"{W}[0:32,:]", "k": f"{W}[0:32,:]"}, r"overlapping slices"),
    ({"q": "self_attn.out_proj.weight[:, :]"}, r"uses self_attn\.out_proj\.weight as proj, not q"),
    ({"fc2": "linear2.weight:in_out"}, r"reads as \(out, in\) = \(128, 32\), but fc2 is \(C, H\)"),
])  # fmt: skip
def test_a_slice_must_hold_the_matrix_the_forward_pass_uses(roles, why):
    with pytest.raises(UserValueError, match=why):
        check_block(FusedBlock, d_model=32, n_heads=4, roles=roles)


def test_slices_that_hold_their_roles_pass():
    roles = {"q": f"{W}[0:32,:]", "k": f"{W}[32:64,:]", "v": f"{W}[64:96,:]"}
    assert check_block(FusedBlock, d_model=32, n_heads=4, roles=roles).passed


# ----- --arg -------------------------------------------------------------------------------------


@pytest.mark.parametrize("given, why", [
    ({"n_head": 3}, r"^--arg n_head=3: n_embd=32 is not divisible by n_head=3 .* one of 1, 2, 4, 8, 16, 32"),
    ({"n_head": 0}, r"^--arg n_head=0: expected a whole number from 1 to 8192"),
    ({"n_head": -1}, r"^--arg n_head=-1: expected a whole number"),
    ({"n_head": "10**9"}, r"^--arg n_head='10\*\*9': .*read as a Python literal"),
    ({"n_head": 10**9}, r"^--arg n_head=1000000000: expected a whole number from 1 to 8192"),
    ({"n_head": 2.5}, r"^--arg n_head=2\.5: expected a whole number"),
    ({"n_head": True}, r"^--arg n_head=True: expected a whole number"),
    ({"n_head": "four"}, r"^--arg n_head='four': expected a whole number"),
    ({"n_embd": 7, "n_head": 2}, r"^--arg n_head=2: n_embd=7 is not divisible by n_head=2 .* give one of 1, 7$"),
    ({"n_embd": 10**6}, r"^--arg n_embd=1000000: expected a whole number from 1 to 8192"),
    ({"block_size": 0}, r"^--arg block_size=0: expected"),
    ({"n_embd": 64, "n_head": 128}, r"^--arg n_head=128: n_embd=64 is not divisible by n_head=128"),
])  # fmt: skip
def test_a_size_no_block_can_have_is_refused_before_building(given, why):
    with pytest.raises(UserValueError, match=why):
        check_block(zoo_lesson.LessonBlock, **{**LESSON, **given})


def test_a_default_that_does_not_fit_a_given_width_is_named_as_the_default():
    with pytest.raises(
        UserValueError,
        match=r"^n_head=4 \(the checker's default; --arg n_head=N changes it\): n_embd=30 is not",
    ):
        check_block(zoo_lesson.LessonBlock, n_embd=30, block_size=16)


def test_head_counts_are_checked_against_each_other_and_a_head_size_frees_the_width():
    with pytest.raises(
        UserValueError, match=r"--arg n_kv_head=3: n_head=4 is not divisible by n_kv_head=3"
    ):
        check_sizes({"n_embd": 32, "n_head": 4, "n_kv_head": 3}, {"n_kv_head": 3})
    check_sizes({"n_embd": 32, "n_head": 3, "head_size": 16}, {})  # D = 48 != C: allowed


# ----- the command line: one line on stderr, exit 2, nothing on stdout ---------------------------

ZOO = str(Path(__file__).parent / "zoo_lesson.py")
ARGS = ["--arg", "n_embd=32", "--arg", "n_head=4", "--arg", "block_size=16"]


@pytest.mark.parametrize("extra, why", [
    (["--map", "q=ln1"], "q=ln1: ln1 is a norm of width 32, not a linear layer"),
    (["--map", "q=sa.heads.*.key", "k=sa.heads.*.query"], "as k, not q"),
    (["--map", "proj=sa.proj.bias"], "proj=sa.proj.bias: a vector of shape (32,)"),
    (["--arg", "n_head=3"], "--arg n_head=3: n_embd=32 is not divisible by n_head=3"),
    (["--arg", "n_head=0"], "--arg n_head=0: expected a whole number from 1 to 8192"),
    (["--arg", "n_head=10**9"], "read as a Python literal"),
])  # fmt: skip
def test_the_cli_refuses_them_in_one_line_with_exit_2(extra, why):
    argv = ["check", f"{ZOO}:LessonPostNormNoScaling", *ARGS, *extra]
    done = subprocess.run(
        [sys.executable, "-m", "gptblock", *argv], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert why in done.stderr
