"""`check_block`: every mistake in the zoo is diagnosed by its identifier, correct blocks pass.

The zoo (tests/zoo*.py) holds blocks written the ways learners write them, none inheriting from a
gptblock class; tests/test_check_zoo.py runs the larger zoo of real-world styles. The reference
and its search are tested in tests/test_check_search.py, the role mapping in
tests/test_check_roles.py, the child process in tests/test_check_isolation.py.
"""

import inspect
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
from gptblock.check import Finding, fill_common_arguments
from gptblock.check.mistakes.catalogue import MISTAKES
from gptblock.check.roles.trace import record


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


def test_the_zoos_cover_the_catalogue_and_combinations():
    import zoo_modern
    import zoo_realworld

    cases = zoo_realworld.cases() + zoo_modern.cases()  # the modern block's mistakes: zoo_modern
    assert set().union(*(set(c.expected) for c in cases)) == set(MISTAKES)
    diagnosed = [set(expected) for _, _, expected in zoo.ZOO.values()]
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
    assert "reference comparison" in names and report.confident  # PASS means compared


def test_the_default_target_of_the_cli_is_every_own_form():
    from gptblock.check import own_blocks

    assert own_blocks() == [lesson.Block, TransformerBlock, gptblock.FusedBlock]


def test_a_block_holding_q_k_v_in_one_3d_parameter_is_read_from_its_dataflow():
    report = check_block(zoo_torch.Opaque, n_embd=32, n_head=4)
    assert report.passed and report.compared and report.confident, str(report)
    assert any("q=w_qkv" in note and "read from the forward pass" in note for note in report.notes)
    post = check_block(zoo_torch.OpaquePostNorm, n_embd=32, n_head=4)
    assert post.diagnosis == ["post_norm"] and post.confident, str(post)


class _PostNormAttention(lesson.Block):
    def forward(self, x):
        x = self.ln1(x + self.sa(x))
        return x + self.ffwd(self.ln2(x))


class _PostNormMLP(lesson.Block):
    def forward(self, x):
        x = x + self.sa(self.ln1(x))
        return self.ln2(x + self.ffwd(x))


class _NormedThenOverwritten(lesson.Block):
    def forward(self, x):
        x = self.ln1(x)
        x = x + self.sa(x)
        return self.ffwd(self.ln2(x))


class _OverwrittenThenNormed(lesson.Block):
    def forward(self, x):
        x = self.ln2(self.sa(self.ln1(x)))
        return x + self.ffwd(x)


@pytest.mark.parametrize(
    "block, mistake",
    [(_PostNormAttention, "post_norm"), (_PostNormMLP, "post_norm"),
     (_NormedThenOverwritten, "no_residual"), (_OverwrittenThenNormed, "no_residual")],
)  # fmt: skip
def test_each_branch_wired_its_own_wrong_way_is_named(block, mistake):
    # (s90 unseen set: a learner's block half moved to pre-norm; s95: a CS224N layer's stream
    # normalised before its attention, its MLP's output returned) each FAILed naming none
    report = check_block(block, n_embd=32, n_head=4, block_size=16)
    assert report.diagnosis == [mistake] and report.confident, str(report)


def test_each_size_records_the_block_once_for_the_modern_and_the_lessons_reading(monkeypatch):
    from gptblock.check.isolation import worker

    recorded = []
    monkeypatch.setattr(
        worker, "record", lambda *a, **k: recorded.append(a[1].shape) or record(*a, **k)
    )
    report = check_block(lesson.Block, n_embd=16, n_head=2)
    assert report.passed and report.compared, str(report)
    assert len(recorded) == 2 == len(set(recorded)), recorded  # the file's size and another


def test_two_blocks_in_one_module_are_unverified_not_passed():
    stack = nn.Sequential(zoo_lesson.LessonBlock(16, 2, 16), zoo_lesson.LessonBlock(16, 2, 16))
    report = check_block(stack)
    assert report.verdict == "UNVERIFIED" and not report.passed and not report.confident
    assert any(
        "4 LayerNorms" in note and "--map ln1=NAME ln2=NAME" in note for note in report.notes
    )
    text = str(report)
    assert "result: UNVERIFIED" in text and "result: PASS" not in text


def test_unused_norm_is_a_shared_norm_and_fails_the_gradient_check():
    class UnusedNorm(zoo_lesson.LessonBlock):
        def forward(self, x):
            x = x + self.sa(self.ln1(x))
            return x + self.ffwd(self.ln1(x))  # ln2 never used

    report = check_block(UnusedNorm, n_embd=16, n_head=2, block_size=8)
    gradients = next(f for f in report.findings if f.name == "gradients")
    assert not gradients.passed and "ln2.weight" in gradients.message
    assert report.diagnosis == ["shared_norm"] and report.confident


def test_a_block_with_one_norm_shares_it():
    class OneNorm(zoo_lesson.LessonBlock):
        def __init__(self, n_embd, n_head, block_size):
            super().__init__(n_embd, n_head, block_size)
            del self.ln2

        def forward(self, x):
            x = x + self.sa(self.ln1(x))
            return x + self.ffwd(self.ln1(x))

    report = check_block(OneNorm, n_embd=16, n_head=2, block_size=8)
    assert report.diagnosis == ["shared_norm"] and report.confident, str(report)
    assert any("one LayerNorm for both branches" in note for note in report.notes)


def test_the_in_place_lesson_block_is_not_misdiagnosed_and_its_backward_failure_is_named():
    """x += self.sa(self.ln1(x)) computes the right forward pass, but ln1 saved x for backward:
    the checker's probes reuse nothing, so only the (real) backward failure is reported."""

    class InPlace(zoo_lesson.LessonBlock):
        def forward(self, x):
            x += self.sa(self.ln1(x))
            x += self.ffwd(self.ln2(x))
            return x

    report = check_block(InPlace, n_embd=16, n_head=2, block_size=8)
    failed = {f.name for f in report.findings if not f.passed}
    assert failed == {"gradients"}, str(report)
    assert report.diagnosis == ["inplace"]
    block = InPlace(16, 2, 8)  # what the diagnosis says, shown without the checker
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        block(torch.randn(2, 4, 16)).sum().backward()


# ----- the reference and its variants: tests/test_check_search.py --------------------------------


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
    with pytest.raises(ValueError, match=r"--arg n_head=3: n_embd=16 is not divisible by n_head=3"):
        check_block(lesson.Block, n_embd=16, n_head=3)  # refused before building
    with pytest.raises(TypeError, match="returned a str"):
        check_block(lambda: "not a block")


def test_a_block_on_the_meta_device_cannot_be_checked():
    with torch.device("meta"):
        block = TransformerBlock(16, 2)
    with pytest.raises(ValueError, match="meta device"):
        check_block(block)


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
    checks = [line for line in lines if line.startswith(("  PASS", "  FAIL", "  FOUND"))]
    assert checks == [
        f"  {f.status:<5} {f.name:<21} {f.message}" for f in report.findings
    ]  # one line per check
    comparison = report.findings[-1]  # a mistake found is not a failed check
    assert comparison.status == "FOUND" and comparison.message.startswith(
        "matches the lessons' block only with no_scaling + post_norm"
    )
    text = _flat(str(report))
    assert "diagnosis: no_scaling, post_norm" in text
    assert "x = x + self.sa(self.ln1(x))" in text  # the lesson line it deviates from
    assert "k.shape[-1] ** -0.5" in text
    data = json.loads(json.dumps(report.to_dict()))
    assert data["passed"] is False and data["diagnosis"] == ["no_scaling", "post_norm"]
    assert set(data["mistakes"]) == {"no_scaling", "post_norm"}
    assert data["mistakes"]["post_norm"]["fix"] == MISTAKES["post_norm"].fix
    assert {"name", "passed", "message", "label"} == set(data["findings"][0])
    assert data["verdict"] == "FAIL" and data["findings"][-1]["label"] == "FOUND"


def test_a_probes_diagnosis_the_comparison_did_not_match_is_not_confident():
    """(s57 public set, Falcon's heads mixed after its keys were repeated) the comparison ran and
    matched no catalogued variant: the causality probe's future_leak is true, but not all."""
    leak = Finding("causality", False, "position 0's output changes when position 1 changes")
    found = Finding("reference comparison", True, "matches ... only with future_leak", "FOUND")
    none = Finding("reference comparison", False, "computes neither the block nor any mistake")
    confirmed = CheckReport("B()", [leak, found], ["future_leak"], compared=True)
    unmatched = CheckReport("B()", [leak, none], ["future_leak"], compared=True)
    assert (confirmed.confident, unmatched.confident) == (True, False)
    assert "diagnosis: future_leak\n" in str(confirmed)
    said = (
        "diagnosis: future_leak (the comparison matched no catalogued mistake: there may be more)"
    )
    assert said in str(unmatched) and unmatched.to_dict()["confident"] is False


def test_report_refuses_unknown_mistake_ids():
    with pytest.raises(ValueError, match="unknown mistake ids"):
        CheckReport("x", [], ["typo"])


# ----- edge cases --------------------------------------------------------------------------------


def test_a_block_that_only_runs_in_float32_is_checked_in_float32_and_is_dtype_device():
    # (s99 unseen set) it PASSed: the catalogue's dtype_device, a hard-coded .float() that breaks
    # float64 checks and mixed precision, said only in a note
    class Float32Only(zoo_lesson.LessonBlock):
        def forward(self, x):
            return super().forward(x.float())  # breaks when the weights are float64

    report = check_block(Float32Only, n_embd=16, n_head=2, block_size=8)
    assert report.diagnosis == ["dtype_device"] and report.compared, str(report)
    assert any("checked in float32" in note for note in report.notes)
    said = "in float64: the block raised RuntimeError: mixed dtype (CPU): expect parameter to have"
    assert report.details["dtype_device"].startswith(said), str(report)


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
    stream = next(f for f in report.findings if f.name == "residual stream")  # its causes, all
    assert not stream.passed and "a branch with no norm before it" in stream.message, stream


def test_a_stream_changed_before_the_branches_add_to_it_is_among_the_causes():
    # (s97 unseen set) a block turning its own stream by position: the residual check's causes
    # were three the block did not have
    class TurnedStream(zoo_lesson.LessonBlock):
        def forward(self, x):
            return super().forward(
                x.roll(1, dims=-1) * torch.linspace(0.5, 1.5, x.shape[1])[:, None]
            )

    report = check_block(TurnedStream, n_embd=16, n_head=2, block_size=8)
    stream = next(f for f in report.findings if f.name == "residual stream")
    assert not stream.passed and "or changed itself before the branches add" in stream.message


def test_a_reports_one_line_repr_its_escaped_html_and_one_line_text():
    from gptblock.check.mistakes.report import Finding, one_line, text

    report = CheckReport("B()", [Finding("shape", True, "ok")], ["post_norm"])
    assert repr(report) == (
        "<CheckReport FAIL: B(), 1 of 1 checks passed, mistakes: post_norm (print it for the "
        "whole report)>"
    )
    page = CheckReport("<B>", [Finding("shape", False, "a < b")])._repr_html_()
    assert "FAIL" in page and "&lt;B&gt;" in page and "a &lt; b" in page and "<B>" not in page
    assert text("roles: q=wq\nresult: PASS") == "roles: q=wq result: PASS"
    assert (one_line(ValueError("bad value. ")), one_line(SystemExit(3))) == (
        "ValueError: bad value",
        "SystemExit: 3 (sys.exit(3) was called)",
    )


class _ReversedUnread(nn.Module):
    """nn.MultiheadAttention given the tril as its bool mask (True = may not attend), then a
    second Linear, so that its weights cannot be read: the black-box checks alone decide."""

    def __init__(self, n_embd=32, n_head=4, mask=True):
        super().__init__()
        self.ln1, self.ln2, self.mask = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd), mask
        self.mha = nn.MultiheadAttention(n_embd, n_head, batch_first=True)
        self.extra = nn.Linear(n_embd, n_embd)
        self.fc1, self.fc2 = nn.Linear(n_embd, 4 * n_embd), nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        T, h = x.shape[1], self.ln1(x)
        keep = torch.ones(T, T, dtype=torch.bool).tril() if self.mask else None
        x = x + self.extra(self.mha(h, h, h, attn_mask=keep, need_weights=False)[0])
        return x + self.fc2(torch.relu(self.fc1(self.ln2(x))))


def test_a_reversed_mask_is_named_by_the_causality_check_alone():
    # (s64 unseen set) was future_leak + nonfinite: no change moves a later output, so each
    # position sees later ones and never earlier ones; no mask at all stays future_leak
    report = check_block(_ReversedUnread)
    said = {f.name: f.message for f in report.findings}["causality"]
    assert not report.compared and report.diagnosis == ["mask_reversed"], str(report)
    assert said.endswith("and no change moves a later output"), said
    assert check_block(_ReversedUnread, mask=False).diagnosis == ["future_leak"]


class _NaNValueHead(lesson.Head):
    """v is NaN where the input's first channel is over 1.5: with the mask right, the NaN reaches
    earlier rows through their zero weights (0 * NaN)."""

    def forward(self, x):
        v = self.value(x) + torch.where(x[..., :1] > 1.5, float("nan"), 0.0)
        return self.attention_weights(x) @ v


class _NaNValueBlock(lesson.Block):
    def __init__(self, n_embd=32, n_head=4, block_size=16):
        super().__init__(n_embd, n_head, block_size, 0.0)
        for head in self.sa.heads:
            head.__class__ = _NaNValueHead


def test_a_nan_reaching_earlier_rows_through_zero_weights_is_no_leak():
    # (s69 unseen set: an RMSNorm of mean(x)) was future_leak beside the block's own mistake
    assert check_block(_NaNValueBlock).diagnosis == ["nonfinite"]


class _ExpSumHead(lesson.Head):
    """A lesson head whose softmax is exp(s) / sum(exp(s)): the row maximum not subtracted."""

    def attention_weights(self, x):
        T = x.shape[1]
        wei = self.query(x) @ self.key(x).transpose(-2, -1) * self.key.out_features**-0.5
        e = wei.masked_fill(self.tril[:T, :T] == 0, float("-inf")).exp()  # (B, T, T)
        return e / e.sum(-1, keepdim=True)


class _ExpSumBlock(lesson.Block):
    def __init__(self, n_embd=32, n_head=4, block_size=16):
        super().__init__(n_embd, n_head, block_size, 0.0)
        for head in self.sa.heads:
            head.__class__ = _ExpSumHead


def test_a_softmax_that_overflows_behind_the_norm_is_nonfinite():
    # (s85 unseen set) behind ln1 the scores stay small whatever the input: it PASSed
    report = check_block(_ExpSumBlock)
    assert report.diagnosis == ["nonfinite"], str(report)
    assert "finite outputs (large weights) with every weight times 30: inf/NaN" in str(report)


class _NoDiagonalHead(lesson.Head):
    def attention_weights(self, x):
        T = x.shape[1]
        wei = self.query(x) @ self.key(x).transpose(-2, -1) * self.key.out_features**-0.5
        blocked = torch.tril(self.tril[:T, :T], diagonal=-1) == 0  # its own position too
        return wei.masked_fill(blocked, float("-inf")).softmax(-1)  # row 0: all -inf, NaN


def test_a_mask_that_blocks_a_whole_row_is_nonfinite_and_the_advice_says_so():
    # (s91 unseen set) the advice spoke of softmax's maximum and LayerNorm's eps only
    block = lesson.Block(32, 4, 16, 0.0)
    for head in block.sa.heads:
        head.__class__ = _NoDiagonalHead
    report = check_block(block)
    assert report.diagnosis == ["nonfinite"], str(report)
    said = " ".join(str(report).split())
    assert "blocks a whole row (its diagonal too)" in said and "keeps the diagonal" in said, said


class _BookNorm(nn.Module):
    """A hand-written LayerNorm: it saves its input only where the input needs a gradient."""

    def __init__(self, n):
        super().__init__()
        self.scale, self.shift = nn.Parameter(torch.ones(n)), nn.Parameter(torch.zeros(n))

    def forward(self, x):
        mean, var = x.mean(-1, keepdim=True), x.var(-1, keepdim=True, unbiased=False)
        return self.scale * (x - mean) / torch.sqrt(var + 1e-5) + self.shift


class _InPlaceOnItsInput(lesson.Block):
    def __init__(self, n_embd=32, n_head=4, block_size=16):
        super().__init__(n_embd, n_head, block_size, 0.0)
        self.ln1, self.ln2 = _BookNorm(n_embd), _BookNorm(n_embd)

    def forward(self, x):
        x += self.sa(self.ln1(x))  # the block's own input, which ln1 saved for its gradient
        return x + self.ffwd(self.ln2(x))


def test_an_inplace_residual_on_the_input_behind_a_hand_written_norm_is_inplace():
    # (s73 unseen set) was FAIL "its gradient with respect to its input ... off by inf", no id:
    # the gradients check's input needed no gradient, as an embedding's output does
    report = check_block(_InPlaceOnItsInput)
    assert report.diagnosis == ["inplace"], str(report)
