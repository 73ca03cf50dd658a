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
    return (
        _PAGE.replace("%TITLE%", html.escape(f"attention on {inspection.prompt!r}"))
        .replace("%STYLE%", _STYLE)
        .replace("%SCRIPT%", _SCRIPT)
        .replace("%DATA%", data)
    )


def save_attention_page(inspection: PromptInspection, path: str | os.PathLike[str]) -> None:
    """Write ``attention_page(inspection)`` to ``path``, atomically."""
    atomic_write_bytes(path, attention_page(inspection).encode("utf-8"))


_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy"
      content="default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>%TITLE%</title>
<style>%STYLE%</style>
</head>
<body>
<h1>Attention on <code id="title"></code></h1>
<p class="help">Pick a layer and a head, then hover a character to see what it attends to
(click it to keep it). Each character it may attend to is tinted by its attention weight,
written beneath it.</p>
<div class="controls">
  <label>layer <select id="layer"></select></label>
  <label>head <select id="head"></select></label>
  <span id="summary"></span>
</div>
<div id="prompt"></div>
<p id="detail"></p>
<div class="row">
  <canvas id="grid" width="320" height="320"></canvas>
  <div class="side">
    <p>The head's whole pattern: row t is what position t attends to; the outlined row is the
    selected character.</p>
    <p id="next"></p>
  </div>
</div>
<script id="data" type="application/json">%DATA%</script>
<script>%SCRIPT%</script>
</body>
</html>
"""

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; max-width: 70em; }
h1 { font-size: 1.3em; }
.help, .side { color: #555; font-size: 0.9em; }
.controls { margin: 1em 0; display: flex; gap: 1.5em; align-items: center; }
#prompt { display: flex; flex-wrap: wrap; gap: 2px; margin: 1em 0; }
.tok { display: inline-flex; flex-direction: column; align-items: center; min-width: 2.6em;
       border: 1px solid #ddd; border-radius: 3px; cursor: pointer; padding: 2px 0; }
.tok .ch { font-family: ui-monospace, monospace; font-size: 1.3em; white-space: pre; }
.tok .w { font-family: ui-monospace, monospace; font-size: 0.7em; color: #333; min-height: 1.2em; }
.tok.future { color: #bbb; }
.tok.query { outline: 2px solid #c00; }
.row { display: flex; gap: 2em; align-items: flex-start; }
canvas { border: 1px solid #ccc; image-rendering: pixelated; }
"""

_SCRIPT = """
"use strict";
const data = JSON.parse(document.getElementById("data").textContent);
const T = data.tokens.length;
const layerSel = document.getElementById("layer");
const headSel = document.getElementById("head");
const cells = [];
let query = T - 1;
let pinned = false;

function option(select, value, text) {
  const o = document.createElement("option");
  o.value = String(value);
  o.textContent = text;
  select.appendChild(o);
}

function weights(t) {  // query t's weights on positions 0..t, in [0, 1]
  const row = data.pattern[Number(layerSel.value)][Number(headSel.value)][t];
  return row.map((n) => n / data.scale);
}

function fillHeads() {
  const keep = headSel.value || "0";
  headSel.textContent = "";
  const l = Number(layerSel.value);
  for (let h = 0; h < data.heads; h++) {
    option(headSel, h, h + " (" + data.entropy[l][h].toFixed(2) + " bits)");
  }
  headSel.value = keep;
}

function render() {
  const l = Number(layerSel.value), h = Number(headSel.value);
  const w = weights(query);
  cells.forEach((cell, j) => {
    const shown = j <= query;
    cell.classList.toggle("future", !shown);
    cell.classList.toggle("query", j === query);
    cell.style.background = shown ? "rgba(230, 90, 0, " + w[j].toFixed(3) + ")" : "transparent";
    cell.querySelector(".w").textContent = shown ? w[j].toFixed(3) : "";
  });
  document.getElementById("summary").textContent = "mean entropy " +
    data.entropy[l][h].toFixed(2) + " bits, mean distance back " +
    data.distance[l][h].toFixed(2) + " positions";
  const best = w.map((v, j) => [v, j]).sort((a, b) => b[0] - a[0]).slice(0, 3);
  document.getElementById("detail").textContent = "Position " + query + " (" +
    data.tokens[query] + ") attends most to " +
    best.map(([v, j]) => "position " + j + " (" + data.tokens[j] + ") " + v.toFixed(3))
      .join(", ");
  drawGrid();
}

function drawGrid() {
  const canvas = document.getElementById("grid");
  const cell = Math.max(2, Math.floor(320 / T));
  canvas.width = canvas.height = cell * T;
  const g = canvas.getContext("2d");
  g.fillStyle = "#fff";
  g.fillRect(0, 0, canvas.width, canvas.height);
  for (let t = 0; t < T; t++) {
    weights(t).forEach((v, j) => {
      g.fillStyle = "rgba(230, 90, 0, " + v.toFixed(3) + ")";
      g.fillRect(j * cell, t * cell, cell, cell);
    });
  }
  g.strokeStyle = "#c00";
  g.lineWidth = 1;
  g.strokeRect(0.5, query * cell + 0.5, canvas.width - 1, cell - 1);
}

function select(t, pin) {
  if (pinned && !pin) return;
  if (pin) pinned = !(pinned && query === t);
  query = t;
  render();
}

document.getElementById("title").textContent = data.prompt;
for (let l = 0; l < data.layers; l++) option(layerSel, l, String(l));
fillHeads();
data.tokens.forEach((text, t) => {
  const cell = document.createElement("span");
  cell.className = "tok";
  cell.dataset.pos = String(t);
  const ch = document.createElement("span");
  ch.className = "ch";
  ch.textContent = text;
  const w = document.createElement("span");
  w.className = "w";
  cell.append(ch, w);
  cell.addEventListener("mouseenter", () => select(t, false));
  cell.addEventListener("click", () => select(t, true));
  document.getElementById("prompt").appendChild(cell);
  cells.push(cell);
});
layerSel.addEventListener("change", () => { fillHeads(); render(); });
headSel.addEventListener("change", render);
document.getElementById("next").textContent = "The model's next token: " +
  data.next.map(([text, p]) => text + " " + p.toFixed(3)).join("   ");
render();
document.body.dataset.ready = "1";
"""
