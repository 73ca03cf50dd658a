"""Misuse, issue 21 class 3: a file that is not gptblock's is never replaced.

Every output flag (``inspect --html``, ``inspect --png``, ``bench --json``) is pointed at a
symbolic link to a user's file, a link to a link, a dangling link, a device node, a FIFO, a
directory, ``/dev/stdout``: a link is written through (the link stays, the file it names gets the
output), a device or a pipe is written to in place (the node stays a node), a directory is one
line and exit 2. The device node is a stand-in made with ``mknod`` in the test's directory, never
the machine's own ``/dev/null`` (as root, a regression would replace it for everyone). Every
other file's bytes are compared before and after. Then the run directory: a fresh ``train``
beside a stale lock deletes and overwrites only what a run recorded writing.
"""

import os
import stat
import threading
from pathlib import Path

import pytest

from gptblock.cli import bench as bench_cli
from gptblock.cli import main
from gptblock.data.text import default_corpus
from gptblock.files import atomic_write_bytes, check_destination
from gptblock.lens import FIGURE_FILES
from gptblock.runs.checkpoint import load_checkpoint
from gptblock.runs.owned import RECORD_FILE
from gptblock.runs.rundir import LOCK_FILE, LOSS_PLOT

FIXTURE_RUN = Path(__file__).parent / "fixtures" / "run-v1"
SMALL = [
    "--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16",
    "--batch-size", "4", "--max-iters", "2", "--eval-interval", "2", "--eval-iters", "1",
    "--warmup", "1", "--device", "cpu", "--no-progress", "--threads", "1",
]  # fmt: skip
USER = b"the user's own bytes\n"


def snapshot(directory):
    """Every entry under ``directory``: a link's target, a file's bytes, a node's kind."""
    out = {}
    for p in sorted(Path(directory).rglob("*")):
        if p.is_symlink():
            out[str(p)] = ("link", os.readlink(p))
        elif p.is_file():
            out[str(p)] = ("file", p.read_bytes())
        else:
            out[str(p)] = ("node", stat.S_IFMT(p.lstat().st_mode))
    return out


def one_line(err, command, *needles):
    lines = [ln for ln in err.splitlines() if ": warning: " not in ln]
    assert len(lines) == 1, err[-2000:]
    assert lines[0].startswith(f"gptblock {command}: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def null_device(directory):
    path = Path(directory) / "null"
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except (PermissionError, AttributeError):
        pytest.skip("mknod needs root (CAP_MKNOD)")
    return path


class FifoReader:
    """A FIFO and a thread reading it to the end, so a writer neither blocks nor fails."""

    def __init__(self, path):
        self.path, self.data = path, b""
        os.mkfifo(path)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        with open(self.path, "rb") as f:
            self.data = f.read()

    def result(self):
        self.thread.join(timeout=60)
        assert not self.thread.is_alive()
        return self.data


# --- the writer itself ----------------------------------------------------------------------


def test_a_link_is_written_through_and_stays_a_link(tmp_path):
    user = tmp_path / "mine.txt"
    user.write_bytes(USER)
    (tmp_path / "link").symlink_to(user)
    (tmp_path / "link2").symlink_to(tmp_path / "link")  # a chain
    atomic_write_bytes(tmp_path / "link2", b"new")
    assert (tmp_path / "link").is_symlink() and (tmp_path / "link2").is_symlink()
    assert user.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "link2", "mine.txt"]


def test_a_dangling_link_creates_the_file_it_names(tmp_path):
    (tmp_path / "link").symlink_to(tmp_path / "later.txt")
    atomic_write_bytes(tmp_path / "link", b"x")
    assert (tmp_path / "link").is_symlink() and (tmp_path / "later.txt").read_bytes() == b"x"


def test_a_link_into_a_missing_directory_is_one_line(tmp_path):
    (tmp_path / "link").symlink_to(tmp_path / "no" / "where.txt")
    with pytest.raises(FileNotFoundError, match=r"links to .* is not an existing directory"):
        check_destination(tmp_path / "link")


def test_a_device_stays_a_device(tmp_path):
    node = null_device(tmp_path)
    atomic_write_bytes(node, b"into nothing")
    assert stat.S_ISCHR(node.lstat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null"]  # no temporary left


def test_a_fifo_is_written_into_not_replaced(tmp_path):
    reader = FifoReader(tmp_path / "pipe")
    atomic_write_bytes(tmp_path / "pipe", b"through the pipe")
    assert reader.result() == b"through the pipe"
    assert stat.S_ISFIFO((tmp_path / "pipe").lstat().st_mode)


def test_a_socket_is_refused(tmp_path):
    import socket

    path = tmp_path / "sock"
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(path))
        with pytest.raises(ValueError, match="it is a socket"):
            atomic_write_bytes(path, b"x")
    finally:
        s.close()


def test_dev_stdout_is_written_in_place(capfd):
    atomic_write_bytes("/dev/stdout", b"to the stream\n")
    assert capfd.readouterr().out == "to the stream\n"


# --- every output flag ----------------------------------------------------------------------


def targets(tmp_path):
    """name -> (path to give, check after): each kind of destination that is not a new file."""
    user = tmp_path / "user.txt"
    user.write_bytes(USER)
    (tmp_path / "link").symlink_to(user)
    node = null_device(tmp_path)
    return user, tmp_path / "link", node


@pytest.fixture
def fake_bench(monkeypatch):
    # The destination is under test, not the benchmark: a result in no time.
    monkeypatch.setattr(bench_cli, "run_benchmark", lambda config, progress: {"ms": 1.5})
    monkeypatch.setattr(bench_cli, "format_table", lambda result: "table")


def test_bench_json_through_a_link_into_a_device_and_a_fifo(tmp_path, fake_bench, capsys):
    user, link, node = targets(tmp_path)
    assert main(["bench", "--json", str(link)]) == 0
    assert link.is_symlink() and b'"ms": 1.5' in user.read_bytes()
    assert main(["bench", "--json", str(node)]) == 0
    assert stat.S_ISCHR(node.lstat().st_mode)
    reader = FifoReader(tmp_path / "pipe")
    assert main(["bench", "--json", str(tmp_path / "pipe")]) == 0
    assert b'"ms": 1.5' in reader.result()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "null", "pipe", "user.txt"]


def test_bench_json_to_dev_stdout_follows_the_table(fake_bench, capfd):
    assert main(["bench", "--json", "/dev/stdout"]) == 0
    out = capfd.readouterr().out
    assert "table" in out and '"ms": 1.5' in out, out
    assert out.index("table") < out.index('"ms": 1.5')


@pytest.mark.parametrize("kind", ["directory", "link to a directory", "under a missing dir"])
def test_bench_json_that_cannot_be_a_file_is_one_line_and_nothing_changes(
    tmp_path, fake_bench, capsys, kind
):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "keep").write_bytes(USER)
    (tmp_path / "dl").symlink_to(tmp_path / "d")
    path = {
        "directory": tmp_path / "d",
        "link to a directory": tmp_path / "dl",
        "under a missing dir": tmp_path / "dl" / "no" / "x.json",
    }[kind]
    before = snapshot(tmp_path)
    assert main(["bench", "--json", str(path)]) == 2
    one_line(capsys.readouterr().err, "bench", "cannot write")
    assert snapshot(tmp_path) == before


def test_inspect_html_through_a_link_and_into_a_device(tmp_path, capsys):
    user, link, node = targets(tmp_path)
    args = ["inspect", "--out", str(FIXTURE_RUN), "--prompt", "The "]
    assert main([*args, "--html", str(link)]) == 0
    assert link.is_symlink() and user.read_bytes().startswith(b"<!DOCTYPE html>")
    assert main([*args, "--html", str(node)]) == 0
    assert stat.S_ISCHR(node.lstat().st_mode)
    reader = FifoReader(tmp_path / "pipe")
    assert main([*args, "--html", str(tmp_path / "pipe")]) == 0
    assert reader.result().startswith(b"<!DOCTYPE html>")


def test_inspect_png_into_links_and_refusing_a_file_for_a_directory(tmp_path, capsys):
    figures = tmp_path / "figures"
    figures.mkdir()
    user = tmp_path / "user.png"
    user.write_bytes(USER)
    (figures / FIGURE_FILES[0]).symlink_to(user)  # the user's picture, linked in
    args = ["inspect", "--out", str(FIXTURE_RUN), "--prompt", "The "]
    assert main([*args, "--png", str(figures)]) == 0
    assert (figures / FIGURE_FILES[0]).is_symlink()
    assert user.read_bytes().startswith(b"\x89PNG")
    capsys.readouterr()
    before = snapshot(tmp_path)
    for not_a_dir in (user, figures / FIGURE_FILES[1]):
        assert main([*args, "--png", str(not_a_dir)]) == 2
        one_line(capsys.readouterr().err, "inspect", "is not a directory")
    assert snapshot(tmp_path) == before


def test_inspect_html_into_a_directory_is_refused_before_the_model_runs(tmp_path, capsys):
    before = snapshot(tmp_path)
    args = ["inspect", "--out", str(FIXTURE_RUN), "--prompt", "The "]
    assert main([*args, "--html", str(tmp_path)]) == 2
    one_line(capsys.readouterr().err, "inspect", "it is a directory")
    assert capsys.readouterr().out == ""  # refused before anything was printed
    assert snapshot(tmp_path) == before


# --- the run directory ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "input.txt"
    path.write_text(default_corpus()[:4000], encoding="utf-8")
    return str(path)


@pytest.mark.parametrize(
    "name",
    [LOSS_PLOT, "last-00000000-0badc0de.safetensors", ".loss.png.0123abcd.tmp", "best.json"],
)
def test_a_stale_lock_does_not_make_a_users_file_a_leftover(tmp_path, text_file, capsys, name):
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_FILE).write_bytes(b"")
    (out / name).write_bytes(USER)
    before = snapshot(tmp_path)
    assert main(["train", "--data", text_file, "--out", str(out), *SMALL]) == 2
    one_line(capsys.readouterr().err, "train", "holds no gptblock run", name)
    assert snapshot(tmp_path) == before


def test_a_record_names_what_a_run_may_take_back_and_nothing_else(tmp_path, text_file, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_FILE).write_bytes(b"")
    (out / RECORD_FILE).write_bytes(b"loss.png\nlast-00000000-0badc0de.safetensors\n")
    (out / LOSS_PLOT).write_bytes(b"a half-written plot of the killed run")
    (out / "last-00000000-0badc0de.safetensors").write_bytes(b"half")
    assert main(["train", "--data", text_file, "--out", str(out), *SMALL]) == 0
    assert (out / LOSS_PLOT).read_bytes().startswith(b"\x89PNG")
    assert not (out / "last-00000000-0badc0de.safetensors").exists()
    assert load_checkpoint(out).meta["step"] == 2


def test_a_user_file_named_like_a_tensors_file_survives_every_save(tmp_path, text_file, capsys):
    # Beside a run (resumed: the directory is the run's), a file merely named like a tensors
    # file, and a user's link named like one, are not the run's to delete.
    out = tmp_path / "out"
    assert main(["train", "--data", text_file, "--out", str(out), *SMALL]) == 0
    user = tmp_path / "elsewhere.bin"
    user.write_bytes(USER)
    (out / "last-00000001-aaaaaaaa.safetensors").write_bytes(USER)
    (out / "best-00000001-bbbbbbbb.safetensors").symlink_to(user)
    args = ["train", "--data", text_file, "--out", str(out), *SMALL, "--max-iters", "4"]
    assert main([*args, "--resume"]) == 0  # the last --max-iters counts
    assert (out / "last-00000001-aaaaaaaa.safetensors").read_bytes() == USER
    assert (out / "best-00000001-bbbbbbbb.safetensors").is_symlink()
    assert user.read_bytes() == USER
    assert load_checkpoint(out).meta["step"] == 4
