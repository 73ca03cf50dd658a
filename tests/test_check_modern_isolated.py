"""A modern block's PASS in ``gptblock check`` (isolated) is confirmed by the checker's process.

The modern comparison is read in the checker's process from traces the block's process records
(``gptblock.check.serve.loop``); a PASS's parts (``gptblock.check.roles.plain``) are then held to the
weights the checker chose and to the block's outputs on fresh inputs
(``gptblock.check.compare.conditions.confirm``). A correct Llama block passes; a wrong block whose process
sends the traces of a correct twin (the chosen weights) or of a twin with weights made up, does
not.
"""

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch

from gptblock.check import check_isolated
from gptblock.check.roles.plain import receive

ZOO = pathlib.Path(__file__).parent / "zoo_modern" / "blocks"

FORGED = textwrap.dedent(
    f'''
    import copy
    import sys
    import torch
    sys.path.insert(0, {str(ZOO)!r})
    from hf_llama import LlamaDecoderLayer


    class Wrong(LlamaDecoderLayer):
        """Llama's block plus a positionwise term no modern block has."""

        def forward(self, hidden_states):
            return super().forward(hidden_states) + 0.05 * torch.tanh(hidden_states)


    def forge_traces(other):
        """The process's recorders (the request loop's) send traces of ``other(module)``
        instead of the block's."""
        for loop in [m for m in list(sys.modules.values()) if "drive_cache" in vars(m) and "record" in vars(m)]:
            honest = loop.record
            loop.record = lambda module, x, honest=honest, **kw: honest(other(module), x, **kw)


    def twin(module):
        """A correct block with the checked block's weights: the comparison read from its traces
        is a PASS, with the checker's values, but not this block's."""
        right = LlamaDecoderLayer().to(next(module.parameters()).dtype)
        right.load_state_dict(module.state_dict())
        return right


    def scaled(module):
        """The twin with q's weights made up (scaled)."""
        right = twin(module)
        with torch.no_grad():
            right.self_attn.q_proj.weight *= 2.0
        return right


    class Twin(Wrong):
        def __init__(self):
            super().__init__()
            forge_traces(twin)


    class Scaled(Wrong):
        def __init__(self):
            super().__init__()
            forge_traces(scaled)
    '''
)


def test_a_correct_llama_block_passes_isolated_from_the_cli():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    target = f"{ZOO / 'hf_llama.py'}:LlamaDecoderLayer"
    done = subprocess.run(
        [sys.executable, "-m", "gptblock", "check", target],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "result: PASS" in done.stdout
    assert "not confirmed outside it" not in done.stdout


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    path = tmp_path_factory.mktemp("modern_forged") / "forged.py"
    path.write_text(FORGED)
    targets = [f"{path}:{name}" for name in ("Wrong", "Twin", "Scaled")]
    return dict(
        zip(
            ("Wrong", "Twin", "Scaled"),
            check_isolated(targets, kwargs={}, roles={}, timeout=300),
            strict=True,
        )
    )


def test_the_wrong_block_fails_without_a_trick(reports):
    assert reports["Wrong"].verdict == "FAIL"


def test_a_pass_with_a_correct_twins_parts_fails_on_fresh_inputs(reports):
    report = reports["Twin"]
    assert report.verdict == "FAIL"
    failed = [f for f in report.findings if f.name == "reference comparison" and not f.passed]
    assert failed and "fresh" in failed[0].message


def test_a_pass_with_made_up_parts_is_not_verified(reports):
    report = reports["Scaled"]
    assert report.verdict == "UNVERIFIED"
    assert any("not confirmed outside it" in n for n in report.notes)


def test_parts_that_do_not_fit_are_refused():
    rms = {"kind": "rms", "eps": 1e-6}
    meta = {"C": 8, "D": 8, "K": 8, "H": 8, "ln1": rms, "ln2": rms, "n_head": 3,
            "activation": "silu", "gated": True, "parallel": False, "rope": None}  # fmt: skip
    w = torch.zeros(8, 8)
    tensors = {f"0.{r}.{p}": w if p == "weight" else w[0] for r in ("q", "k", "v", "proj", "mlp0", "mlp1", "mlp2") for p in ("weight", "bias")}  # fmt: skip
    tensors |= {"0.ln1.weight": w[0], "0.ln2.weight": w[0]}
    with pytest.raises(ValueError, match="do not fit together"):
        receive(meta, tensors, 8)  # 8 channels are not 3 heads
    with pytest.raises(ValueError, match="do not fit together"):
        receive(
            {**meta, "n_head": 2}, {**tensors, "0.q.weight": w[0]}, 8
        )  # a matrix sent as a vector
    assert receive({**meta, "n_head": 2}, tensors, 8).n_head == 2
