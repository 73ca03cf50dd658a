"""The examples that were doctests of the checker's roles/dataflow files, as tests (same values)."""

import pytest
import torch
import torch.nn as nn

from gptblock import lesson
from gptblock.check.roles.dataflow import layout
from gptblock.check.roles.modern_parts import norm_function, norm_of
from gptblock.check.roles.plain import LESSON, decode, to_plain
from gptblock.check.roles.provenance import choose, nearest, snap, sorted_values, trace, unread
from gptblock.check.roles.trace import record
from gptblock.check.roles.weights import read_trace


def test_layout_finds_batch_and_time_axes():
    assert (layout((5, 7, 4, 8), 5, 7), layout((7, 5, 32), 5, 7), layout((5, 32, 7), 5, 7)) == (
        (0, 1),
        (1, 0),
        (0, 2),
    )
    assert layout((5, 4, 7, 8), 5, 7) is None
    assert layout((5, 4, 7, 8), 5, 7, strict=False) == (0, 2)
    assert layout((5, 32, 1, 7), 5, 7) == (0, 3)


def test_record_lists_aten_operators():
    trace_ = record(nn.Linear(4, 4).double(), torch.zeros(2, 3, 4, dtype=torch.float64))
    assert [op.name for op in trace_.ops] == ["view", "t", "addmm", "view"]


def test_read_trace_reads_the_lessons_block():
    block = lesson.Block(16, 2, 8, dropout=0.0).double().eval()
    x = torch.randn(5, 7, 16, dtype=torch.float64)
    reading = read_trace(record(block, x), x)
    assert (reading.heads, reading.parts.D, reading.error < 1e-12) == (2, 16, True)


def test_norm_function_layer_is_layer_norm():
    C = 4
    w, b = torch.ones(C, dtype=torch.float64), torch.zeros(C, dtype=torch.float64)
    h = torch.randn(2, 3, C, dtype=torch.float64)
    ours = norm_function("layer", w, b, 1e-5)(h)
    assert torch.allclose(ours, torch.nn.functional.layer_norm(h, (C,)), atol=1e-12)


def test_decode_rebuilds_to_plain():
    block = lesson.Block(8, 2, 8, dropout=0.0).double().eval()
    x = torch.randn(5, 7, 8, dtype=torch.float64)
    meta, tensors = to_plain(read_trace(record(block, x), x).parts, x, "0")
    parts = decode(meta, tensors, "0", 8, LESSON).parts()
    assert (meta["ln1"]["kind"], parts.D, torch.allclose(parts.ln1(x), block.ln1(x))) == (
        "layer",
        8,
        True,
    )


def test_choose_scales_matrices_and_moves_vectors():
    g = torch.Generator().manual_seed(0)
    new = choose({"w": torch.zeros(4, 4), "b": torch.zeros(4)}, 4, g)
    assert (new["w"].std().item() > 0.2, new["b"].abs().max().item() < 0.5) == (True, True)


def test_nearest_and_snap():
    assert nearest(torch.tensor([0.0, 1.0, 5.0]), torch.tensor([0.4, 4.0, 9.0])).tolist() == [
        0,
        2,
        2,
    ]
    snapped = snap(torch.tensor([0.0, 2.001, 1.0]), torch.tensor([2.0, 5.0]), 1e-2)
    assert snapped is not None and snapped[0].tolist() == [0.0, 2.0, 1.0]


def test_trace_repeats_used_and_refusals():
    chosen = choose({"w": torch.zeros(4, 4)}, 4, torch.Generator().manual_seed(0))
    w = chosen["w"]
    assert trace({"k": [torch.cat([w[:2], w[:2]])]}, chosen, torch.float64, {"k": 2}).repeats == (
        "k's head 1 is its head 0's weights again",
    )
    assert int(trace({"q": [w[:2]], "k": [w[2:]]}, chosen, torch.float64).used.sum()) == 16
    assert (
        trace({"q": [w[:2] * 2], "k": [w[2:]]}, chosen, torch.float64).why
        == "the weights read for q are not the values the checker gave the block"
    )
    assert (
        trace({"ln1": [w[0]], "ln2": [w[0]]}, chosen, torch.float64).why
        == "ln1 and ln2 were read from the same parameters"
    )
    shared = trace({"q": [w[:2]], "k": [w[:2]]}, chosen, torch.float64)  # the block's doing
    assert (shared.why, shared.repeats) == ("", ("q and k read the same weights (w)",))


def test_unread_masks_parameters_no_role_read():
    chosen = choose({"a": torch.zeros(2, 2), "b": torch.zeros(3)}, 2, torch.Generator())
    values, order = sorted_values(chosen, torch.float64)
    taken = order < 4  # (7,): the sorted positions of all of a's values
    assert {n: m.tolist() for n, m in unread(chosen, taken, torch.float64).items()} == {
        "b": [True, True, True]
    }


def test_norm_of_tells_eps_outside():
    w = torch.linspace(0.5, 1.5, 8, dtype=torch.float64)

    def f(h):
        return h / (h.pow(2).mean(-1, keepdim=True).sqrt() + 1e-6) * w

    assert norm_of(f, torch.zeros(2, 3, 8, dtype=torch.float64)).form == "eps_outside"


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_no_norm_is_read_as_none_in_the_blocks_dtype_too(dtype):
    """A post-norm block's place before the attention is the identity, also in float32 (a block
    checked in float32 had its post_norm unread: s17 unseen set, lizh_llama's mutant)."""
    assert norm_of(lambda h: h, torch.zeros(2, 3, 8, dtype=dtype)).form == "none"


def test_trace_names_heads_that_take_a_parameters_rows_by_strides():
    # (s96 unseen set) einops' "b t (three d h)" for "(three h d)": each head takes one row in nh
    # of a packed qkv's third, among the other heads' rows; it PASSed, the packing read as weights
    nh, hs, C = 4, 2, 8
    chosen = choose(
        {"qkv": torch.zeros(3 * C, C), "w": torch.zeros(C, 3 * C)}, C, torch.Generator()
    )
    rows = torch.arange(C).view(hs, nh).T.flatten()  # head h: rows h, h + nh, ... of q's third
    for how, q in [("rows", chosen["qkv"][rows]), ("columns", chosen["w"][:, rows].T)]:
        said = trace({"q": [q]}, chosen, torch.float64, {"q": nh}).strided
        name = {"rows": "qkv", "columns": "w"}[how]  # a Linear's rows, x @ W's columns
        assert said == (
            f"q's heads each take one row in 4 of {name} (q's head 1: rows 1, 5, 9, ...), where the "
            "lessons' head h takes a run of 2 rows: a split by view(B, T, hs, nh)",
        ), said
    # q's rows spread over the parameter, a packing of its own: "(h d three)", where each head's
    # rows are its own, and "(d k h)" (the self-attention-cv zoo block), where they are not; or a
    # run each: none
    interleaved = torch.arange(C) * 3  # head h: rows 6h, 6h + 3 of the whole (3C, C)
    dkh = (torch.arange(nh)[:, None] + torch.arange(hs) * 3 * nh).flatten()  # h, h + 12
    for q in (chosen["qkv"][interleaved], chosen["qkv"][dkh], chosen["qkv"][:C]):
        assert trace({"q": [q]}, chosen, torch.float64, {"q": nh}).strided == ()
