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

LECTURE = (Path(__file__).parent / "zoo_public" / "blocks" / "ng_video_lecture.py").read_text()
CELLS = [
    "import gptblock",
    LECTURE.partition("class Head")[0],  # torch imported, the sizes set
    "class Head" + LECTURE.partition("class Head")[2].partition("# ----- the zoo's")[0],
    "gptblock.check_block(Block, d_model=32, nhead=4)",  # the README's call, as written
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
