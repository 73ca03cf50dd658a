"""``--map`` / ``roles=`` with a slice of a parameter and its layout (``gptblock.check.roles.given``).

Both blocks below compute attention as a broadcast product summed over keys, which the forward
pass's reader does not recognise, and hold three LayerNorms whose names say nothing: without
``--map`` they are UNVERIFIED. Their weights are in no module the name-based reading can give a
role: q, k, v packed in one (C, 3C) tensor used as ``x @ W`` (or an ``nn.Linear``'s (3C, C)),
or one (nh, C, hs) matrix per head as in TransformerLens. Given by slice and layout, the correct
block must match the lessons' block and a mistaken one get its exact diagnosis; a slice or layout
that does not fit must be an error that says why. (The third norm is called to no effect, ``0 *
n3(x)``: its parameters never act, so the correct block is ``unused_parameters``, and only that.)
"""

import pytest
import torch
import torch.nn as nn

from gptblock import check_block
from gptblock.check.building.target import parse_role
from gptblock.errors import UserValueError

C, NH = 32, 4
HS = C // NH


def _passes_but_n3(report):
    """The lessons' block, read as given, but for n3: its parameters never act."""
    compared = [f for f in report.findings if f.name == "reference comparison"]
    assert report.compared and compared and compared[0].passed, str(report)
    assert report.diagnosis == ["unused_parameters"], str(report)
    assert report.details["unused_parameters"] == "n3.weight, n3.bias never act on the output"


def _attend(q, k, v, scale):
    """(B, nh, T, hs) each -> (B, nh, T, hs), as a summed broadcast product, causal."""
    T = q.shape[2]
    att = (q.unsqueeze(3) * k.unsqueeze(2)).sum(-1) * scale  # (B, nh, T, T)
    att = att.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    return (att.softmax(-1).unsqueeze(-1) * v.unsqueeze(2)).sum(3)  # (B, nh, T, hs)


class Packed(nn.Module):
    """q | k | v in one parameter: (C, 3C) used as ``x @ W`` (in_out) or an nn.Linear (out_in)."""

    def __init__(self, n_embd=C, in_out=True, scale=HS**-0.5):
        super().__init__()
        self.in_out, self.scale = in_out, scale
        self.n1, self.n2, self.n3 = (nn.LayerNorm(n_embd) for _ in range(3))
        self.attn = nn.Linear(n_embd, 3 * n_embd)
        if in_out:  # stored (in, out) as GPT-2's Conv1D
            self.attn.weight = nn.Parameter(self.attn.weight.detach().t().contiguous())
        self.proj = nn.Linear(n_embd, n_embd)
        self.e, self.f = nn.Linear(n_embd, 4 * n_embd), nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        B, T, _ = x.shape
        h = self.n1(x)
        w = self.attn.weight if self.in_out else self.attn.weight.t()  # (C, 3C)
        qkv = h @ w + self.attn.bias  # (B, T, 3C)
        q, k, v = (t.view(B, T, NH, HS).transpose(1, 2) for t in qkv.split(C, dim=2))
        y = _attend(q, k, v, self.scale).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        return x + self.f(nn.functional.gelu(self.e(self.n2(x)))) + 0 * self.n3(x)


class PerHead(nn.Module):
    """TransformerLens's per-head tensors: W_Q (nh, C, hs), W_O (nh, hs, C), b_Q (nh, hs)."""

    def __init__(self, n_embd=C, scale=HS**-0.5):
        super().__init__()
        self.scale = scale
        self.n1, self.n2, self.n3 = (nn.LayerNorm(n_embd) for _ in range(3))
        for n in "QKV":
            setattr(self, f"W_{n}", nn.Parameter(torch.randn(NH, n_embd, HS) * n_embd**-0.5))
            setattr(self, f"b_{n}", nn.Parameter(torch.randn(NH, HS) * 0.1))
        self.W_O = nn.Parameter(torch.randn(NH, HS, n_embd) * n_embd**-0.5)
        self.b_O = nn.Parameter(torch.randn(n_embd) * 0.1)
        self.e, self.f = nn.Linear(n_embd, 4 * n_embd), nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        h = self.n1(x)
        q, k, v = (
            torch.einsum("btc,hcd->bhtd", h, w) + b[:, None, :]
            for w, b in ((self.W_Q, self.b_Q), (self.W_K, self.b_K), (self.W_V, self.b_V))
        )  # (B, nh, T, hs) each
        z = _attend(q, k, v, self.scale)
        x = x + torch.einsum("bhtd,hdc->btc", z, self.W_O) + self.b_O
        return x + self.f(nn.functional.gelu(self.e(self.n2(x)))) + 0 * self.n3(x)


class PerHeadPacked(nn.Module):
    """q, k, v packed per head in one (nh, C, 3hs) tensor, as BLOOM / GPT-NeoX pack their rows."""

    def __init__(self, n_embd=C, scale=HS**-0.5):
        super().__init__()
        self.scale = scale
        self.n1, self.n2, self.n3 = (nn.LayerNorm(n_embd) for _ in range(3))
        self.W_qkv = nn.Parameter(torch.randn(NH, n_embd, 3 * HS) * n_embd**-0.5)
        self.b_qkv = nn.Parameter(torch.randn(NH, 3 * HS) * 0.1)
        self.o = nn.Linear(n_embd, n_embd)
        self.e, self.f = nn.Linear(n_embd, 4 * n_embd), nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        B, T, _ = x.shape
        h = self.n1(x)
        qkv = torch.einsum("btc,hcd->bhtd", h, self.W_qkv) + self.b_qkv[:, None, :]
        q, k, v = qkv.split(HS, dim=-1)  # (B, nh, T, hs) each
        z = _attend(q, k, v, self.scale).transpose(1, 2).reshape(B, T, C)
        x = x + self.o(z)
        return x + self.f(nn.functional.gelu(self.e(self.n2(x)))) + 0 * self.n3(x)


def _roles(line):
    return dict(parse_role(a) for a in line.split())


NORMS_MLP = "ln1=n1 ln2=n2 fc1=e fc2=f"
THIRDS = "q=attn.weight[:,0:32]:in_out k=attn.weight[:,32:64]:in_out v=attn.weight[:,64:96]:in_out"
MAPS = {
    "thirds_in_out": (Packed, {}, f"{NORMS_MLP} proj=proj {THIRDS}"),
    "packed_in_out": (Packed, {}, f"{NORMS_MLP} proj=proj qkv=attn.weight:in_out"),
    "rows_out_in": (
        Packed,
        {"in_out": False},
        f"{NORMS_MLP} proj=proj q=attn.weight[0:32,:] k=attn.weight[32:64,:] "
        "v=attn.weight[64:96,:]",
    ),
    "per_head": (
        PerHead,
        {},
        f"{NORMS_MLP} q=W_Q:in_out k=W_K:in_out v=W_V:in_out proj=W_O:in_out",
    ),
    "per_head_packed": (
        PerHeadPacked,
        {},
        f"{NORMS_MLP} proj=o q=W_qkv[:,:,0:8]:in_out k=W_qkv[:,:,8:16]:in_out "
        "v=W_qkv[:,:,16:24]:in_out",
    ),
}


@pytest.mark.parametrize("name", MAPS)
def test_a_slice_and_layout_verify_a_block_the_checker_cannot_read(name):
    factory, kwargs, line = MAPS[name]
    assert check_block(factory(**kwargs)).verdict == "UNVERIFIED"
    report = check_block(factory(**kwargs), roles=_roles(line))
    _passes_but_n3(report)
    mistaken = check_block(factory(**kwargs, scale=1.0), roles=_roles(line))
    assert mistaken.diagnosis == ["no_scaling"] and mistaken.verdict == "FAIL", str(mistaken)
    wide = check_block(factory(**kwargs, scale=C**-0.5), roles=_roles(line))
    assert wide.diagnosis == ["wrong_scale"] and wide.verdict == "FAIL", str(wide)


@pytest.mark.parametrize(
    ("given", "why"),
    [
        ("q=attn.nope[:,0:32]:in_out", "no parameter 'attn.nope'"),
        ("q=attn.weight[:,80:128]:in_out", "slice 80:128 is out of range .* size 96"),
        ("q=attn.weight[0:32]:in_out", "1 slices for attn.weight of shape \\(32, 96\\)"),
        ("q=attn.weight[:,0:32]:sideways", "layout 'sideways'; expected out_in or in_out"),
        ("q=attn.weight[:,5]:in_out", "'5' is not START:STOP"),
        (
            "q=attn.weight[0:16,:]:in_out",
            "reads as \\(out, in\\) = \\(96, 16\\), but q is \\(D, C\\)",
        ),
        ("fc2=attn.weight:in_out", "reads as \\(out, in\\) = \\(96, 32\\), but fc2 is \\(C, H\\)"),
        ("ln1=attn.weight[:,0:32]", "a norm is given as its module"),
    ],
)
def test_a_slice_or_layout_that_does_not_fit_is_an_error_saying_why(given, why):
    roles = _roles(f"{NORMS_MLP} {given}")
    with pytest.raises(UserValueError, match=why):
        check_block(Packed(), roles=roles)


def test_a_per_head_tensor_named_plainly_takes_the_layout_that_fits():
    plain = check_block(PerHead(), roles=_roles(f"{NORMS_MLP} q=W_Q k=W_K v=W_V proj=W_O"))
    _passes_but_n3(plain)
    line = f"{NORMS_MLP} proj=o q=W_qkv[:,:,0:8] k=W_qkv[:,:,8:16] v=W_qkv[:,:,16:24]"
    _passes_but_n3(check_block(PerHeadPacked(), roles=_roles(line)))
    with pytest.raises(UserValueError, match="check the slice, or the layout"):
        check_block(PerHead(), roles=_roles(f"{NORMS_MLP} q=W_Q:out_in"))


SUGGESTED = {
    "in_out": (Packed, {}, "qkv=attn.weight:in_out proj=proj fc1=e fc2=f"),
    "per_head": (
        PerHead,
        {},
        "q=W_Q:in_out k=W_K:in_out v=W_V:in_out proj=W_O:in_out fc1=e fc2=f",
    ),
    "per_head_packed": (
        PerHeadPacked,
        {},
        "q=W_qkv[:,:,0:8]:in_out k=W_qkv[:,:,8:16]:in_out v=W_qkv[:,:,16:24]:in_out proj=o "
        "fc1=e fc2=f",
    ),
}


@pytest.mark.parametrize("name", SUGGESTED)
def test_an_unverified_report_suggests_the_slice_and_layout_that_verify_it(name):
    factory, kwargs, expected = SUGGESTED[name]
    report = check_block(factory(**kwargs))
    assert report.verdict == "UNVERIFIED", str(report)
    assert report.verify == f"--map ln1=n1 ln2=n2 {expected}"
    roles = _roles(report.verify.removeprefix("--map "))
    _passes_but_n3(check_block(factory(**kwargs), roles=roles))
    mistaken = check_block(factory(**kwargs, scale=1.0), roles=roles)
    assert mistaken.diagnosis == ["no_scaling"], str(mistaken)


def test_the_cli_takes_a_slice_and_a_layout(tmp_path, capsys):
    import inspect

    from gptblock.cli import main

    path = tmp_path / "packed.py"
    path.write_text(
        "import torch\nimport torch.nn as nn\nC, NH, HS = 32, 4, 8\n"
        + inspect.getsource(_attend)
        + inspect.getsource(Packed)
    )
    assert main(["check", f"{path}:Packed"]) == 3
    capsys.readouterr()
    assert (
        main(["check", f"{path}:Packed", "--map", *f"{NORMS_MLP} proj=proj {THIRDS}".split()]) == 1
    )
    out = capsys.readouterr().out
    assert "PASS  reference comparison" in out and "diagnosis: unused_parameters" in out, out
    assert main(["check", f"{path}:Packed", "--map", "q=attn.weight[:,0:99]:in_out"]) == 2
    assert "slice 0:99 is out of range" in capsys.readouterr().err
