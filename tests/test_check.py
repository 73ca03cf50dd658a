"""`check_block`: every mistake in the zoo is diagnosed by its identifier, correct blocks pass.

The zoo (tests/zoo*.py) holds blocks written the ways learners write them, none inheriting from a
gptblock class. The reference the checker compares with is itself checked here against the
lesson's Block, TransformerBlock and nn.TransformerEncoderLayer in float64.
"""

import inspect
import itertools
import json

import pytest
import torch
import torch.nn as nn

import gptblock
import zoo
import zoo_lesson
import zoo_torch
from forms import FORMS
from gptblock import CheckReport, TransformerBlock, check_block, lesson
from gptblock.check import fill_common_arguments
from gptblock.check.catalogue import MISTAKES
from gptblock.check.mapping import MappedBlock, Unmapped, map_parameters
from gptblock.check.steps import CANDIDATE_ACTIVATIONS, CORRECT, run_steps
from gptblock.check.variants import TOLERANCE, compose, distance, explain, variants


def _flat(text):
    """``text`` with the report's line wrapping (and any run of spaces) undone."""
    return " ".join(text.split())


# ----- the zoo: each mistake diagnosed by its identifier ----------------------------------------


@pytest.mark.parametrize("name", list(zoo.ZOO))
def test_zoo_block_is_diagnosed(name):
    factory, kwargs, expected = zoo.ZOO[name]
    report = check_block(factory, **kwargs)
    assert sorted(report.diagnosis) == sorted(expected), str(report)
    assert not report.passed
    text = _flat(str(report))
    for mistake in report.diagnosis:
        assert report.details[mistake], mistake  # what exactly this block does
        assert _flat(MISTAKES[mistake].fix) in text and _flat(MISTAKES[mistake].lesson) in text


def test_zoo_covers_the_catalogue_and_combinations():
    diagnosed = [set(expected) for _, _, expected in zoo.ZOO.values()]
    assert set().union(*diagnosed) == set(MISTAKES)
    assert sum(len(d) >= 2 for d in diagnosed) >= 5
    assert any(len(d) == 3 for d in diagnosed)


@pytest.mark.parametrize("module", [zoo_lesson, zoo_torch])
def test_zoo_blocks_do_not_inherit_from_gptblock(module):
    classes = [obj for obj in vars(module).values() if inspect.isclass(obj)]
    assert len(classes) > 5
    for cls in classes:
        for base in cls.__mro__:
            assert not base.__module__.startswith("gptblock"), (cls, base)


# ----- no false alarms ---------------------------------------------------------------------------


def _correct_blocks():
    blocks = {f"gptblock-{name}": make for name, make in FORMS.items()}
    blocks["gptblock-mha-relu-nobias"] = lambda C, nh, p: TransformerBlock(
        C, nh, dropout=p, activation="relu", bias=False
    )
    blocks.update({f"zoo-{name}": make for name, make in zoo.CORRECT.items()})
    return blocks


CORRECT_BLOCKS = _correct_blocks()
SIZES = [(16, 2, 0.1), (24, 3, 0.2), (32, 8, 0.1)]


@pytest.mark.parametrize("size", SIZES, ids=[f"C{c}-nh{nh}-p{p}" for c, nh, p in SIZES])
@pytest.mark.parametrize("name", list(CORRECT_BLOCKS))
def test_correct_block_passes_with_empty_diagnosis(name, size):
    C, nh, p = size
    torch.manual_seed(C + nh)
    report = check_block(CORRECT_BLOCKS[name](C, nh, p))
    assert report.passed, str(report)
    assert report.diagnosis == []
    assert all(f.passed for f in report.findings)
    names = [f.name for f in report.findings]
    assert names[:7] == [
        "shape", "eval determinism", "causality", "batch independence",
        "residual stream", "finite outputs", "gradients",
    ]  # fmt: skip
    mapped = not name.startswith("zoo-opaque")
    assert ("reference comparison" in names) == mapped


def test_the_default_target_of_the_cli_is_every_own_form():
    from gptblock.check import own_blocks

    assert own_blocks() == [lesson.Block, TransformerBlock, gptblock.FusedBlock]


def test_unmappable_correct_block_passes_on_black_box_evidence():
    report = check_block(zoo_torch.Opaque, n_embd=32, n_head=4)
    assert report.passed
    assert any("cannot be mapped" in note for note in report.notes)


def test_unmappable_post_norm_fails_the_residual_check_without_a_guess():
    report = check_block(zoo_torch.OpaquePostNorm, n_embd=32, n_head=4)
    residual = next(f for f in report.findings if f.name == "residual stream")
    assert not residual.passed and "post_norm" in residual.message
    assert not report.passed
    assert report.diagnosis == []  # the probes cannot tell post_norm from no_residual


def test_two_blocks_in_one_module_are_not_mapped():
    stack = nn.Sequential(zoo_lesson.LessonBlock(16, 2, 16), zoo_lesson.LessonBlock(16, 2, 16))
    report = check_block(stack)
    assert report.passed
    assert any("names of 2 blocks" in note for note in report.notes)


def test_unused_parameter_fails_the_gradient_check():
    class UnusedNorm(zoo_lesson.LessonBlock):
        def forward(self, x):
            x = x + self.sa(self.ln1(x))
            return x + self.ffwd(self.ln1(x))  # ln2 never used

    report = check_block(UnusedNorm, n_embd=16, n_head=2, block_size=8)
    gradients = next(f for f in report.findings if f.name == "gradients")
    assert not gradients.passed and "ln2.weight" in gradients.message
    assert not report.passed


# ----- the reference and its variants -----------------------------------------------------------


def _mapped(module):
    mapped = map_parameters(module)
    assert isinstance(mapped, MappedBlock), mapped
    return mapped


@pytest.mark.parametrize("form", ["lesson", "mha", "encoder_layer"])
def test_reference_computes_the_blocks_function(form):
    torch.manual_seed(0)
    C, nh, T = 16, 2, 5
    if form == "lesson":
        block, act = lesson.Block(C, nh, 8), "relu"
        call = block
    elif form == "mha":
        block, act = TransformerBlock(C, nh), "gelu"
        call = block
    else:
        block, act = (
            nn.TransformerEncoderLayer(
                C, nh, 4 * C, 0.0, "gelu", batch_first=True, norm_first=True
            ),
            "gelu",
        )

        def call(x):
            return block(x, src_mask=gptblock.causal_mask(x.shape[1]), is_causal=True)

    for p in block.parameters():  # non-trivial norms and biases, so every weight matters
        p.data += 0.1 * torch.randn_like(p)
    block = block.double().eval()
    x = torch.randn(3, T, C, dtype=torch.float64)
    mapped = _mapped(block)
    ours = run_steps(mapped.params, x, nh, CANDIDATE_ACTIVATIONS[act], CORRECT)
    with torch.no_grad():
        theirs = call(x)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-10)


def test_gpt2_conv1d_and_nanogpt_linear_layouts_read_the_same_weights():
    torch.manual_seed(0)
    nano = zoo_torch.NanoBlock(16, 2, 8)
    gpt2 = zoo_torch.Gpt2Block(16, 2, 8)
    with torch.no_grad():  # copy nanoGPT's (out, in) weights into Conv1D's (in, out)
        for name, p in gpt2.named_parameters():
            q = dict(nano.named_parameters())[name]
            p.copy_(q.t() if p.dim() == 2 else q)
    a, b = _mapped(nano).params, _mapped(gpt2).params
    for field in ("wq", "wk", "wv", "wo", "w1", "w2", "bq", "b1"):
        assert torch.equal(getattr(a, field), getattr(b, field)), field


def test_wrapped_layer_is_found_under_its_prefix():
    mapped = _mapped(zoo_torch.Wrapped(16, 2))
    assert mapped.prefix == "layer." and mapped.heads == (2,) and mapped.ignored == ()


def test_head_count_is_searched_when_no_attribute_names_it():
    torch.manual_seed(0)
    block = zoo_torch.NanoBlock(16, 4, 8).double().eval()
    mapped = _mapped(block)
    assert mapped.heads == (4,)  # from attn.n_head
    del block.attn.n_head
    assert _mapped(block).heads == (1, 2, 4, 8, 16)
    block.attn.n_head = 4
    x = torch.randn(5, 5, 16, dtype=torch.float64)
    with torch.no_grad():
        y = block(x)
    found = explain(mapped.params, x, y, (1, 2, 4, 8, 16), max_size=1)
    assert found.match is not None
    assert (
        found.match.deviations == ()
        and found.match.n_head == 4
        and found.match.activation == "gelu"
    )


def test_names_of_no_known_block_are_reported():
    assert isinstance(map_parameters(nn.Linear(4, 4)), Unmapped)


def test_variants_with_different_diagnoses_are_far_apart():
    """The comparison's tolerance is far below the gap between any two diagnoses."""
    for block, nh in ((TransformerBlock(16, 2), 2), (lesson.Block(32, 4, 8), 4)):
        params = _mapped(block).params
        x = torch.randn(6, 6, params.C, dtype=torch.float64)
        outputs = [
            (
                sorted(d.mistake for d in deviations),
                run_steps(params, x, nh, act, compose(deviations)),
            )
            for deviations in variants(1)
            for act in CANDIDATE_ACTIVATIONS.values()
        ]
        gaps = [
            min(distance(ya, yb), distance(yb, ya))
            for (da, ya), (db, yb) in itertools.combinations(outputs, 2)
            if da != db
        ]
        assert min(gaps) > 100 * TOLERANCE


def test_variants_are_smallest_first_with_one_deviation_per_group():
    sizes = [len(v) for v in variants(3)]
    assert sizes == sorted(sizes) and sizes[0] == 0 and max(sizes) == 3
    for v in variants(3):
        groups = [d.group for d in v]
        assert len(groups) == len(set(groups))


# ----- the target is left alone; errors -----------------------------------------------------------


@pytest.mark.parametrize("make", [zoo_lesson.LessonPostNorm, zoo_lesson.LessonDropoutInEval])
def test_check_leaves_the_module_the_rng_and_the_threads_alone(make):
    block = make(16, 2, 8, dropout=0.3).train()
    state = {k: v.clone() for k, v in block.state_dict().items()}
    rng, threads = torch.get_rng_state(), torch.get_num_threads()
    assert not check_block(block).passed
    assert block.training and next(block.parameters()).dtype == torch.float32
    assert all(torch.equal(state[k], v) for k, v in block.state_dict().items())
    assert all(p.grad is None for p in block.parameters())
    assert torch.equal(torch.get_rng_state(), rng) and torch.get_num_threads() == threads


def test_a_class_is_built_reproducibly():
    a = check_block(zoo_lesson.LessonNoScaling, n_embd=16, n_head=2, block_size=8)
    b = check_block(zoo_lesson.LessonNoScaling, n_embd=16, n_head=2, block_size=8)
    assert a.to_dict() == b.to_dict()


def test_bad_targets_raise_clear_errors():
    with pytest.raises(TypeError, match="already a module"):
        check_block(TransformerBlock(16, 2), d_model=16)
    with pytest.raises(TypeError, match=r"nn\.Module or a class"):
        check_block(42)
    with pytest.raises(ValueError, match=r"cannot build Block\(.*n_head=3.*not divisible"):
        check_block(lesson.Block, n_embd=16, n_head=3)
    with pytest.raises(TypeError, match="returned a str"):
        check_block(lambda: "not a block")


def test_common_arguments_are_filled_only_where_taken_and_never_override():
    assert fill_common_arguments(TransformerBlock, {"n_heads": 2}) == {
        "n_heads": 2, "d_model": 32, "dropout": 0.1,
    }  # fmt: skip
    assert fill_common_arguments(lambda width: None, {}) == {}


# ----- the report ------------------------------------------------------------------------------


def test_report_renders_as_text_and_json():
    report = check_block(zoo_lesson.LessonPostNormNoScaling, n_embd=16, n_head=2, block_size=8)
    assert isinstance(report, CheckReport)
    lines = str(report).splitlines()
    checks = [line for line in lines if line.startswith(("  PASS", "  FAIL"))]
    assert checks == [
        f"  {'PASS' if f.passed else 'FAIL'}  {f.name:<21} {f.message}" for f in report.findings
    ]  # one line per check
    text = _flat(str(report))
    assert "diagnosis: no_scaling, post_norm" in text
    assert "x = x + self.sa(self.ln1(x))" in text  # the lesson line it deviates from
    assert "k.shape[-1] ** -0.5" in text
    data = json.loads(json.dumps(report.to_dict()))
    assert data["passed"] is False and data["diagnosis"] == ["no_scaling", "post_norm"]
    assert set(data["mistakes"]) == {"no_scaling", "post_norm"}
    assert data["mistakes"]["post_norm"]["fix"] == MISTAKES["post_norm"].fix
    assert {"name", "passed", "message"} == set(data["findings"][0])


def test_report_refuses_unknown_mistake_ids():
    with pytest.raises(ValueError, match="unknown mistake ids"):
        CheckReport("x", [], ["typo"])


# ----- edge cases --------------------------------------------------------------------------------


def test_a_block_that_only_runs_in_float32_is_checked_in_float32():
    class Float32Only(zoo_lesson.LessonBlock):
        def forward(self, x):
            return super().forward(x.float())  # breaks when the weights are float64

    report = check_block(Float32Only, n_embd=16, n_head=2, block_size=8)
    assert report.passed, str(report)
    assert any("checked in float32" in note for note in report.notes)


def test_the_closer_gelu_is_named():
    report = check_block(zoo_torch.Gpt2Block, n_embd=16, n_head=2, block_size=8)
    comparison = next(f for f in report.findings if f.name == "reference comparison")
    assert report.passed and "gelu_tanh" in comparison.message


def test_a_short_block_size_limits_the_probes():
    report = check_block(lesson.Block, n_embd=16, n_head=2, block_size=3)
    assert report.passed, str(report)
    assert "(3, 3, 16) -> (3, 3, 16)" in report.findings[0].message


def test_a_probe_that_raises_fails_that_check_only():
    class TooBig(zoo_lesson.LessonBlock):
        def forward(self, x):
            if x.abs().max() > 1e3:
                raise ValueError("input too large\nsecond line")
            return super().forward(x)

    report = check_block(TooBig, n_embd=16, n_head=2, block_size=8)
    failed = {f.name: f.message for f in report.findings if not f.passed}
    assert set(failed) == {"residual stream", "finite outputs"}
    assert all(m == "the block raised ValueError: input too large" for m in failed.values())
    assert report.diagnosis == []


def test_a_mistake_outside_the_catalogue_is_not_forced_into_it():
    class NoNormBeforeAttention(zoo_lesson.LessonBlock):
        def forward(self, x):
            x = x + self.sa(x)  # ln1 forgotten: not a catalogued mistake
            return x + self.ffwd(self.ln2(x))

    report = check_block(NoNormBeforeAttention, n_embd=16, n_head=2, block_size=8)
    comparison = next(f for f in report.findings if f.name == "reference comparison")
    assert not comparison.passed and "no variant" in comparison.message
    assert "closest" in comparison.message
    assert not report.passed
