"""A parallel residual in a block the lessons' reading takes (one core per head) is the one
reference's parallel wiring: PASS, saying so, not a FAIL that no catalogued mistake explains (as
energy_gpt's ``Block_parallel`` got, s17 unseen set); mistakes in such a block are still found."""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import parallel_blocks as blocks
from gptblock.check import check_block, check_isolated

SIZES = {"n_embd": 32, "n_head": 4, "block_size": 16, "dropout": 0.0}


@pytest.mark.parametrize("name", ["Parallel", "OneNorm", "NanoParallel"])
def test_a_parallel_residual_passes_as_the_references_parallel_wiring(name):
    sizes = {"n_embd": 32, "n_head": 4, "bias": True} if name == "NanoParallel" else SIZES
    report = check_block(getattr(blocks, name), **sizes)
    assert report.verdict == "PASS", report.format()
    compared = next(f for f in report.findings if f.name == "reference comparison")
    assert "the lessons' block with a parallel residual" in compared.message, report.format()


@pytest.mark.parametrize(
    ("name", "diagnosis"),
    [
        ("Unscaled", ["no_scaling"]),
        ("Unmasked", ["future_leak", "no_scaling"]),
        ("NormedStream", ["no_residual"]),
        ("NoStream", ["no_residual"]),
    ],
)
def test_mistakes_in_a_parallel_block_are_diagnosed(name, diagnosis):
    report = check_block(getattr(blocks, name), **SIZES)
    assert report.verdict == "FAIL" and sorted(report.diagnosis) == diagnosis, report.format()


def test_through_the_cli_too():
    """The reading crosses the process boundary as data: its ``parallel`` with it."""
    (report,) = check_isolated([f"{blocks.__file__}:Parallel"], kwargs=SIZES, roles={})
    assert report.verdict == "PASS", str(report)
