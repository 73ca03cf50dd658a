"""The modern forms the checker's process rebuilds, and the input gradient it holds them to.

GPT-J's block (one LayerNorm read by both branches, in parallel) and nanochat's (rotary
positions turned by minus the angle) are confirmed in ``gptblock check`` as Llama's are
(``tests/test_check_modern_isolated.py``): their parts are read here from the traces the
block's process sends, and confirmed on fresh inputs. Forged traces still do not pass, and a
block whose outputs are right but whose backward pass is not (a custom autograd ``Function``, a
``.detach()``) is a failed comparison, in process and isolated.
"""

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch

from gptblock.check import check_block, check_isolated
from gptblock.check.roles.plain import receive

ZOO = pathlib.Path(__file__).parent / "zoo_modern" / "blocks"
sys.path.insert(0, str(ZOO))

from hf_llama import LlamaDecoderLayer  # noqa: E402


@pytest.mark.parametrize(
    ("style", "name", "args"),
    [("gptj", "GPTJBlock", []), ("nanochat", "Block", ["--arg", "n_kv_head=2"])],
)
def test_gptj_and_nanochat_pass_isolated_from_the_cli(style, name, args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run(
        [sys.executable, "-m", "gptblock", "check", f"{ZOO / style}.py:{name}", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "result: PASS" in done.stdout
    assert "not confirmed outside it" not in done.stdout


FORGED = textwrap.dedent(
    f'''
    import copy
    import sys
    import torch
    sys.path.insert(0, {str(ZOO)!r})
    from gptj import GPTJBlock
    from nanochat import Block


    def forge_traces(other):
        """The process's recorders (the request loop's) send traces of ``other(module)``
        instead of the block's."""
        for loop in [m for m in list(sys.modules.values()) if "drive_cache" in vars(m) and "record" in vars(m)]:
            honest = loop.record
            loop.record = lambda module, x, honest=honest, **kw: honest(other(module), x, **kw)


    def twin(module):
        """A correct GPT-J block with the checked block's weights."""
        right = GPTJBlock().to(next(module.parameters()).dtype)
        right.load_state_dict(module.state_dict())
        return right


    def biased(module):  # a LayerNorm's bias made up
        right = twin(module)
        with torch.no_grad():
            right.ln_1.bias *= 1.5
        return right


    class TwoNorms(GPTJBlock):
        """GPT-J's block with a second norm, a copy of the first, before the MLP."""

        def forward(self, hidden_states):
            position_ids = torch.arange(hidden_states.shape[1])[None]
            attn = self.attn(self.ln_1(hidden_states), position_ids)
            return attn + self.mlp(self.ln_2(hidden_states)) + hidden_states


    def two_norms(module):  # GPT-J's one norm made two
        right = copy.deepcopy(module)
        right.ln_2 = copy.deepcopy(right.ln_1)
        right.__class__ = TwoNorms
        return right


    def turned(module):  # nanochat's direction made the usual one
        right = copy.deepcopy(module)
        with torch.no_grad():
            right.sin.neg_()
        return right


    class WrongJ(GPTJBlock):
        """GPT-J's block plus a positionwise term no modern block has."""

        def forward(self, hidden_states):
            return super().forward(hidden_states) + 0.05 * torch.tanh(hidden_states)


    class TwinJ(WrongJ):
        def __init__(self):
            super().__init__()
            forge_traces(twin)


    class BiasedJ(GPTJBlock):
        def __init__(self):
            super().__init__()
            forge_traces(biased)


    class TwoNormsJ(GPTJBlock):
        def __init__(self):
            super().__init__()
            forge_traces(two_norms)


    class Turned(Block):
        def __init__(self):
            super().__init__(n_kv_head=2)
            forge_traces(turned)
    '''
)
NAMES = ("WrongJ", "TwinJ", "BiasedJ", "TwoNormsJ", "Turned")


@pytest.fixture(scope="module")
def forged(tmp_path_factory):
    path = tmp_path_factory.mktemp("modern_forms") / "forged.py"
    path.write_text(FORGED)
    targets = [f"{path}:{name}" for name in NAMES]
    reports = check_isolated(targets, kwargs={}, roles={}, timeout=300)
    return dict(zip(NAMES, reports, strict=True))


@pytest.mark.parametrize("name", ["WrongJ", "TwinJ"])
def test_a_forged_gptj_pass_fails(forged, name):
    """A wrong GPT-J with a correct twin's traces does not reproduce the block on fresh
    inputs."""
    report = forged[name]
    assert report.verdict == "FAIL", str(report)
    failed = [f for f in forged[name].findings if f.name == "reference comparison"]
    assert failed and not failed[0].passed
    if name != "WrongJ":  # the parts reproduce the block only where its process ran them
        assert "fresh" in failed[0].message


def test_forged_traces_do_not_pass(forged):
    """nanochat's traces with its rotation turned the usual way, a bias scaled by 1.5 (refused
    when an entry is no value the checker chose, failing on fresh inputs when each lands near
    one: the chosen values are dense), GPT-J's one norm traced as two: none passes."""
    biased = forged["BiasedJ"]
    assert biased.verdict in ("FAIL", "UNVERIFIED"), str(biased)
    assert biased.verdict == "FAIL" or any("not confirmed outside it" in n for n in biased.notes)
    for name in ("Turned", "TwoNormsJ"):
        assert forged[name].verdict in ("FAIL", "UNVERIFIED"), str(forged[name])


def test_a_shared_norm_or_a_direction_out_of_range_is_refused():
    layer = {"kind": "layer", "eps": 1e-5}
    meta = {"C": 8, "D": 8, "K": 8, "H": 8, "ln1": layer, "ln2": None, "n_head": 2,
            "activation": "gelu", "gated": False, "parallel": True,
            "rope": [10000.0, 4, "adjacent", -1.0]}  # fmt: skip
    w = torch.zeros(8, 8)
    tensors = {f"0.{r}.{p}": w if p == "weight" else w[0] for r in ("q", "k", "v", "proj", "mlp0", "mlp2") for p in ("weight", "bias")}  # fmt: skip
    tensors |= {"0.ln1.weight": w[0], "0.ln1.bias": w[0]}
    parts = receive(meta, tensors, 8)
    assert "ln2" not in parts.norms and parts.rope is not None and parts.rope.sign == -1.0
    with pytest.raises(ValueError, match="do not describe a block"):
        receive({**meta, "parallel": False}, tensors, 8)  # one norm for both: not pre-norm
    with pytest.raises(ValueError, match="not one the checker knows"):
        receive({**meta, "rope": [10000.0, 4, "adjacent", 0.5]}, tensors, 8)
    with pytest.raises(ValueError, match=r"ln2\.weight: .* got nothing"):
        receive({**meta, "ln2": layer}, tensors, 8)  # ln2 missing
    # the one check of a part that arrives (receive.decode), as a lessons' reading's
    with pytest.raises(ValueError, match=r"ln1\.bias: .* got nothing"):  # a LayerNorm's bias
        receive(meta, {k: t for k, t in tensors.items() if k != "0.ln1.bias"}, 8)
    with pytest.raises(ValueError, match=r"eps -1\.0 is not in"):
        receive({**meta, "ln1": {**layer, "eps": -1.0}}, tensors, 8)
    with pytest.raises(ValueError, match="finite"):
        receive(meta, {**tensors, "0.mlp2.bias": torch.full((8,), float("nan"))}, 8)
    with pytest.raises(ValueError, match="width 8"):
        receive({**meta, "C": 16}, tensors, 8)


class _Half(torch.autograd.Function):
    """The identity forward; half the gradient backward."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return 0.5 * g


class HalfBackward(LlamaDecoderLayer):
    def forward(self, hidden_states):
        return _Half.apply(super().forward(hidden_states))


class DetachedAttention(LlamaDecoderLayer):
    """The attention branch reads a detached input: the outputs and every parameter's gradient
    are there, the input gradient misses the attention's part."""

    def __init__(self):
        super().__init__()
        self.input_layernorm.register_forward_pre_hook(_detached)


def _detached(module, args):
    return (args[0].detach(),)


@pytest.mark.parametrize("cls", [HalfBackward, DetachedAttention])
def test_a_wrong_backward_pass_does_not_pass(cls):
    assert check_block(LlamaDecoderLayer).verdict == "PASS"  # the forward both keep
    report = check_block(cls)
    assert report.verdict == "FAIL", str(report)
    failed = [f for f in report.findings if f.name == "reference comparison"]
    assert "gradient with respect to its input" in failed[0].message


def test_a_wrong_backward_pass_does_not_pass_isolated(tmp_path):
    path = tmp_path / "backward.py"
    path.write_text(
        f"import sys\nsys.path.insert(0, {str(pathlib.Path(__file__).parent)!r})\n"
        "from test_check_modern_confirm import DetachedAttention\n"
    )
    (report,) = check_isolated([f"{path}:DetachedAttention"], kwargs={}, roles={}, timeout=300)
    assert report.verdict == "FAIL", str(report)
