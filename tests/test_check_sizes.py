"""The other sizes a block is checked at, found by value (check/building/sizes.py): sizes under names the
checker does not know, in the constructor, its defaults, a config the caller passes or a
dataclass config the checker builds, all changed consistently."""

import math
import re
from collections import Counter
from dataclasses import dataclass
from types import SimpleNamespace
from typing import ClassVar

import torch
import torch.nn as nn

from gptblock import lesson
from gptblock.check import check_block
from gptblock.check.building.sizes import plan


# Written the way bentrevett/pytorch-seq2seq's "Attention is All You Need" notebook writes its
# layers: hid_dim / n_heads / pf_dim, fc_q / fc_k / fc_v / fc_o, view then permute(0, 2, 1, 3),
# energy / scale, masked_fill(mask == 0, -1e10); pre-norm and decoder-only here.
class Attention(nn.Module):
    def __init__(self, hid_dim, n_heads, scale=None):
        super().__init__()
        self.hid_dim, self.n_heads, self.head_dim = hid_dim, n_heads, hid_dim // n_heads
        self.fc_q = nn.Linear(hid_dim, hid_dim)
        self.fc_k = nn.Linear(hid_dim, hid_dim)
        self.fc_v = nn.Linear(hid_dim, hid_dim)
        self.fc_o = nn.Linear(hid_dim, hid_dim)
        self.scale = scale or math.sqrt(self.head_dim)

    def forward(self, x):
        B, T, _ = x.shape
        Q, K, V = (f(x).view(B, -1, self.n_heads, self.head_dim).permute(0, 2, 1, 3)
                   for f in (self.fc_q, self.fc_k, self.fc_v))  # fmt: skip
        energy = torch.matmul(Q, K.permute(0, 1, 3, 2)) / self.scale
        mask = torch.tril(torch.ones(T, T, device=x.device)).bool()
        energy = energy.masked_fill(mask == 0, -1e10)
        out = torch.matmul(torch.softmax(energy, dim=-1), V).permute(0, 2, 1, 3)
        return self.fc_o(out.contiguous().view(B, -1, self.hid_dim))


class DecoderLayer(nn.Module):
    def __init__(self, hid_dim, n_heads, pf_dim, dropout, device, scale=None):
        super().__init__()
        self.self_attn_layer_norm = nn.LayerNorm(hid_dim)
        self.ff_layer_norm = nn.LayerNorm(hid_dim)
        self.self_attention = Attention(hid_dim, n_heads, scale)
        self.fc_1, self.fc_2 = nn.Linear(hid_dim, pf_dim), nn.Linear(pf_dim, hid_dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, trg):
        trg = trg + self.dropout(self.self_attention(self.self_attn_layer_norm(trg)))
        _trg = self.fc_2(torch.relu(self.fc_1(self.ff_layer_norm(trg))))
        return trg + self.dropout(_trg)


SEQ2SEQ = {"hid_dim": 32, "n_heads": 4, "pf_dim": 128, "dropout": 0.1, "device": "cpu"}


def test_sizes_under_unknown_names_are_found_by_their_values():
    found = plan(DecoderLayer, SEQ2SEQ, 32)
    assert found is not None
    assert {k: found.args[k] for k in ("hid_dim", "n_heads", "pf_dim")} == {
        "hid_dim": 48,
        "n_heads": 3,
        "pf_dim": 192,
    }
    assert found.args["dropout"] == 0.1 and found.args["device"] == "cpu"
    assert found.label == "hid_dim=48 (C), n_heads=3, pf_dim=192 (4C)"


def test_a_block_right_only_at_its_files_sizes_fails_naming_the_other_sizes():
    # the scale written as the file's head size, sqrt(32 / 4): right there, wrong at hs 16
    report = check_block(DecoderLayer, **SEQ2SEQ, scale=math.sqrt(8))
    assert report.verdict == "FAIL", str(report)
    (other,) = [f for f in report.findings if not f.passed]
    assert other.name == "other sizes"
    assert "; at hid_dim=48 (C), n_heads=3, pf_dim=192 (4C): FAIL" in other.message


def test_in_process_and_isolated_the_other_sizes_are_checked_by_one_path():
    # check_in_process answers here the requests check_isolated sends a child (worker.Served):
    # the same findings, notes and failure at the other sizes (the isolated seeds are secret)
    args = {**SEQ2SEQ, "scale": math.sqrt(8)}
    here, there = (check_block(DecoderLayer, isolate=i, **args) for i in (False, True))
    assert [(f.name, f.passed) for f in here.findings] == [
        (f.name, f.passed) for f in there.findings
    ]
    unmeasured = [[re.sub(r"\d+(e-\d+)?", "#", n) for n in r.notes] for r in (here, there)]
    assert unmeasured[0] == unmeasured[1] and here.diagnosis == there.diagnosis
    said = [f.message.partition(": FAIL")[0] for r in (here, there) for f in r.findings[-1:]]
    assert said[0] == said[1] and said[0].endswith("at hid_dim=48 (C), n_heads=3, pf_dim=192 (4C)")


# Written the way rasbt's LLMs-from-scratch (ch. 4) writes its block: a config dict with emb_dim,
# context_length, n_heads, drop_rate, qkv_bias; the mask a buffer of context_length.
class TransformerBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, n = cfg["emb_dim"], cfg["n_heads"]
        self.att = nn.MultiheadAttention(d, n, dropout=cfg["drop_rate"], batch_first=True)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        L = cfg["context_length"]
        self.register_buffer("mask", torch.triu(torch.ones(L, L), diagonal=1).bool())

    def forward(self, x):
        T = x.shape[1]
        h = self.norm1(x)
        x = x + self.att(h, h, h, attn_mask=self.mask[:T, :T], need_weights=False)[0]
        return x + self.ff(self.norm2(x))


def test_a_config_the_caller_passes_is_varied():
    cfg = {"emb_dim": 32, "context_length": 16, "n_heads": 4, "drop_rate": 0.1, "qkv_bias": False}
    report = check_block(TransformerBlock, cfg=cfg)
    assert report.passed, str(report)
    said = " ".join(report.notes)
    assert "checked again at emb_dim=48, n_heads=3, context_length=24: PASS" in said, said
    assert cfg["emb_dim"] == 32  # the caller's config is copied, not changed


# Written the way Meta's llama / gpt-fast write theirs: a ModelArgs dataclass with defaults
# (dim, n_heads, hidden_dim for the MLP), the block built from it.
@dataclass
class ModelArgs:
    dim: int = 32
    n_heads: int = 4
    hidden_dim: int = 96
    norm_eps: float = 1e-5


def test_a_dataclass_config_and_a_namespace_are_copied_with_the_other_sizes():
    found = plan(lambda args: None, {"args": ModelArgs()}, 32)
    assert found is not None and found.args["args"] == ModelArgs(48, 3, 144)
    ns = SimpleNamespace(n_state=32, n_head=4, n_layer=2, n_ctx=16)
    found = plan(lambda config, layer_idx: None, {"config": ns, "layer_idx": 0}, 32)
    assert found is not None and found.args["layer_idx"] == 0
    assert vars(found.args["config"]) == {"n_state": 48, "n_head": 3, "n_layer": 2, "n_ctx": 24}
    assert found.label == "n_state=48 (C), n_head=3, n_ctx=24"


# Written the way gpt-fast writes its ModelArgs: key/value heads called n_local_heads, head_dim
# derived in __post_init__.
@dataclass
class LocalHeads:
    dim: int = 32
    n_head: int = 4
    n_local_heads: int = 2
    head_dim: int = 8

    def __post_init__(self):
        self.head_dim = self.dim // self.n_head


def test_two_head_counts_the_fewer_are_key_value_heads_and_keep_their_group():
    found = plan(lambda config: None, {"config": LocalHeads()}, 32)
    assert found is not None and found.args["config"] == LocalHeads(24, 2, 1, 12)
    assert found.label == "dim=24, n_head=2, n_local_heads=1 (kv heads), head_dim=12"


def test_the_lecture_at_its_own_sizes_made_smaller_is_checked_again(tmp_path):
    # the video lecture's settings: n_embd 384 is built at 96 (16 a head); the other sizes
    # start from the 96 the block was built at, not the 384 the file says (4 x 96)
    from test_check_build import LECTURE

    big = LECTURE.replace("n_embd = 64", "n_embd = 384").replace("n_head = 4", "n_head = 6")
    path = tmp_path / "gpt.py"
    path.write_text(big.replace("block_size = 32", "block_size = 256"))
    report = check_block(f"{path}:Block", isolate=False)
    assert report.passed, str(report)
    assert "checked again at n_embd=24, n_head=2, block_size=16: PASS" in report.notes, str(report)


class Counted(lesson.Block):
    """The lessons' block, counting its calls by width (the file's 32, the other sizes' 48)."""

    calls: ClassVar[Counter[int]] = Counter()

    def forward(self, x):
        Counted.calls[x.shape[-1]] += 1
        return super().forward(x)


def test_at_the_other_sizes_only_the_comparison_runs_again():
    # the probes, the learner's conditions and the parameters' accounting are proven at the
    # file's sizes; the other sizes add "equal to the reference there too"
    Counted.calls.clear()
    report = check_block(Counted, n_embd=32, n_head=4)
    assert report.passed and any(n.startswith("checked again at") for n in report.notes)
    assert 0 < 3 * Counted.calls[48] < Counted.calls[32], Counted.calls


# Written the way torch's own layer is used: post-norm, the encoder layer's default.
class PostNorm(nn.Module):
    def __init__(self, d_model=32, nhead=4):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(d_model, nhead, 4 * d_model, batch_first=True)

    def forward(self, x):
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        return self.layer(x, src_mask=mask, is_causal=True)


def test_a_mistake_diagnosed_at_the_files_sizes_is_not_checked_again():
    report = check_block(PostNorm)
    assert report.diagnosis == ["post_norm"], str(report)
    assert not any(n.startswith("checked again at") for n in report.notes), report.notes


def test_the_sizes_helpers_read_names_and_values():
    from gptblock.check.building.sizes import file_sizes, kind_of, names, settings, size_sets
    from gptblock.check.isolation.check import not_other

    def make(n_embd=64, n_head=4): ...

    def wide(hid_dim=32, n_heads=4, pf_dim=128, dropout=0.1): ...

    assert settings(int) == ("builtins", {}, {})
    assert file_sizes(make, {})[0] == {"width": 64, "heads": 4}
    assert size_sets({"width": 32, "heads": 4, "length": 16})[0] == {
        "width": 48, "heads": 3, "length": 24,
    }  # fmt: skip
    assert (names({"heads": 2})["n_head"], names({"heads": 2})["num_heads"]) == (2, 2)
    assert not_other("it takes a width of 64, not 48") == (
        "checked at the file's sizes only: at other sizes it takes a width of 64, not 48 (a size "
        "fixed in the code?)"
    )
    kinds = [kind_of(n) for n in ("num_attention_heads", "attn_dim_head", "n_ctx", "layer_idx")]
    assert kinds == ["heads", "head_size", "length", "other"]
    kinds = [kind_of(n) for n in ("head_count", "d_head", "attn_d_head")]
    assert kinds == ["heads", "head_size", "head_size"]
    assert kind_of("hid_dim") is None
    # (s69 unseen set: DeepSeek's layer) heads that predict tokens are no attention heads
    assert [kind_of(n) for n in ("mtp_num_heads", "num_medusa_heads")] == ["other", "other"]
    found = plan(wide, {}, 32)
    assert found is not None
    assert found.args == {"hid_dim": 48, "n_heads": 3, "pf_dim": 192}
    assert found.label == "hid_dim=48 (C), n_heads=3, pf_dim=192 (4C)"
