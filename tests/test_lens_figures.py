"""gptblock.lens.report and .figures: one prompt read out, and figures that plot its numbers."""

import pathlib

import numpy as np
import pytest
import torch
from matplotlib.figure import Figure

from gptblock import CharTokenizer, load_gpt
from gptblock.errors import UserTypeError, UserValueError
from gptblock.lens import (
    FIGURE_FILES,
    attention_figure,
    attribution_figure,
    direct_logit_attribution,
    inspect_prompt,
    logit_lens_figure,
    save_figures,
    show_token,
)
from lens_models import lens_gpt

FIXTURE_RUN = pathlib.Path(__file__).parent / "fixtures" / "run-v1"
PROMPT = "The block "
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def trained():
    model, tok, _ = load_gpt(FIXTURE_RUN)  # a run saved by `gptblock train`
    return model, tok, inspect_prompt(model, tok, PROMPT, top_k=4)


def test_inspect_prompt_reads_one_forward_pass(trained):
    model, tok, seen = trained
    idx = torch.tensor([tok.encode(PROMPT)])
    with torch.no_grad():
        probs = model(idx).logits[0, -1].softmax(-1)
    assert seen.tokens == tuple(PROMPT) and len(seen.vocab) == model.config.vocab_size
    assert [i for i, _ in seen.top] == probs.topk(4).indices.tolist()
    np.testing.assert_allclose([p for _, p in seen.top], probs.topk(4).values, atol=1e-6)
    assert seen.attribution.token == seen.top[0][0] and seen.attribution.position == 9
    expected = direct_logit_attribution(model, seen.run, seen.top[0][0])
    torch.testing.assert_close(seen.attribution.values, expected.values)
    assert len(seen.heads) == 2 and seen.n_layer == 1 and seen.n_head == 2


def test_inspect_prompt_refuses_what_it_cannot_read(trained):
    model, tok, _ = trained
    with pytest.raises(UserValueError, match="must not be empty"):
        inspect_prompt(model, tok, "")
    with pytest.raises(UserValueError, match="17 tokens long and the model reads at most"):
        inspect_prompt(model, tok, "a" * 17)
    with pytest.raises(UserValueError, match="outside the vocabulary"):
        inspect_prompt(model, tok, "\x00")
    with pytest.raises(UserValueError, match="top_k must be a positive int, got 0"):
        inspect_prompt(model, tok, "a", top_k=0)
    with pytest.raises(UserTypeError, match=r"prompt must be a str, got b'a' \(bytes\)"):
        inspect_prompt(model, tok, b"a")
    assert len(inspect_prompt(model, tok, "a", top_k=10_000).top) == model.config.vocab_size


def test_the_attention_figure_plots_the_cached_patterns(trained):
    _, _, seen = trained
    fig = attention_figure(seen)
    assert isinstance(fig, Figure)
    heatmaps = [ax for ax in fig.axes if ax.images and ax.get_title()]
    assert len(heatmaps) == seen.n_layer * seen.n_head
    for ax, (layer, head) in zip(heatmaps, [(0, 0), (0, 1)], strict=True):
        expected = seen.run.cache[f"blocks.{layer}.pattern"][0, head].numpy()
        np.testing.assert_array_equal(np.asarray(ax.images[0].get_array()), expected)
        assert ax.get_title().startswith(f"layer {layer} head {head}: ")
        assert [t.get_text() for t in ax.get_xticklabels()] == [show_token(c) for c in PROMPT]
        assert [t.get_text() for t in ax.get_yticklabels()] == [show_token(c) for c in PROMPT]


def test_the_attribution_figure_plots_the_attribution(trained):
    _, _, seen = trained
    ax = attribution_figure(seen).axes[0]
    widths = [bar.get_width() for bar in ax.patches]
    np.testing.assert_allclose(widths, seen.attribution.values.numpy(), atol=0, rtol=0)
    assert [t.get_text() for t in ax.get_yticklabels()] == list(seen.attribution.labels)


def test_the_logit_lens_figure_plots_each_layers_top_token(trained):
    _, _, seen = trained
    ax = logit_lens_figure(seen).axes[0]
    top = seen.lens.probs.max(dim=-1)
    np.testing.assert_array_equal(np.asarray(ax.images[0].get_array()), top.values.numpy())
    texts = [t.get_text() for t in ax.texts]
    assert texts == [show_token(seen.vocab[i]) for i in top.indices.flatten().tolist()]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["embed", "layer 0"]


def test_save_figures_writes_pngs(trained, tmp_path):
    _, _, seen = trained
    out = tmp_path / "new" / "dir"
    paths = save_figures(seen, out)
    assert [p.name for p in paths] == list(FIGURE_FILES)
    for p in paths:
        assert p.read_bytes().startswith(PNG)
    assert sorted(p.name for p in out.iterdir()) == sorted(FIGURE_FILES)  # no temporary files
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError):
        save_figures(seen, tmp_path / "file")


def test_a_prompt_as_long_as_the_context_stays_readable():
    """64 positions, 2 x 2 heads: every heatmap labels at most MAX_LABELS positions."""
    text = "abcdefgh " * 8
    model = lens_gpt(block_size=64, vocab_size=9, n_head=2)
    seen = inspect_prompt(model, CharTokenizer.from_text(text), text[:64])
    fig = attention_figure(seen)
    for ax in fig.axes[:4]:
        assert 16 <= len(ax.get_xticklabels()) <= 48
    assert fig.get_size_inches()[0] <= 2 * 6.0 + 1.2
    logit_lens_figure(seen)  # draws without error at full length


def test_show_token_makes_whitespace_visible():
    assert [show_token(c) for c in " \n\ta\x07"] == ["␣", "↵", "⇥", "a", "\\x07"]
