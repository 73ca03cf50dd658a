"""The checker in a real Jupyter kernel (nbclient, ipykernel): a lesson Block defined in a cell,
checked in process and isolated (its source taken from the cell: the child cannot import a
kernel's ``__main__``), the README's call as written, and the report shown as HTML.

One kernel, one notebook; the kernel talks to this process over IPC files, not a network port.
"""

import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
from jupyter_client.manager import KernelManager  # noqa: E402  (after the skips)

SRC = Path(__file__).resolve().parents[1] / "src"

CELLS = [
    """
import torch
import torch.nn as nn
from torch.nn import functional as F
import gptblock

n_embd, block_size, dropout = 32, 16, 0.1
""",
    """
class Head(nn.Module):
    def __init__(self, head_size):
        super().__init__()
        self.key = nn.Linear(n_embd, head_size, bias=False)
        self.query = nn.Linear(n_embd, head_size, bias=False)
        self.value = nn.Linear(n_embd, head_size, bias=False)
        self.register_buffer('tril', torch.tril(torch.ones(block_size, block_size)))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        B, T, C = x.shape
        k, q = self.key(x), self.query(x)
        wei = q @ k.transpose(-2, -1) * k.shape[-1] ** -0.5
        wei = wei.masked_fill(self.tril[:T, :T] == 0, float('-inf'))
        return self.dropout(F.softmax(wei, dim=-1)) @ self.value(x)


class MultiHeadAttention(nn.Module):
    def __init__(self, num_heads, head_size):
        super().__init__()
        self.heads = nn.ModuleList([Head(head_size) for _ in range(num_heads)])
        self.proj = nn.Linear(head_size * num_heads, n_embd)

    def forward(self, x):
        return self.proj(torch.cat([h(x) for h in self.heads], dim=-1))
""",
    """
class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.sa = MultiHeadAttention(n_head, n_embd // n_head)
        self.ffwd = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.ReLU(),
                                  nn.Linear(4 * n_embd, n_embd))
        self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)

    def forward(self, x):
        x = x + self.sa(self.ln1(x))
        return x + self.ffwd(self.ln2(x))
""",
    "gptblock.check_block(Block, d_model=32, nhead=4)",
    "gptblock.check_block(Block, d_model=32, nhead=4, isolate=True)",
]


def test_a_block_of_a_notebook_cell_is_checked_in_process_and_isolated(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    km = KernelManager(kernel_name="python3", transport="ipc", ip=str(tmp_path / "kernel"))
    client = nbclient.NotebookClient(nb, km=km, timeout=120, allow_errors=True)
    path = os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH")) if p)
    client.execute(env={**os.environ, "PYTHONPATH": path}, cwd=str(tmp_path))
    for cell, where in zip(nb.cells[-2:], ("in process", "isolated"), strict=True):
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert not errors, f"{where}: {errors[0].ename}: {errors[0].evalue}"
        data = cell.outputs[-1].data
        html, plain = data["text/html"], data["text/plain"]
        assert plain.startswith("<CheckReport PASS: Block(n_embd=32, n_head=4), 8 of 8"), plain
        assert "<table>" in html and "reference comparison" in html, html
        assert "<b>result: PASS</b>" in html and "Block(n_embd=32, n_head=4)" in html, html
