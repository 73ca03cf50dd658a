"""The attention viewer: one self-contained HTML page for one ``PromptInspection``.

Pick a layer and a head, hover (or click) a character: what it attends to is tinted by weight,
and the head's pattern is drawn as a heatmap. Everything is inline and the page's
Content-Security-Policy forbids fetching; the prompt goes in as text (``textContent``) and the
JSON cannot close its ``<script>``, so any prompt is safe to show.

Example:
    >>> from gptblock import GPT, GPTConfig, CharTokenizer
    >>> from gptblock.lens import inspect_prompt
    >>> tok = CharTokenizer.from_text("ab</script>")
    >>> config = GPTConfig(vocab_size=tok.vocab_size, block_size=16, n_layer=1, n_head=2, n_embd=8)
    >>> model = GPT(config)
    >>> page = attention_page(inspect_prompt(model, tok, "a</script>b"))
    >>> page.startswith("<!DOCTYPE html>"), page.count("</script>")   # the page's own two
    (True, 2)
    >>> len(page_data(inspect_prompt(model, tok, "ab"))["pattern"][0][1])  # layer 0, head 1
    2
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path
from typing import Any

from ..files import atomic_write_bytes
from .report import PromptInspection, show_token

__all__ = ["attention_page", "page_data", "save_attention_page"]

SCALE = 1000  # weights are stored as integer thousandths: the page shows 3 decimals


def page_data(inspection: PromptInspection) -> dict[str, Any]:
    """What the page embeds; ``pattern[layer][head][t]``: query t's weights on 0..t, in 1/1000."""
    L, nh = inspection.n_layer, inspection.n_head
    patterns = []
    for i in range(L):
        p = inspection.pattern(i).detach().cpu().double()  # (nh, T, T)
        thousandths = (p * SCALE).round().long().tolist()
        patterns.append([[row[: t + 1] for t, row in enumerate(head)] for head in thousandths])
    summary = {(s.layer, s.head): s for s in inspection.heads}
    return {
        "prompt": inspection.prompt,
        "tokens": [show_token(t) for t in inspection.tokens],
        "layers": L,
        "heads": nh,
        "scale": SCALE,
        "pattern": patterns,
        "entropy": [[round(summary[i, n].entropy, 3) for n in range(nh)] for i in range(L)],
        "distance": [[round(summary[i, n].distance, 3) for n in range(nh)] for i in range(L)],
        "next": [[show_token(inspection.vocab[i]), round(p, 4)] for i, p in inspection.top],
    }


def attention_page(inspection: PromptInspection) -> str:
    """The page's HTML, one string with everything inline."""
    data = json.dumps(page_data(inspection), ensure_ascii=False, separators=(",", ":"))
    data = data.replace("<", "\\u003c")  # JSON's own escape: the data can never end its <script>
    # The page's HTML, style and script, with the title and the data to fill in.
    page = (Path(__file__).parent / "page.html").read_text(encoding="utf-8")
    title = html.escape(f"attention on {inspection.prompt!r}")
    return page.replace("%TITLE%", title).replace("%DATA%", data)


def save_attention_page(inspection: PromptInspection, path: str | os.PathLike[str]) -> None:
    """Write ``attention_page(inspection)`` to ``path``, atomically."""
    atomic_write_bytes(path, attention_page(inspection).encode("utf-8"))
