"""The zoo of real-world styles (tests/zoo_realworld): the checker's measured hit rate.

Every style's correct block must pass; no diagnosis may be wrong and stated with confidence, no
mistaken block may pass; over the whole zoo at least 95% of the mistaken blocks must be diagnosed
exactly (the injected mistakes, no more, no fewer, confidently), and a block the checker leaves
UNVERIFIED must come with a ``--map`` that, passed back, diagnoses it exactly. ``python tests/zoo_realworld/hitrate.py`` prints the
same numbers as a table (the README quotes it).
"""

import functools
import inspect

import pytest

import zoo_modern
import zoo_realworld
from gptblock import check_block
from gptblock.check.mistakes.catalogue import MISTAKES

# The zoo in two shards of about equal size (by cases), each its own xdist group, so that
# `pytest -n 2` checks them on both cores; each shard meets the targets on its own.
SHARDS = (0, 1)


@functools.cache
def _shard_of() -> dict[str, int]:
    sizes = [0 for _ in SHARDS]
    shard = {}
    for style in sorted(zoo_realworld.STYLES, key=lambda s: -len(_cases(s))):
        shard[style.name] = sizes.index(min(sizes))
        sizes[shard[style.name]] += len(_cases(style))
    return shard


def _cases(style):
    return [case for case in zoo_realworld.cases() if case.style is style]


@functools.cache
def _outcomes(shard):
    return {
        case.name: zoo_realworld.outcome(case.name)
        for case in zoo_realworld.cases()
        if _shard_of()[case.style.name] == shard
    }


def _in_shard(shard):
    return pytest.mark.xdist_group(f"zoo-realworld-{shard}")


by_shard = pytest.mark.parametrize("shard", [pytest.param(k, marks=_in_shard(k)) for k in SHARDS])


@pytest.mark.parametrize(
    "style",
    [pytest.param(s, marks=_in_shard(_shard_of()[s.name])) for s in zoo_realworld.STYLES],
    ids=lambda s: s.name,
)
def test_each_style_passes_when_correct_and_is_never_confidently_wrong(style):
    outcomes = _outcomes(_shard_of()[style.name])
    results = [outcomes[case.name] for case in _cases(style)]
    correct = [(o, r) for o, r in results if not o.case.expected]
    assert len(correct) == 1 and correct[0][0].verdict == "pass", str(correct[0][1])
    wrong = [f"{o.case.name}: {o.diagnosis}\n{r}" for o, r in results if o.verdict == "wrong"]
    assert not wrong, "\n\n".join(wrong)


@by_shard
def test_the_zoo_meets_the_hit_rate_targets(shard):
    outcomes = [o for o, _ in _outcomes(shard).values()]
    correct = [o for o in outcomes if not o.case.expected]
    mistaken = [o for o in outcomes if o.case.expected]
    exact = sum(o.verdict == "exact" for o in mistaken) / len(mistaken)
    assert all(o.verdict == "pass" for o in correct)  # 100% of correct blocks pass
    assert exact >= 0.95, exact
    assert sum(o.verdict == "wrong" for o in outcomes) == 0
    assert sum(o.verdict == "false pass" for o in outcomes) == 0  # PASS means compared


@by_shard
def test_every_unverified_block_says_which_map_verifies_it_and_that_map_does(shard):
    from gptblock.check.building.target import parse_role

    for outcome, report in _outcomes(shard).values():
        if outcome.verdict != "unverified":
            continue
        assert report.verify.startswith("--map "), str(report)
        roles = dict(parse_role(a) for a in report.verify.split()[1:])
        again = check_block(outcome.case.build(), roles=roles)
        assert set(again.diagnosis) == set(outcome.case.expected) and again.confident, str(again)


@by_shard
def test_the_comparison_is_exact_to_float64_rounding(shard):
    """Every block that computes in float64 is reproduced to float64 rounding (the measured worst
    is 8.5e-16); those that round to float32 themselves (a softmax in float32, an output cast to
    float32) to float32 rounding: 1e-5 absolute on outputs of size ~10 (hf-proj/wrong_scale:sqrt
    measured 5.7e-7 to 1.1e-6 from run to run, its inputs drawn afresh each time)."""
    import re

    for outcome, report in _outcomes(shard).values():
        if outcome.verdict not in ("pass", "exact") or not report.compared:
            continue
        message = next(f.message for f in report.findings if f.name == "reference comparison")
        error = float(re.search(r"max error ([0-9.e+-]+)", message).group(1))
        float32 = "dtype_device" in outcome.case.expected or outcome.case.style.name == "hf-proj"
        assert error < (1e-5 if float32 else 1e-14), (outcome.case.name, error)


def test_the_zoo_is_large_and_covers_the_sources_the_issue_names():
    styles = zoo_realworld.STYLES
    assert len(styles) >= 30
    sources = " ".join(s.source for s in styles).lower()
    for source in (
        "lecture",
        "nanogpt",
        "mingpt",
        "gpt-2",
        "annotated",
        "multiheadattention",
        "einsum",
        "chunk",
        "sequential",
        "bias=false",
        "tanh",
    ):
        assert source in sources, source
    cases = zoo_realworld.cases()
    assert sum(len(c.bugs) >= 2 for c in cases) >= 60  # pairs and triples
    covered = set().union(*(c.expected for c in cases))
    modern = set().union(*(c.expected for c in zoo_modern.cases()))  # the modern block's
    assert covered | modern == set(MISTAKES)


def test_zoo_blocks_are_the_zoos_own():
    for module in zoo_realworld.MODULES:
        classes = [obj for obj in vars(module).values() if inspect.isclass(obj)]
        for cls in classes:
            assert all(not base.__module__.startswith("gptblock") for base in cls.__mro__), cls


def test_each_injected_bug_changes_what_the_block_computes():
    """A bug that changed nothing would be a stub counted as a hit: every mistaken block's
    output differs from its correct block's (same weights, norms and biases moved off their
    initial 1 and 0 as a trained block's are, eval mode)."""
    import torch

    from gptblock.check.serve.subject import one_thread

    with one_thread():  # tiny tensors: more threads only add synchronisation
        _each_bug_changes_the_block(torch)


def _each_bug_changes_the_block(torch):
    for style in zoo_realworld.STYLES:
        torch.manual_seed(0)
        right = style.factory(**style.kwargs).eval()
        with torch.no_grad():
            for p in right.parameters():
                if p.dim() == 1:
                    p.add_(0.1 * torch.randn_like(p))
        for bug in style.bugs:
            if bug.split(":")[0] in (
                "dropout_in_eval", "inplace", "shape", "dtype_device", "unused_parameters"
            ):  # fmt: skip
                continue  # these change randomness, the backward pass or the output's type, or
                # add a parameter that never acts (the output is the same by design)
            torch.manual_seed(0)
            wrong = style.factory(**style.kwargs, bugs=frozenset({bug})).eval()
            wrong.load_state_dict(right.state_dict())
            x = torch.randn(5, 5, _width(style))  # B == T: a batch_first=False block runs
            with torch.no_grad():
                a, b = right(x.clone()), wrong(x.clone())
            assert a.shape != b.shape or not torch.allclose(a, b, atol=1e-6, equal_nan=True), (
                style.name, bug,
            )  # fmt: skip


def _width(style):
    for key in ("n_embd", "d_model", "embed_dim", "dim", "hidden_size"):
        if key in style.kwargs:
            return style.kwargs[key]
    return style.kwargs["config"].n_embd
