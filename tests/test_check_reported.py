"""The eight code shapes issue 18 reported (tests/zoo_realworld/reported.py): each correct one is
gptblock's block with its weights, and the checker now reads each of them.

Each style's ``WEIGHTS`` below maps its block's weights to the lessons' roles by hand, (out, in),
as a reader of that code would; ``zoo_public.proof.reference`` loads them into
``gptblock.blocks.mha.TransformerBlock`` and the two must agree to float64 rounding, with every weight
drawn afresh (norm gains off 1) so that a weight read from the wrong place would show. The
checker's own diagnosis of every case is measured in tests/test_check_zoo.py with the rest of
the zoo; here each shape also gets the reading its report names.
"""

from types import SimpleNamespace

import pytest
import torch

import zoo_realworld
from gptblock import check_block
from gptblock.errors import UserValueError
from zoo_public.proof import max_error, randomised
from zoo_realworld import reported

C, NH = 32, 4
HS = C // NH


def _ln(m, g="weight", b="bias"):
    return getattr(m, g), getattr(m, b)


def _thirds(w, b):
    """q, k, v of a projection packed in thirds, each (weight, bias)."""
    return list(zip(w.chunk(3), b.chunk(3) if b is not None else (None,) * 3, strict=True))


def _conv(block):
    squeeze = lambda conv: (conv.weight[..., 0], conv.bias)  # noqa: E731  (out, in, 1)
    q, k, v = _thirds(*squeeze(block.qkv))
    return {
        "ln1": _ln(block.ln1), "ln2": _ln(block.ln2), "q": q, "k": k, "v": v,
        "proj": squeeze(block.proj), "fc1": squeeze(block.fc1), "fc2": squeeze(block.fc2),
    }  # fmt: skip


def _paramlist(block):
    heads = lambda ws: (torch.cat([w.T for w in ws]), None)  # noqa: E731  x @ W_h, (C, hs) each
    return {
        "ln1": _ln(block.ln1), "ln2": _ln(block.ln2),
        "q": heads(block.wq), "k": heads(block.wk), "v": heads(block.wv),
        "proj": _ln(block.proj), "fc1": _ln(block.mlp[0]), "fc2": _ln(block.mlp[2]),
    }  # fmt: skip


def _per_head(block):
    w = block.query_key_value.weight.view(NH, 3, HS, C)  # [q_h k_h v_h] for each head
    b = block.query_key_value.bias.view(NH, 3, HS)
    part = lambda i: (w[:, i].reshape(C, C), b[:, i].reshape(C))  # noqa: E731
    return {
        "ln1": _ln(block.input_layernorm), "ln2": _ln(block.post_attention_layernorm),
        "q": part(0), "k": part(1), "v": part(2), "proj": _ln(block.dense),
        "fc1": _ln(block.dense_h_to_4h), "fc2": _ln(block.dense_4h_to_h),
    }  # fmt: skip


def _transformerlens(block):
    a = block.attn
    qkv = {r: (W.permute(0, 2, 1).reshape(C, C), bias.reshape(C))  # (nh, C, hs) -> (D, C)
           for r, W, bias in (("q", a.W_Q, a.b_Q), ("k", a.W_K, a.b_K), ("v", a.W_V, a.b_V))}  # fmt: skip
    return {
        "ln1": _ln(block.ln1, "w", "b"), "ln2": _ln(block.ln2, "w", "b"), **qkv,
        "proj": (a.W_O.reshape(C, C).T, a.b_O),  # (nh, hs, C) -> (C, D)
        "fc1": (block.W_in.T, block.b_in), "fc2": (block.W_out.T, block.b_out),
    }  # fmt: skip


def _picogpt(block):
    p = block.p
    q, k, v = _thirds(p["c_attn_w"].T, p["c_attn_b"])  # stored (in, out)
    return {
        "ln1": (p["ln_1_g"], p["ln_1_b"]), "ln2": (p["ln_2_g"], p["ln_2_b"]), "q": q, "k": k,
        "v": v, "proj": (p["c_proj_w"].T, p["c_proj_b"]), "fc1": (p["c_fc_w"].T, p["c_fc_b"]),
        "fc2": (p["mlp_proj_w"].T, p["mlp_proj_b"]),
    }  # fmt: skip


def _custom_ln(block):
    q, k, v = _thirds(*_ln(block.wqkv))
    return {
        "ln1": _ln(block.a, "g", "b"), "ln2": _ln(block.b, "g", "b"), "q": q, "k": k, "v": v,
        "proj": _ln(block.wo), "fc1": _ln(block.up), "fc2": _ln(block.down),
    }  # fmt: skip


WEIGHTS = {
    "conv1d": (_conv, "gelu"),
    "paramlist-heads": (_paramlist, "relu"),
    "per-head-packed": (_per_head, "gelu_tanh"),
    "transformerlens": (_transformerlens, "gelu"),
    "picogpt": (_picogpt, "gelu"),
    "custom-ln": (_custom_ln, "gelu"),
    "extra-args": (_custom_ln, "gelu"),
    "config-only": (_conv, "gelu"),
}
STYLES = {s.name: s for s in reported.STYLES}


def test_every_reported_shape_has_its_weight_map():
    assert set(WEIGHTS) == set(STYLES) and len(STYLES) == 8


@pytest.mark.parametrize("name", list(WEIGHTS))
def test_each_correct_shape_is_the_lessons_block_with_its_weights(name):
    weights, activation = WEIGHTS[name]
    spec = SimpleNamespace(
        __name__=name, weights=weights, REFERENCE={"n_head": NH, "activation": activation}
    )
    torch.manual_seed(0)
    block = randomised(STYLES[name].factory(**STYLES[name].kwargs))
    assert max_error(spec, block) < 1e-12


@pytest.mark.parametrize(
    "name, reads",
    [
        ("conv1d", "q=qkv, k=qkv, v=qkv, proj=proj"),
        ("paramlist-heads", "q=wq, k=wk, v=wv"),
        ("per-head-packed", "q=query_key_value"),
        ("transformerlens", "q=attn.W_Q, k=attn.W_K, v=attn.W_V, proj=attn.W_O"),
        ("picogpt", "proj=p.c_proj_w (in, out)"),
        ("custom-ln", "ln1=a, ln2=b"),
    ],
)
def test_the_report_names_where_each_weight_was_read(name, reads):
    _, report = zoo_realworld.outcome(f"{name}/correct")  # the zoo's check of it, shared
    assert report.passed and report.compared, str(report)
    assert any(reads in n and "read from the forward pass" in n for n in report.notes), str(report)


def test_a_class_needing_more_arguments_gets_the_line_that_builds_it():
    # the layer index is built as 0 (said in the report's target); a count is not guessed
    with pytest.raises(UserValueError, match=r"needs n_layer, .* this builds it: --arg n_layer=1"):
        check_block(reported.ExtraArgs, n_embd=C, n_head=NH)
    report = check_block(reported.ExtraArgs, n_embd=C, n_head=NH, layer_idx=0, n_layer=1)
    assert report.passed, str(report)


def test_a_config_class_is_built_from_the_arguments_given():
    report = check_block(reported.ConfigOnly, n_embd=48, n_head=6)
    assert report.passed and "n_embd=48" in report.target, str(report)
    assert "6 heads" in " ".join(report.notes)


def test_a_mistaken_reported_shape_is_never_passed():
    _, report = zoo_realworld.outcome("conv1d/no_scaling")  # ConvBlock(32, 4), the zoo's check
    assert report.diagnosis == ["no_scaling"] and report.verdict == "FAIL", str(report)
    comparison = report.findings[-1]
    assert comparison.status == "FOUND" and "only with no_scaling" in comparison.message


class SumAttention(torch.nn.Module):
    """Attention as a broadcast product summed over keys (no matrix product the dataflow knows)
    and three norms whose names say nothing: neither the forward pass nor the names read it."""

    def __init__(self, n_embd=C, n_head=NH):
        super().__init__()
        self.nh = n_head
        self.n1, self.n2, self.n3 = (torch.nn.LayerNorm(n_embd) for _ in range(3))
        self.a, self.b, self.c, self.d = (torch.nn.Linear(n_embd, n_embd) for _ in range(4))
        self.e, self.f = torch.nn.Linear(n_embd, 4 * n_embd), torch.nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        B, T, _ = x.shape
        h = self.n1(x)
        q, k, v = (m(h).view(B, T, self.nh, HS).transpose(1, 2) for m in (self.a, self.b, self.c))
        att = (q.unsqueeze(3) * k.unsqueeze(2)).sum(-1) * HS**-0.5  # (B, nh, T, T)
        att = att.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        y = (att.softmax(-1).unsqueeze(-1) * v.unsqueeze(2)).sum(3)  # (B, nh, T, hs)
        x = x + self.d(y.transpose(1, 2).reshape(B, T, C))
        return x + self.f(torch.nn.functional.gelu(self.e(self.n2(x)))) + 0 * self.n3(x)


def test_an_unread_block_is_unverified_with_a_map_that_verifies_it(tmp_path, capsys):
    from gptblock.check.building.target import parse_role
    from gptblock.cli import main

    report = check_block(SumAttention())
    assert report.verdict == "UNVERIFIED" and not report.passed, str(report)
    assert report.verify == "--map ln1=n1 ln2=n2 q=a k=b v=c proj=d fc1=e fc2=f"
    text = " ".join(str(report).split())
    assert "result: UNVERIFIED" in text and f"run again with: {report.verify}" in text
    roles = dict(parse_role(a) for a in report.verify.split()[1:])
    given = check_block(SumAttention(), roles=roles)  # read: only n3 (0 * n3(x)) never acts
    assert given.compared and given.diagnosis == ["unused_parameters"], str(given)
    assert given.details["unused_parameters"] == "n3.weight, n3.bias never act on the output"
    path = tmp_path / "sum_attention.py"
    path.write_text(
        "import torch\nC, NH, HS = 32, 4, 8\n" + __import__("inspect").getsource(SumAttention)
    )
    assert main(["check", f"{path}:SumAttention"]) == 3  # UNVERIFIED has its own exit code
    assert "result: UNVERIFIED" in capsys.readouterr().out


@pytest.mark.parametrize("factory", [reported.TransformerLensBlock, reported.PicoGPT])
def test_the_width_is_the_input_the_block_accepts_without_a_width_attribute(factory):
    report = check_block(factory)  # built with the common arguments; no n_embd attribute kept
    assert report.passed and "(6, 6, 32)" in report.findings[0].message, str(report)


def test_map_accepts_any_parameter_the_forward_pass_reads():
    block = reported.TransformerLensBlock(C, NH)
    report = check_block(block, roles={"q": "attn.W_Q", "proj": "attn.W_O", "ln1": "ln1"})
    assert report.passed, str(report)
    assert "roles given (q, proj, ln1) agree with the forward pass" in " ".join(report.notes)
    with pytest.raises(UserValueError, match=r"q=attn\.W_Z: no such part.*reads"):
        check_block(block, roles={"q": "attn.W_Z"})
