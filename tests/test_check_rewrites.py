"""Roles independent of how the code is written (issue 28, item 5).

``tests/rewrites.py`` rewrites a block's forward pass without changing what it computes (1x1
convolutions for linear layers, products written transposed, einsum, heads by stack / split,
softmax and LayerNorm by hand, ...). Each rewrite is proved to keep the block the same function,
and the checker must give a rewritten block the verdict and diagnosis it gives the original.
``python tests/rewrite_hitrate.py`` runs every rewrite on the zoos; here a few representative
blocks, and the three code shapes issue 28 reported, written as a learner would.

Shapes: B batch, T time, C channels, nh heads, hs head size.
"""

import math

import pytest
import torch
import torch.nn as nn
from torch.nn import functional as F

import zoo_modern
import zoo_public
import zoo_realworld
from gptblock import check_block
from gptblock.check.building.build import width
from rewrites import REWRITES, rewrite_module, same_function
from zoo_realworld.common import scale, softmax_masked


class StackHeads(nn.Module):
    """nanoGPT's block, the heads split by ``stack(t.split(hs, -1), 1)`` and merged by
    ``cat(y.unbind(1), -1)``."""

    def __init__(self, n_embd, n_head, block_size=16, bugs=()):
        super().__init__()
        self.n_head, self.bugs = n_head, frozenset(bugs)
        self.ln_1, self.ln_2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.mlp_proj = nn.Linear(4 * n_embd, n_embd)
        self.register_buffer("tril", torch.tril(torch.ones(block_size, block_size)))

    def attn(self, x):
        B, T, C = x.shape
        hs = C // self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (torch.stack(t.split(hs, -1), 1) for t in (q, k, v))  # (B, nh, T, hs)
        att = (q @ k.transpose(-2, -1)) * scale(self.bugs, 1 / math.sqrt(hs), hs, C)
        y = softmax_masked(att, self.tril[:T, :T] == 1, self.bugs) @ v
        return self.c_proj(torch.cat(y.unbind(1), -1))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class ChannelsFirst(nn.Module):
    """The block on (B, C, T), every product with the weight on the left, and ``v @ att^T``."""

    def __init__(self, n_embd, n_head, block_size=16, bugs=()):
        super().__init__()
        self.n_head, self.bugs = n_head, frozenset(bugs)
        self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        C = n_embd
        self.a, self.b, self.c, self.o = (
            nn.Parameter(torch.randn(C, C) / C**0.5) for _ in range(4)
        )
        self.up = nn.Parameter(torch.randn(4 * C, C) / C**0.5)
        self.down = nn.Parameter(torch.randn(C, 4 * C) / (4 * C) ** 0.5)
        self.register_buffer("causal", torch.tril(torch.ones(block_size, block_size)).bool())

    def mix(self, h):  # h: (B, C, T)
        B, C, T = h.shape
        hs = C // self.n_head
        q, k, v = ((w @ h).view(B, self.n_head, hs, T) for w in (self.a, self.b, self.c))
        att = (q.transpose(-2, -1) @ k) * scale(self.bugs, hs**-0.5, hs, C)  # (B, nh, T, T)
        att = softmax_masked(att, self.causal[:T, :T], self.bugs)
        y = v @ att.transpose(-2, -1)  # (B, nh, hs, T)
        return self.o @ y.reshape(B, C, T)

    def forward(self, x):
        h = x.transpose(1, 2)
        h = h + self.mix(self.ln1(h.mT).mT)
        return (h + self.down @ F.gelu(self.up @ self.ln2(h.mT).mT)).transpose(1, 2)


class ConvBlock(nn.Module):
    """The block with 1x1 ``nn.Conv2d`` layers on a (B, C, 1, T) tensor."""

    def __init__(self, n_embd, n_head, block_size=16, bugs=()):
        super().__init__()
        self.n_head, self.bugs = n_head, frozenset(bugs)
        self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.qkv = nn.Conv2d(n_embd, 3 * n_embd, 1)
        self.out = nn.Conv2d(n_embd, n_embd, 1)
        self.fc1 = nn.Conv2d(n_embd, 4 * n_embd, 1)
        self.fc2 = nn.Conv2d(4 * n_embd, n_embd, 1)
        self.register_buffer("mask", torch.tril(torch.ones(block_size, block_size)))

    def forward(self, x):
        B, T, C = x.shape
        hs = C // self.n_head
        h = self.ln1(x).transpose(1, 2).unsqueeze(2)  # (B, C, 1, T)
        q, k, v = self.qkv(h).chunk(3, dim=1)
        q, k, v = (t.reshape(B, self.n_head, hs, T).transpose(-2, -1) for t in (q, k, v))
        att = q @ k.transpose(-2, -1) * scale(self.bugs, 1 / math.sqrt(hs), hs, C)
        att = softmax_masked(att, self.mask[:T, :T] == 1, self.bugs)
        y = (att @ v).transpose(-2, -1).reshape(B, C, 1, T)
        x = x + self.out(y).squeeze(2).transpose(1, 2)
        h = self.ln2(x).transpose(1, 2).unsqueeze(2)
        return x + self.fc2(F.gelu(self.fc1(h))).squeeze(2).transpose(1, 2)


SHAPES = [StackHeads, ChannelsFirst, ConvBlock]


@pytest.mark.parametrize("block", SHAPES, ids=lambda b: b.__name__)
def test_the_reported_shapes_pass_read_from_the_forward_pass(block):
    report = check_block(block, n_embd=32, n_head=4)
    assert report.verdict == "PASS", str(report)
    assert "read from the forward pass" in " ".join(str(report).split())


@pytest.mark.parametrize(
    ("block", "bug"),
    [
        (StackHeads, "wrong_scale"),
        (StackHeads, "mask_reversed"),
        (ChannelsFirst, "no_scaling"),
        (ChannelsFirst, "softmax_dim"),
        (ConvBlock, "wrong_scale"),
        (ConvBlock, "future_leak"),
    ],
)
def test_the_reported_shapes_mistakes_are_diagnosed(block, bug):
    report = check_block(block, n_embd=32, n_head=4, bugs=(bug,))
    assert report.verdict == "FAIL" and report.confident, str(report)
    assert report.diagnosis == [bug], str(report)


def _realworld(name):
    return next(c for c in zoo_realworld.cases() if c.name == name).build


def _public(name):
    module = zoo_public.spec(name)
    return lambda: module.BLOCK(**module.ARGS)


BLOCKS = {  # representative: the lessons', nanoGPT's (one mistaken), one public block
    "lesson": _realworld("lesson/correct"),
    "nanogpt": _realworld("nanogpt/correct"),
    "nanogpt/wrong_scale": _realworld("nanogpt/wrong_scale"),
    "nanogpt/mask_reversed": _realworld("nanogpt/mask_reversed"),
    "public/hf_gpt2": _public("hf_gpt2"),
}
ZOO_CASES = {  # the zoo's cases among them, whose check tests/test_check_zoo.py shares
    "lesson": "lesson/correct",
    "nanogpt": "nanogpt/correct",
    "nanogpt/wrong_scale": "nanogpt/wrong_scale",
    "nanogpt/mask_reversed": "nanogpt/mask_reversed",
}


def test_every_rewrite_keeps_the_function_and_applies_somewhere():
    torch.manual_seed(0)
    makes = [BLOCKS["lesson"], _realworld("nanogpt-flash/correct"), BLOCKS["public/hf_gpt2"]]
    blocks = [make() for make in makes] + [b(32, 4) for b in SHAPES]
    for name in REWRITES:
        applied = 0
        for block in blocks:
            same, n = same_function(block, name, width(block, {}))
            assert same, (name, type(block).__name__)
            applied += n
        assert applied, f"{name} rewrote nothing"


def _outcome(report):
    return report.verdict, sorted(report.diagnosis), report.confident


@pytest.mark.parametrize("case", list(BLOCKS))
def test_every_rewrite_keeps_the_verdict_and_diagnosis(case):
    torch.manual_seed(0)
    block = BLOCKS[case]()
    zoo = ZOO_CASES.get(case)  # the unrewritten block's check: the zoo's where it has one
    base = _outcome(zoo_realworld.outcome(zoo)[1] if zoo else check_block(block))
    C = width(block, {})
    for name in REWRITES:
        if same_function(block, name, C)[1]:  # only where the rewrite finds something to rewrite
            said = check_block(rewrite_module(BLOCKS[case](), name))
            assert _outcome(said) == base, (name, str(said))


@pytest.mark.parametrize(
    "block, name",
    [("phi3", "conv1d"), ("phi3", "transposed"), ("qwen2", "einsum"), ("qwen3", "seq_first"),
     ("qwen3", "split_scale"), ("hf_llama", "loop_batch"), ("gptj", "baddbmm")],
)  # fmt: skip
def test_modern_blocks_rewritten_keep_their_pass(block, name):
    """The rotation and the qk norm's gains read however the block is written: q's product
    channels first or flattened (B * T, F) (phi3 conv1d), the scores' q operand transposed
    (phi3 transposed), a bias added after the product (qwen2 einsum), heads before the batch
    (qwen3 seq_first, with a qk norm), the scores' scale split onto q and k after the qk norm
    (qwen3 split_scale), one attention core per sequence (hf_llama loop_batch), att @ v as
    baddbmm (gptj). Each of these made a correct block FAIL or UNVERIFIED."""
    module = zoo_modern.spec(block)
    report = check_block(rewrite_module(module.BLOCK(**module.ARGS), name))
    assert report.verdict == "PASS", str(report)


def test_a_layernorm_by_var_mean_is_read_as_a_norm():
    # graykode's block builds nn.LayerNorm in forward (no module call to see): by var_mean, its
    # norm was not found at all (UNVERIFIED), and the module tree cannot read its Conv1d MLP
    report = check_block(rewrite_module(_public("graykode_nlp_tutorial")(), "var_mean"))
    assert report.verdict == "PASS", str(report)


@pytest.mark.parametrize(
    "build",
    [_public("transformerlens"), _realworld("transformerlens/correct")],
    ids=["public", "realworld"],
)
def test_transformerlens_run_one_sequence_at_a_time_passes(build):
    # read at B = 1 only, where einsum flattens the heads (hs, nh)-major on both sides of its
    # product with W_O (the public block's inside a (1, B * T, C), the realworld one's, heads
    # before positions, straight from (T, hs, nh)): proj's columns are put in W_O's own order
    report = check_block(rewrite_module(build(), "loop_batch"))
    assert report.verdict == "PASS", str(report)


def test_a_square_weight_expanded_over_positions_is_a_weight_not_a_rotation():
    # seq_first on Gemma's block: F.linear on (T, B, C) runs as a bmm with o_proj's (C, C) weight
    # expanded to (T, C, C), which read as a rotation's matrix a position: proj was none (FAIL)
    report = check_block(rewrite_module(_public("gemma")(), "seq_first"))
    assert report.verdict == "PASS", str(report)
