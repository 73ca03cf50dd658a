"""One rule for every file gptblock writes: a temporary file beside it, fsynced, renamed over it."""

import os

import pytest
import torch

from gptblock import files
from gptblock.bench.report import write_json
from gptblock.files import atomic_write_bytes
from gptblock.runs.checkpoint import save_checkpoint
from gptblock.train.log import save_loss_plot


def test_checkpoints_the_loss_plot_and_bench_json_all_go_through_files(tmp_path, monkeypatch):
    renamed = []
    real_replace = os.replace

    def replace(src, dst):
        renamed.append((os.path.basename(src), os.path.basename(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(files.os, "replace", replace)
    save_checkpoint(tmp_path, "last", {"w": torch.ones(2)}, {"step": 1})
    save_loss_plot([2.0, 1.5], [{"step": 1, "train": 1.6, "val": 1.7}], tmp_path / "loss.png")
    write_json({"a": 1}, tmp_path / "bench.json")
    targets = [dst for _, dst in renamed]
    assert targets[1:] == ["last.json", "loss.png", "bench.json"]
    assert targets[0].startswith("last-00000001-") and targets[0].endswith(".safetensors")
    for src, dst in renamed:  # the same temporary-file rule for all of them
        assert src.startswith(f".{dst}.") and src.endswith(".tmp")


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "x.bin"
    atomic_write_bytes(path, b"old")

    def fail(fd):
        raise OSError("disk full")

    monkeypatch.setattr(files.os, "fsync", fail)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_bytes(path, b"new")
    assert path.read_bytes() == b"old" and sorted(os.listdir(tmp_path)) == ["x.bin"]


def test_new_files_get_the_umasks_permissions(tmp_path):
    old = os.umask(0o027)
    try:
        atomic_write_bytes(tmp_path / "x", b"1")
    finally:
        os.umask(old)
    assert (tmp_path / "x").stat().st_mode & 0o777 == 0o640
