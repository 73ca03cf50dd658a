"""``gptblock inspect``: a trained run, one prompt, its numbers printed, figures and a page."""

import pathlib
import re

import pytest
import torch

from gptblock import load_gpt
from gptblock.cli import main
from gptblock.lens import FIGURE_FILES, inspect_prompt

FIXTURE_RUN = pathlib.Path(__file__).parent / "fixtures" / "run-v1"  # written by `gptblock train`
PROMPT = "The block "


def test_inspect_prints_what_the_library_reads(capsys):
    assert main(["inspect", "--out", str(FIXTURE_RUN), "--prompt", PROMPT, "--top-k", "3"]) == 0
    out = capsys.readouterr().out
    model, tok, _ = load_gpt(FIXTURE_RUN)
    seen = inspect_prompt(model, tok, PROMPT, top_k=3)
    block = out.split("next token  probability\n")[1].split("\n\n")[0].splitlines()
    assert block == [f"  {seen.vocab[i]!r:<9} {p:.3f}" for i, p in seen.top]
    lens = out.split("read as the output\n")[1].split("\n\n")[0].splitlines()
    assert [line.split()[0] for line in lens] == ["embed", "layer"]
    with torch.no_grad():
        final = model(torch.tensor([tok.encode(PROMPT)])).logits[0, -1].softmax(-1)
    assert lens[-1].endswith(f"{float(final.max()):.3f}")  # the last layer's reading is the output
    heads = out.split("last position attends most to\n")[1].strip().splitlines()
    assert len(heads) == 2 and re.match(r"  0     1     \d\.\d\d ", heads[1])
    assert "step 6, n_layer 1, n_head 2" in out
    assert "direct logit attribution of" in out


def test_inspect_writes_figures_and_a_page(tmp_path, capsys):
    png, page = tmp_path / "figures", tmp_path / "page.html"
    args = ["inspect", "--out", str(FIXTURE_RUN), "--prompt", PROMPT]
    assert main([*args, "--png", str(png), "--html", str(page)]) == 0
    for name in FIGURE_FILES:
        assert (png / name).read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert page.read_text().startswith("<!DOCTYPE html>")
    out = capsys.readouterr().out
    assert f"wrote {page}" in out and f"wrote {png / 'attention.png'}" in out


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--prompt", "x" * 17], "the prompt is 17 tokens long and the model reads at most"),
        (["--prompt", "\x01"], "outside the vocabulary"),
        (["--prompt", ""], "the prompt must not be empty"),
        (["--prompt", "a", "--top-k", "0"], "top_k must be a positive int, got 0"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(argv, message, capsys):
    assert main(["inspect", "--out", str(FIXTURE_RUN), *argv]) == 2
    # The fixture is a format-1 run: loading it warns once (that its JSON has no hash).
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ": warning: " not in ln]
    assert len(lines) == 1, lines
    assert lines[0].startswith("gptblock inspect: error: ") and message in lines[0]


def test_a_missing_run_and_an_unwritable_page_are_one_line(tmp_path, capsys):
    assert main(["inspect", "--out", str(tmp_path / "none"), "--prompt", "a"]) == 2
    assert "gptblock inspect: error: no best checkpoint" in capsys.readouterr().err
    args = ["inspect", "--out", str(FIXTURE_RUN), "--prompt", "a"]
    assert main([*args, "--html", str(tmp_path / "no" / "such" / "dir" / "p.html")]) == 2
    assert "gptblock inspect: error: " in capsys.readouterr().err


def test_help_shows_the_defaults(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # one line per option
    with pytest.raises(SystemExit):
        main(["inspect", "--help"])
    out = capsys.readouterr().out
    assert "(default: out-gptblock)" in out and "--png DIR" in out and "--html FILE" in out
