"""A modern block's KV cache, driven by the checker where its forward has a known cache API.

Meta's Llama (``forward(x, start_pos)``) and gpt-fast (``forward(x, input_pos)``) in
``tests/zoo_modern`` keep their caches: correct, the cached step equals the whole sequence and the
block PASSes; with the step's table sliced from the start (``rope_cache_offset``), whole
sequences are still right, and the checker names the mistake, in process and isolated. A block
with no cache argument is reported "not probed", and a ``past_key_value`` block that returns
``(y, cache)`` is driven too.
"""

import inspect
import pathlib

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import zoo_modern
from gptblock import check_block
from gptblock.check import check_isolated
from gptblock.check.compare.modern import judge_cache
from gptblock.check.serve.cache import CACHE_APIS, cache_api, drive_cache

CACHED = ("meta_llama", "gpt_fast")


@pytest.mark.parametrize("style", CACHED)
@pytest.mark.parametrize("mistakes", [(), ("rope_cache_offset",)])
def test_a_cached_step_is_compared_in_process(style, mistakes):
    module = zoo_modern.load(style, mistakes)
    report = check_block(module.BLOCK, **module.ARGS)
    cache = [n for n in report.notes if n.startswith("cache (")]
    assert len(cache) == 1, str(report)
    if mistakes:
        assert report.verdict == "FAIL" and report.diagnosis == ["rope_cache_offset"], str(report)
        assert "rotated as position 0" in report.details["rope_cache_offset"]
    else:
        assert report.verdict == "PASS", str(report)
        assert "equals the whole sequence" in cache[0]


def _targets(cases, folder):
    """One file whose classes build the zoo's blocks with their arguments (gpt-fast's is a
    config object, which no command line gives): one child checks them all."""
    path = folder / "cached.py"
    text = f"import sys\nsys.path.insert(0, {str(pathlib.Path(__file__).parent)!r})\n"
    text += "import zoo_modern\n"
    for i, (style, mistakes) in enumerate(cases):
        text += (
            f"\n\nm{i} = zoo_modern.load({style!r}, {mistakes!r})\n\n\n"
            f"class Built{i}(m{i}.BLOCK):\n"
            "    def __init__(self):\n"
            f"        super().__init__(**m{i}.ARGS)\n"
        )
    path.write_text(text)
    return [f"{path}:Built{i}" for i in range(len(cases))]


def test_a_cached_step_is_compared_isolated(tmp_path):
    cases = [(s, m) for s in CACHED for m in [(), ("rope_cache_offset",)]]
    reports = check_isolated(_targets(cases, tmp_path), kwargs={}, roles={}, timeout=300)
    for (style, mistakes), report in zip(cases, reports, strict=True):
        if mistakes:
            assert report.diagnosis == ["rope_cache_offset"], (style, str(report))
        else:
            assert report.verdict == "PASS", (style, str(report))
            assert "not confirmed outside it" not in str(report)


@pytest.mark.parametrize("mistakes", [(), ("rope_cache_offset",)])
def test_a_start_pos_cache_read_only_with_use_cache_is_driven_with_it(mistakes):
    # (s85 unseen set) the step was driven without use_cache: it read no cache, and the mistake PASSed
    module = zoo_modern.load("meta_llama", mistakes)

    class UseCache(module.BLOCK):  # the cache written and read with use_cache=True only
        def forward(self, x, start_pos: int = 0, use_cache: bool = False):
            return super().forward(x, start_pos if use_cache else None)

    report = check_block(UseCache, **module.ARGS)
    assert report.diagnosis == list(mistakes), str(report)
    assert "(start_pos=6, use_cache=True)" in str(report), str(report)


def test_a_block_without_a_cache_api_is_not_probed():
    module = zoo_modern.load("hf_llama")
    report = check_block(module.BLOCK, **module.ARGS)
    assert report.verdict == "PASS"
    assert any("not probed: no cache API recognised" in n for n in report.notes), str(report)


class PastBlock(nn.Module):
    """A block with a Hugging-Face-style cache: ``forward(x, past_key_value, use_cache)``
    returns ``(y, cache)`` with ``use_cache``; the step's positions come from the cache's
    length (``offset``: True) or, mistaken, start at 0."""

    def __init__(self, offset=True, C=8):
        super().__init__()
        self.offset, self.C = offset, C
        self.q, self.k = nn.Linear(C, C, bias=False), nn.Linear(C, C, bias=False)

    def rotate(self, t, start):
        T = t.shape[1]
        pos = torch.arange(start, start + T, dtype=t.dtype)[:, None]  # (T, 1)
        angle = pos * 10000.0 ** (-torch.arange(0, self.C, 2, dtype=t.dtype) / self.C)
        a, b = t[..., 0::2], t[..., 1::2]
        return torch.stack((a * angle.cos() - b * angle.sin(), a * angle.sin() + b * angle.cos()), -1).flatten(-2)  # fmt: skip

    def forward(self, x, past_key_value=None, use_cache=False):
        P = 0 if past_key_value is None else past_key_value[0].shape[1]
        y, cache = self.step(x, past_key_value, P if self.offset else 0)
        return (y, cache) if use_cache else y

    def step(self, x, past, start):
        q, k = self.rotate(self.q(x), start), self.rotate(self.k(x), start)
        v = x
        if past is not None:
            k, v = torch.cat((past[0], k), 1), torch.cat((past[1], v), 1)
        T, S = q.shape[1], k.shape[1]
        scores = q @ k.transpose(-2, -1) / self.C**0.5  # (B, T, S)
        blocked = torch.ones(T, S, dtype=torch.bool).triu(S - T + 1)
        return x + scores.masked_fill(blocked, float("-inf")).softmax(-1) @ v, (k, v)


class OffsetBlock(PastBlock):
    """The cache returned only when asked, the step's first position given (s66 unseen set)."""

    def forward(self, x, kv_cache=None, position_offset=0, return_cache=False):
        y, cache = self.step(x, kv_cache, position_offset if self.offset else 0)
        return (y, cache) if return_cache else y


class StartPosBlock(PastBlock):
    """``forward(x, start_pos, kv_cache)`` returning ``(y, cache)`` (s92 unseen set: the cache
    was never passed back, ``start_pos`` driven alone: a false PASS)."""

    def forward(self, x, start_pos=0, kv_cache=None):
        return self.step(x, kv_cache, start_pos if self.offset else 0)


class HeldBlock(PastBlock):
    """The same arguments, the cache held by the block and ``kv_cache`` never used."""

    def forward(self, x, start_pos=0, kv_cache=None):
        y, self.held = self.step(x, self.held if start_pos else None, start_pos * self.offset)
        return y


@pytest.mark.parametrize("offset", [True, False])
@pytest.mark.parametrize(
    "kind, api",
    [(PastBlock, "past_key_value"), (OffsetBlock, "kv_cache"), (StartPosBlock, "kv_cache"),
     (HeldBlock, "kv_cache")],
)  # fmt: skip
def test_a_past_key_value_cache_is_driven(offset, kind, api):
    block = kind(offset).double()
    x = torch.randn(2, 5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    assert cache_api(block) == api and api in CACHE_APIS

    def error(y, ref):
        return float((y - ref).abs().max() / ref.abs().max())

    def shifted(positions):  # the block on x with its tokens rotated at these positions
        q, k = block.q(x), block.k(x)
        q = torch.cat([block.rotate(q[:, i : i + 1], int(p)) for i, p in enumerate(positions)], 1)
        k = torch.cat([block.rotate(k[:, i : i + 1], int(p)) for i, p in enumerate(positions)], 1)
        scores = (q @ k.transpose(-2, -1) / 8**0.5).masked_fill(torch.ones(5, 5).triu(1) > 0, float("-inf"))  # fmt: skip
        return x + scores.softmax(-1) @ x

    with torch.no_grad():
        whole = block(x)[0] if kind is StartPosBlock else block(x)
        assert error(shifted(torch.arange(5)), whole) < 1e-12  # the reference is the block
        found = judge_cache(*drive_cache(block, x), x, shifted)
    assert ("rotated as position 0" in found.note) is (not offset), found.note
    assert bool(found.offset) is (not offset)
    if offset:
        assert "equals the whole sequence" in found.note


class _WeightsFirst(PastBlock):
    """``(y, attention weights, cache)``, the cache last (s103 unseen set: not driven, unsaid)."""

    def forward(self, x, past_key_value=None, use_cache=False):
        y, cache = self.step(
            x, past_key_value, 0 if past_key_value is None else past_key_value[0].shape[1]
        )
        return (y, torch.ones(1), cache) if use_cache else y


def test_the_cache_is_the_last_item_of_the_tuple_a_prefix_returns():
    x = torch.randn(2, 5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    found = judge_cache(*drive_cache(_WeightsFirst().double(), x), x, None)
    assert "equals the whole sequence" in found.note, found.note


class _CachedLesson(nn.Module):
    """The lessons' block whose attention writes k and v into registered buffers and reads them
    back (Meta's Llama's KV cache, never detached): right under torch.no_grad, where it runs;
    ``scale=False``: without 1/sqrt(hs); ``buffers=False``: plain float32 attributes, as Meta's,
    copied to the input's dtype in the forward pass."""

    def __init__(self, n_embd=32, n_head=4, scale=True, buffers=True):
        super().__init__()
        self.nh, self.hs, self.scale = n_head, n_embd // n_head, scale
        self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(n_embd, n_embd) for _ in range(4))
        self.ffwd = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd), nn.ReLU(), nn.Linear(4 * n_embd, n_embd)
        )
        for name in ("cache_k", "cache_v"):
            cache = torch.zeros(64, n_head, 64, n_embd // n_head)
            self.register_buffer(name, cache) if buffers else setattr(self, name, cache)

    def attend(self, x, start_pos):
        B, T, C = x.shape
        # (B, T, C) -> (B, nh, T, hs) each
        q, k, v = (
            w(x).view(B, T, self.nh, self.hs).transpose(1, 2) for w in (self.wq, self.wk, self.wv)
        )
        self.cache_k = self.cache_k.to(x.dtype)
        self.cache_v = self.cache_v.to(x.dtype)
        self.cache_k[:B, :, start_pos : start_pos + T] = k
        self.cache_v[:B, :, start_pos : start_pos + T] = v
        k, v = self.cache_k[:B, :, : start_pos + T], self.cache_v[:B, :, : start_pos + T]
        att = q @ k.transpose(-2, -1) / (self.hs**0.5 if self.scale else 1.0)
        later = torch.ones(T, start_pos + T, dtype=torch.bool).triu(start_pos + 1)
        y = att.masked_fill(later, float("-inf")).softmax(-1) @ v  # (B, nh, T, hs)
        return self.wo(y.transpose(1, 2).reshape(B, T, C))

    def forward(self, x, start_pos=0):
        x = x + self.attend(self.ln1(x), start_pos)
        return x + self.ffwd(self.ln2(x))


class _AttentionKept(_CachedLesson):
    """Keeps its attention weights (with their graph) to plot them: a second call overwrites them."""

    def attend(self, x, start_pos):
        B, T, C = x.shape
        q, k, v = (
            w(x).view(B, T, self.nh, self.hs).transpose(1, 2) for w in (self.wq, self.wk, self.wv)
        )
        later = torch.ones(T, T, dtype=torch.bool).triu(1)
        self.att = (
            (q @ k.transpose(-2, -1) / self.hs**0.5).masked_fill(later, float("-inf")).softmax(-1)
        )
        return self.wo((self.att @ v).transpose(1, 2).reshape(B, T, C))


def test_a_kv_cache_in_buffers_is_read_through_and_its_kept_graph_said():
    # (s65 unseen set: Meta-style layers) was UNVERIFIED, roles unread through the buffers, then
    # FAIL inplace for the graph the cache keeps between training steps
    for buffers in (True, False):
        report = check_block(_CachedLesson, buffers=buffers)
        said = {f.name: f.message for f in report.findings}
        assert report.verdict == "PASS", str(report)
        assert "kept in cache_k, cache_v" in said["gradients"], said["gradients"]
        assert any("read from the forward pass" in n for n in report.notes), report.notes
        assert check_block(_CachedLesson, scale=False, buffers=buffers).diagnosis == ["no_scaling"]


class _StepUnscaled(_CachedLesson):
    """Right on whole sequences, its cached steps unscaled (s102 unseen set: a plain block's
    cache was never driven, a false PASS)."""

    def forward(self, x, start_pos=0):
        self.scale = start_pos == 0
        return super().forward(x, start_pos)


class _NoCacheKept(_CachedLesson):
    """``start_pos`` taken, no cache kept: a call sees only its own keys (the public zoo's
    gpt-fast, reduced): not counted, since that is how the checker's drive would read a cache
    API it drives otherwise than the block expects."""

    def attend(self, x, start_pos):
        return super().attend(x, 0)


def test_a_plain_blocks_cached_step_is_compared_too():
    report = check_block(_CachedLesson)
    assert any("equals the whole sequence" in n for n in report.notes), str(report)
    report = check_block(_StepUnscaled)
    (failed,) = [f for f in report.findings if not f.passed]
    assert report.verdict == "FAIL" and failed.name == "reference comparison", str(report)
    assert failed.message.startswith("equal on whole sequences, but one cached step at position")
    report = check_block(_NoCacheKept)
    assert report.verdict == "PASS", str(report)
    assert any("as without the prefix: no cache kept (not counted)" in n for n in report.notes)


def test_a_kept_graph_is_said_isolated_too(tmp_path):
    path = tmp_path / "cached_lesson.py"
    path.write_text("import torch\nimport torch.nn as nn\n\n" + inspect.getsource(_CachedLesson))
    (report,) = check_isolated([f"{path}:_CachedLesson"], kwargs={}, roles={})
    said = {f.name: f.message for f in report.findings}
    assert report.verdict == "PASS" and "kept in cache_k" in said["gradients"], str(report)


def test_attention_weights_kept_to_plot_are_no_kept_graph():
    report = check_block(_AttentionKept)
    said = {f.name: f.message for f in report.findings}
    assert report.verdict == "PASS" and "second call" not in said["gradients"], str(report)


HF = zoo_modern.load("hf_llama")


class _TupleCachedLlama(HF.LlamaDecoderLayer):
    """Hugging Face's decoder layer as its older API has it: ``forward(hidden_states,
    past_key_value, use_cache)`` returning ``(hidden_states, cache)``, the positions offset by
    the cache's length (``offset=False``: from 0, ``rope_cache_offset``)."""

    def __init__(self, offset=True, **kw):
        super().__init__(**kw)
        self.offset = offset

    def forward(self, hidden_states, past_key_value=None, use_cache=False):
        (B, T, _), a = hidden_states.shape, self.self_attn
        P = 0 if past_key_value is None else past_key_value[0].shape[2]
        at = torch.arange(P if self.offset else 0, (P if self.offset else 0) + T)
        cos, sin = self.rotary_emb(hidden_states, at[None].expand(B, T))
        h = self.input_layernorm(hidden_states)
        q, k, v = (p(h).view(B, T, -1, a.head_dim).transpose(1, 2) for p in (a.q_proj, a.k_proj, a.v_proj))  # fmt: skip
        q, k = HF.apply_rotary_pos_emb(q, k, cos, sin)
        if past_key_value is not None:  # (B, nkv, P + T, hs)
            k, v = torch.cat([past_key_value[0], k], 2), torch.cat([past_key_value[1], v], 2)
        g, keep = a.num_key_value_groups, torch.ones(T, P + T, dtype=torch.bool).tril(P)
        y = F.scaled_dot_product_attention(q, HF.repeat_kv(k, g), HF.repeat_kv(v, g), keep)
        x = hidden_states + a.o_proj(y.transpose(1, 2).reshape(B, T, -1))
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, ((k, v) if use_cache else None)


@pytest.mark.parametrize("offset", [True, False])
def test_a_block_returning_a_tuple_has_its_cache_driven(offset):
    # (s71 unseen set: MiniMind's layer) the tuple's first item taken as the output hid the
    # forward's past_key_value: "cache: not probed", and a rope_cache_offset mutant PASSed
    report = check_block(_TupleCachedLlama, offset=offset, **HF.ARGS)
    cache = [n for n in report.notes if n.startswith("cache (past_key_value)")]
    assert len(cache) == 1, str(report)
    assert report.diagnosis == ([] if offset else ["rope_cache_offset"]), str(report)
