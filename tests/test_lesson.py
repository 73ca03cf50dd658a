"""gptblock.lesson is the lesson's code: same names, same state_dicts, bit-identical outputs."""

import pytest
import torch

import lesson_reference as ref
from gptblock import lesson

SIZES = [(16, 2, 8), (32, 4, 16), (12, 3, 5), (8, 1, 4)]  # (n_embd, n_head, block_size)


@pytest.mark.parametrize("n_embd,n_head,block_size", SIZES)
def test_lesson_state_dict_loads_strictly_and_outputs_are_identical(n_embd, n_head, block_size):
    torch.manual_seed(0)
    theirs = ref.Block(n_embd, n_head, block_size).eval()
    ours = lesson.Block(n_embd, n_head, block_size).eval()
    ours.load_state_dict(theirs.state_dict(), strict=True)
    x = torch.randn(3, block_size, n_embd)
    assert torch.equal(ours(x), theirs(x))
    assert torch.equal(ours(x[:, :2]), theirs(x[:, :2]))  # T < block_size uses tril[:T, :T]


def test_ours_loads_into_the_lesson_too():
    torch.manual_seed(1)
    ours = lesson.Block(16, 2, 8).eval()
    theirs = ref.Block(16, 2, 8).eval()
    theirs.load_state_dict(ours.state_dict(), strict=True)
    x = torch.randn(2, 8, 16)
    assert torch.equal(ours(x), theirs(x))


def test_state_dict_keys_are_the_lessons():
    assert list(lesson.Block(16, 2, 8).state_dict()) == list(ref.Block(16, 2, 8).state_dict())


@pytest.mark.parametrize("cls", ["Head", "MultiHeadAttention", "FeedForward"])
def test_each_piece_matches_the_lesson(cls):
    torch.manual_seed(2)
    args = {
        "Head": (16, 8, 6),
        "MultiHeadAttention": (2, 16, 6),
        "FeedForward": (16,),
    }[cls]
    theirs = getattr(ref, cls)(*args).eval()
    ours = getattr(lesson, cls)(*args).eval()
    ours.load_state_dict(theirs.state_dict(), strict=True)
    x = torch.randn(2, 6, 16)
    assert torch.equal(ours(x), theirs(x))


def test_training_mode_with_dropout_matches_the_lesson_given_the_same_rng():
    # Same dropout calls in the same order: the same random masks, the same outputs.
    torch.manual_seed(3)
    theirs = ref.Block(16, 2, 8, dropout=0.3).train()
    ours = lesson.Block(16, 2, 8, dropout=0.3).train()
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(2, 8, 16)
    torch.manual_seed(4)
    a = theirs(x)
    torch.manual_seed(4)
    b = ours(x)
    assert torch.equal(a, b)


def test_default_dropout_is_the_lessons():
    block = lesson.Block(16, 2, 8)
    rates = {m.p for m in block.modules() if isinstance(m, torch.nn.Dropout)}
    assert rates == {0.2}


# --- what the lesson leaves unsafe ------------------------------------------------------------


def test_indivisible_heads_name_both_numbers():
    with pytest.raises(ValueError, match=r"n_embd=10 is not divisible by n_head=3"):
        lesson.Block(10, 3, 8)
    with pytest.raises(ValueError, match=r"n_embd=10 is not divisible by n_head=4"):
        lesson.MultiHeadAttention(4, 10, 8)


def test_too_long_input_names_T_and_block_size():
    block = lesson.Block(16, 2, 8)
    with pytest.raises(ValueError, match=r"T=9 exceeds block_size=8"):
        block(torch.randn(1, 9, 16))
    with pytest.raises(ValueError, match=r"T=9 exceeds block_size=8"):
        block.sa.heads[0](torch.randn(1, 9, 16))


@pytest.mark.parametrize("shape", [(5, 16), (1, 2, 5, 16), (2, 5, 15)])
def test_wrong_shape_names_expected_and_actual(shape):
    block = lesson.Block(16, 2, 8)
    with pytest.raises(
        ValueError,
        match=r"expected input of shape \(B, T, 16\).*got "
        + str(shape).replace("(", r"\(").replace(")", r"\)"),
    ):
        block(torch.randn(*shape))


def test_feedforward_wrong_width():
    with pytest.raises(ValueError, match=r"\(\.\.\., 16\).*\(2, 3, 5\)"):
        lesson.FeedForward(16)(torch.randn(2, 3, 5))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"n_embd": 0, "n_head": 1, "block_size": 4}, "n_embd must be a positive int, got 0"),
        ({"n_embd": 8, "n_head": 2, "block_size": 0}, "block_size must be a positive int, got 0"),
        (
            {"n_embd": 8, "n_head": 2, "block_size": 4, "dropout": 1.0},
            r"dropout must be in \[0, 1\), got 1.0",
        ),
        (
            {"n_embd": 8, "n_head": 2, "block_size": 4, "dropout": -0.1},
            r"dropout must be in \[0, 1\)",
        ),
    ],
)
def test_bad_constructor_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        lesson.Block(**kwargs)


def test_no_assert_in_the_package():
    import pathlib

    import gptblock

    root = pathlib.Path(gptblock.__file__).parent
    offenders = [
        str(p)
        for p in root.rglob("*.py")
        if "\nassert " in p.read_text() or "    assert " in p.read_text()
    ]
    assert offenders == []


# --- attention weights ------------------------------------------------------------------------


def test_attention_weights_are_what_forward_uses():
    torch.manual_seed(5)
    head = lesson.Head(16, 8, 6).eval()
    x = torch.randn(2, 6, 16)
    wei = head.attention_weights(x)  # (B, T, T)
    assert wei.shape == (2, 6, 6)
    assert torch.equal(wei @ head.value(x), head(x))


def test_block_attention_weights_stack_heads_after_ln1():
    torch.manual_seed(6)
    block = lesson.Block(16, 2, 8).eval()
    x = torch.randn(2, 5, 16)
    w = block.attention_weights(x)
    assert w.shape == (2, 2, 5, 5)
    for i, h in enumerate(block.sa.heads):
        assert torch.equal(w[:, i], h.attention_weights(block.ln1(x)))


def test_attention_weights_are_pre_dropout_and_do_not_consume_rng():
    block = lesson.Block(16, 2, 8, dropout=0.5).train()
    x = torch.randn(1, 5, 16)
    torch.manual_seed(0)
    w1 = block.attention_weights(x)
    r1 = torch.rand(1)
    torch.manual_seed(0)
    w2 = block.attention_weights(x)
    r2 = torch.rand(1)
    assert torch.equal(w1, w2) and torch.equal(r1, r2)
    assert torch.allclose(w1.sum(-1), torch.ones(1, 2, 5))
