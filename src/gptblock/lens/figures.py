"""Figures of one ``PromptInspection``: attention heatmaps, direct logit attribution, logit lens.

Each function returns a matplotlib ``Figure`` on the Agg canvas (no pyplot state, no display);
``save_figures`` writes the three as PNGs, each atomically.

Example:
    >>> from gptblock import GPT, GPTConfig, CharTokenizer
    >>> from gptblock.lens import inspect_prompt
    >>> tok = CharTokenizer.from_text("abc ")
    >>> model = GPT(GPTConfig(vocab_size=4, block_size=8, n_layer=2, n_head=2, n_embd=16))
    >>> seen = inspect_prompt(model, tok, "ab c")
    >>> fig = attention_figure(seen)          # a notebook shows it as it is
    >>> len([ax for ax in fig.axes if ax.images])   # 2 layers x 2 heads
    4
    >>> import tempfile
    >>> [p.name for p in save_figures(seen, tempfile.mkdtemp())]
    ['attention.png', 'attribution.png', 'logit_lens.png']
"""

from __future__ import annotations

import io
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..files import atomic_write_bytes, make_directory
from .report import PromptInspection, show_token

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "FIGURE_FILES",
    "attention_figure",
    "attribution_figure",
    "logit_lens_figure",
    "save_figures",
]

FIGURE_FILES = ("attention.png", "attribution.png", "logit_lens.png")
MAX_LABELS = 48  # beyond this many positions an axis labels every k-th one, or they overlap
DPI = 100


def attention_figure(inspection: PromptInspection) -> Figure:
    """Every head's attention pattern: a grid of heatmaps, layers by heads (row t: what
    position t attends to), titled with the head's mean entropy."""
    L, nh, T = inspection.n_layer, inspection.n_head, len(inspection.tokens)
    side = min(max(0.11 * T, 2.2), 6.0)  # inches per heatmap: the labels need room
    fig = _figure(nh * side + 1.2, L * side + 0.8)
    axes = fig.subplots(L, nh, squeeze=False)
    entropy = {(s.layer, s.head): s.entropy for s in inspection.heads}
    for i in range(L):
        pattern = inspection.pattern(i).detach().cpu().double().numpy()  # (nh, T, T)
        for n in range(nh):
            ax = axes[i][n]
            ax.imshow(pattern[n], vmin=0.0, vmax=1.0, cmap="viridis")
            ax.set_title(f"layer {i} head {n}: {entropy[i, n]:.2f} bits", fontsize=8)
            _label_positions(ax, inspection.tokens, "x", fontsize=6)
            _label_positions(ax, inspection.tokens, "y", fontsize=6)
            if i == L - 1:
                ax.set_xlabel("attends to", fontsize=7)
            if n == 0:
                ax.set_ylabel("position", fontsize=7)
    fig.colorbar(axes[0][0].images[0], ax=axes, shrink=0.6, label="attention weight")
    fig.suptitle(f"attention on {_quoted(inspection.prompt)}", fontsize=10)
    return fig


def attribution_figure(inspection: PromptInspection) -> Figure:
    """The direct logit attribution of the predicted token, one bar per component."""
    a = inspection.attribution
    values = a.values.cpu().double().numpy()
    fig = _figure(7.0, 1.4 + 0.22 * len(values))
    ax = fig.add_subplot()
    colours = ["tab:blue" if v >= 0 else "tab:red" for v in values]
    ax.barh(range(len(values)), values, color=colours)
    ax.set_yticks(range(len(values)), a.labels, fontsize=7)
    ax.invert_yaxis()  # the embedding on top, then the layers in order
    ax.axvline(0.0, color="black", linewidth=0.6)
    ax.set_xlabel("direct contribution to the logit")
    token = show_token(inspection.vocab[a.token])
    ax.set_title(
        f"why {token!r} after {_quoted(inspection.prompt)}: logit {a.logit:.3f} = "
        f"bars {values.sum():.3f} + biases {a.bias:.3f}",
        fontsize=9,
    )
    ax.grid(axis="x", alpha=0.3)
    return fig


def logit_lens_figure(inspection: PromptInspection) -> Figure:
    """The logit lens: at each position, each layer's likeliest next token and its probability."""
    lens = inspection.lens
    top = lens.probs.max(dim=-1)  # values, indices: (L + 1, T) each
    probs = top.values.cpu().double().numpy()
    stages, T = probs.shape
    fig = _figure(min(max(2.5 + 0.32 * T, 6.0), 40.0), 1.6 + 0.4 * stages)
    ax = fig.add_subplot()
    image = ax.imshow(probs, vmin=0.0, vmax=1.0, cmap="magma", aspect="auto")
    if T <= 2 * MAX_LABELS:
        for s in range(stages):
            for t in range(T):
                text = show_token(inspection.vocab[int(top.indices[s, t])])
                colour = "black" if probs[s, t] > 0.6 else "white"
                ax.text(t, s, text, ha="center", va="center", fontsize=7, color=colour)
    ax.set_yticks(range(stages), lens.labels, fontsize=8)
    _label_positions(ax, inspection.tokens, "x", fontsize=7)
    ax.set_xlabel("position (the token read so far)")
    ax.set_title(
        f"logit lens on {_quoted(inspection.prompt)}: the likeliest next token", fontsize=9
    )
    fig.colorbar(image, ax=ax, label="its probability")
    return fig


def save_figures(inspection: PromptInspection, directory: str | os.PathLike[str]) -> list[Path]:
    """Write the three figures into ``directory`` (made if missing); return the paths."""
    out = make_directory(directory)
    paths = []
    for name, draw in zip(
        FIGURE_FILES, (attention_figure, attribution_figure, logit_lens_figure), strict=True
    ):
        buf = io.BytesIO()
        draw(inspection).savefig(buf, format="png")
        atomic_write_bytes(out / name, buf.getvalue())
        paths.append(out / name)
    return paths


def _figure(width: float, height: float) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # constrained layout makes room for the colour bars and every label
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _quoted(prompt: str, keep: int = 40) -> str:
    return repr(prompt) if len(prompt) <= keep else "..." + repr(prompt[-keep:])


def _label_positions(ax: Axes, tokens: tuple[str, ...], axis: str, fontsize: float) -> None:
    step = max(1, math.ceil(len(tokens) / MAX_LABELS))
    at = list(range(0, len(tokens), step))
    labels = [show_token(tokens[t]) for t in at]
    if axis == "x":
        ax.set_xticks(at, labels, fontsize=fontsize)
    else:
        ax.set_yticks(at, labels, fontsize=fontsize)
