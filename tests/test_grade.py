"""`gptblock grade` (check/grading.py, check/submissions.py, cli/grade.py): a generated class of
submissions, correct and mistaken blocks as .py files and notebooks, and the ones that must not
stop a batch (a crash and sys.exit at import, a syntax error, an endless loop, a fake "result:
PASS"), graded once by a module fixture; the gradebook, Gradescope's results.json, exit codes."""

import csv
import json
import threading
from pathlib import Path

import pytest

from gptblock.check.grading import CHECKS, Row, grade, gradescope
from gptblock.check.submissions import NotGraded, Submission, code_of, find_block, submissions
from gptblock.cli import main

# the lesson's code verbatim, its block's name to fill in
LESSON = (
    Path(__file__)
    .with_name("lesson_reference.py")
    .read_text()
    .replace("class Block(", "class NAME(")
)
NO_SCALE = LESSON.replace(" * k.shape[-1] ** -0.5", "")
NO_MASK = LESSON.replace('wei = wei.masked_fill(self.tril[:T, :T] == 0, float("-inf"))', "pass")
GPT = """
class GPT(nn.Module):  # embeds tokens: a model, not the block
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(65, 32)
        self.blocks = nn.Sequential(NAME(32, 4, 16))
"""
TWO = (
    LESSON.replace("NAME", "BlockA") + "\n\nclass BlockB" + LESSON.split("class NAME")[1]
)  # neither uses the other
EMPTY = "import torch.nn as nn\n\nclass Block(nn.Module):\n    pass\n"


def lesson(code=LESSON, name="Block"):
    return code.replace("NAME", name)


def notebook(code, *extra_cells):
    """``code`` as a notebook's cells (a class per cell), a magic and a shell line among them."""
    cells = [{"cell_type": "code", "source": ["%matplotlib inline\n", "!pip install torch\n"]}]
    cells += [{"cell_type": "markdown", "source": "# my block"}]
    for i, part in enumerate(code.split("\nclass ")):
        source = part if i == 0 else "class " + part
        cells.append({"cell_type": "code", "source": source, "outputs": [{"text": "x"}]})
    cells += [{"cell_type": "code", "source": c} for c in extra_cells]
    return json.dumps({"cells": cells, "nbformat": 4, "nbformat_minor": 5})


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """One batch through the command line, writing the CSV and JSON."""
    d = tmp_path_factory.mktemp("grade")
    subs = d / "subs"
    subs.mkdir()
    (subs / "ada.py").write_text(lesson())
    (subs / "bo.py").write_text(
        lesson(NO_SCALE, "TransformerBlock") + GPT.replace("NAME", "TransformerBlock")
    )
    train = "model = Block(32, 4, 16)\nwhile True:  # a training cell: not what the block needs\n    model.train()\n"
    (subs / "cy.ipynb").write_text(notebook(lesson(), train))
    (subs / "di").mkdir()  # a student's folder: the notebook inside is theirs
    (subs / "di" / "work.ipynb").write_text(notebook(lesson(NO_MASK), "%%bash\nls\n"))
    # (at import, where the block needs it: a statement it does not need is not run)
    crash = "def boom():\n    raise RuntimeError('boom')\n\nBlock.ready = boom()\n"
    (subs / "crash.py").write_text(EMPTY + crash)
    fake = "import sys\nBlock.ready = print('result: PASS') or sys.exit(0)\n"
    (subs / "fake.py").write_text(EMPTY + fake)
    (subs / "syntax.py").write_text(lesson() + "def oops(:\n")
    (subs / "two.py").write_text(TWO)
    csv_path, json_path = d / "grades.csv", d / "grades.json"
    code = main(["grade", str(subs), "--jobs", "2", "--csv", str(csv_path), "--json", str(json_path), "--no-progress"])  # fmt: skip
    rows = {r["student"]: r for r in json.loads(json_path.read_text())}
    return code, rows, csv_path, d


def test_the_batch_exits_0_whatever_the_verdicts(graded):
    code, rows, _, _ = graded
    assert code == 0
    assert list(rows) == ["ada", "bo", "crash", "cy", "di", "fake", "syntax", "two"]


def test_correct_and_mistaken_blocks_in_files_and_notebooks(graded):
    rows = graded[1]
    assert rows["ada"]["verdict"] == "PASS" and rows["ada"]["class"] == "ada.py:Block"
    assert rows["cy"]["verdict"] == "PASS" and rows["cy"]["class"] == "cy.ipynb:Block"
    assert rows["bo"]["verdict"] == "FAIL" and rows["bo"]["mistakes"] == ["no_scaling"]
    assert rows["bo"]["class"] == "bo.py:TransformerBlock"  # not the GPT, which embeds tokens
    assert rows["di"]["verdict"] == "FAIL" and "future_leak" in rows["di"]["mistakes"]
    assert rows["di"]["class"] == "work.ipynb:Block" and "causality" in rows["di"]["failed_checks"]
    assert "result: FAIL" in rows["bo"]["report"] and rows["bo"]["seconds"] > 0
    assert all(r["gptblock"] for r in rows.values())


def test_what_would_stop_a_batch_is_one_error_row_each(graded):
    rows = graded[1]
    for student, said in [
        ("crash", "RuntimeError: boom"),
        ("fake", "SystemExit: 0"),  # it exits 0 at import; its "result: PASS" is never read
        ("syntax", "syntax.py: SyntaxError at line"),
    ]:
        assert rows[student]["verdict"] == "ERROR", rows[student]
        assert said in rows[student]["report"], rows[student]["report"]


def test_several_classes_that_could_be_the_block_are_named(graded):
    two = graded[1]["two"]
    assert two["verdict"] == "ERROR" and "--class" in two["report"]
    assert {"BlockA", "BlockB"} <= set(two["classes_found"])


def test_the_csv_holds_the_same_rows(graded):
    _, rows, csv_path, _ = graded
    with open(csv_path, newline="") as f:
        table = list(csv.DictReader(f))
    assert [r["student"] for r in table] == list(rows)
    bo = next(r for r in table if r["student"] == "bo")
    assert (
        bo["verdict"] == "FAIL"
        and bo["mistakes"] == "no_scaling"
        and "result: FAIL" in bo["report"]
    )
    assert set(table[0]) >= {
        "student",
        "path",
        "class",
        "verdict",
        "failed_checks",
        "seconds",
        "gptblock",
    }


def test_class_picks_and_gradescope_results_for_one_submission(graded, tmp_path):
    folder = tmp_path / "submission"  # Gradescope's /autograder/submission
    folder.mkdir()
    (folder / "two.py").write_text((graded[3] / "subs" / "two.py").read_text())
    (folder / "notes.py").write_text("print('not a block')\n")
    out = tmp_path / "results.json"
    assert main(["grade", str(folder), "--class", "BlockA", "--gradescope", str(out), "--no-progress"]) == 0  # fmt: skip
    results = json.loads(out.read_text())
    assert [t["name"] for t in results["tests"]] == [*CHECKS, "result"]
    assert all(t["score"] == t["max_score"] == 1 for t in results["tests"]), results["tests"]
    assert results["score"] == len(CHECKS) + 1 and "result: PASS" in results["output"]


def test_an_endless_loop_is_a_timeout_row(tmp_path, capsys):
    (tmp_path / "loops.py").write_text(EMPTY + "while True:\n    Block.ready = False\n")
    out = tmp_path / "g.json"
    assert main(["grade", str(tmp_path / "loops.py"), "--timeout", "1", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    assert row["verdict"] == "TIMEOUT" and "did not finish within 1 s" in row["report"]
    table = capsys.readouterr().out.splitlines()
    (line,) = [x for x in table if x.startswith("loops ")]
    # the reason whole and last, the file not said first: "loops.py:Block" is its column's
    assert line.split()[:4] == ["loops", "loops.py:Block", "TIMEOUT", line.split()[3]]
    assert line.split()[4:7] == ["its", "process", "did"], line
    assert table[-1] == "1 submission: 1 TIMEOUT"


def test_gradescope_scores_an_error_zero_with_the_reason():
    results = gradescope(Row("ada", "ada.py", "", "ERROR", report="ada.py: SyntaxError at line 3"))
    assert results["score"] == 0 and "SyntaxError at line 3" in results["tests"][-1]["output"]
    assert sum(t["max_score"] for t in results["tests"]) == len(CHECKS) + 1


def test_ctrl_c_keeps_the_rows_written(tmp_path, monkeypatch):
    for name in "abc":  # rows without a child process: they do not parse
        (tmp_path / f"{name}.py").write_text("def f(:\n")
    import gptblock.cli.grade as command

    written = []

    def write_then_interrupt(rows, path):
        written.append(len(rows))
        command_write(rows, path)
        raise KeyboardInterrupt

    command_write = command.write_csv
    monkeypatch.setattr(command, "write_csv", write_then_interrupt)
    out = tmp_path / "g.csv"
    assert main(["grade", str(tmp_path), "--csv", str(out), "--jobs", "1"]) == 130
    assert written == [1] and len(list(csv.DictReader(out.open()))) == 1


def test_a_check_that_raises_past_exception_is_an_error_row_not_a_hang(tmp_path, monkeypatch):
    import gptblock.check.grading as grading

    class Stopped(BaseException):  # as the child's Gone is: not an Exception
        pass

    def stopped(*args, **kwargs):
        raise Stopped("its process stopped answering")

    monkeypatch.setattr(grading, "check_isolated", stopped)
    (tmp_path / "ada.py").write_text(lesson())
    rows = []  # graded in a thread: without the fix the batch waits forever, and this fails
    worker = threading.Thread(target=lambda: rows.extend(grade([tmp_path], jobs=1)), daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "grade waited forever for a row that never came"
    (row,) = rows
    assert row.verdict == "ERROR" and "its process stopped answering" in row.report


@pytest.mark.parametrize(
    "argv, said",
    [
        (["nowhere"], "no such file or folder: nowhere"),
        (["x", "--jobs", "0"], "--jobs must be >= 1"),
        (["x", "--timeout", "0"], "--timeout must be a positive number"),
        (["x", "y", "--gradescope", "r.json"], "--gradescope grades one submission"),
        (["x", "--arg", "1=2"], "--arg expects NAME=VALUE"),
        (["x", "--csv", "/nonexistent/g.csv"], "is not an existing directory"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(argv, said, capsys):
    assert main(["grade", *argv]) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1, err


def test_the_block_is_found_by_the_lessons_name_then_by_what_uses_what(tmp_path):
    def found(code, name=None):
        path = tmp_path / "s.py"
        path.write_text(code)
        return find_block(Submission("s", path, (path,)), name).name

    assert found(lesson()) == "Block"
    assert (
        found(lesson(name="Layer")) == "Layer"
    )  # MultiHeadAttention and FeedForward are its parts
    assert found(lesson(name="Layer") + GPT.replace("NAME", "Layer")) == "Layer"
    helper = "\nclass Unused(nn.Module):\n    def forward(self, x):\n        return x\n"
    assert found(lesson(name="Layer") + helper) == "Layer"  # it builds on three others
    assert found(lesson(), "FeedForward") == "FeedForward"
    with pytest.raises(NotGraded, match="no class or function 'Nope'"):
        found(lesson(), "Nope")
    with pytest.raises(NotGraded, match=r"no nn\.Module subclass"):
        found("x = 1\n")
    nested = "import torch.nn as nn\nclass GPT(nn.Module):\n    class Block(nn.Module): pass\n"
    nested += "    def __init__(self):\n        self.wte = nn.Embedding(5, 4)\n"
    with pytest.raises(NotGraded, match=r"\(GPT: a model, embedding tokens\); name the block with"):
        found(nested)
    assert found(nested, "GPT.Block") == "GPT.Block"  # a class's own class, named
    # (s57 public set: Falcon, StableLM, Cohere) a layer building its file's rotary embedding is a
    # block; a model embedding tokens through its own class, or another file's, is not
    rotary = "import torch.nn as nn\nclass LlamaRotaryEmbedding(nn.Module): pass\n"
    rotary += "class DecoderLayer(nn.Module):\n    def __init__(self):\n"
    rotary += "        self.rotary_emb = LlamaRotaryEmbedding()\n"
    tokens = "class TokenEmbedding(nn.Module):\n    def __init__(self):\n        self.e = nn.Embedding(5, 4)\n"
    model = (
        "class Model(nn.Module):\n    def __init__(self):\n        self.layers = [DecoderLayer()]\n"
    )
    assert (
        found(rotary + tokens + model + "        self.wte = TokenEmbedding()\n") == "DecoderLayer"
    )
    other = "from elsewhere import WordEmbedding\n" + model + "        self.wte = WordEmbedding()\n"
    assert found(rotary + other) == "DecoderLayer"


def test_a_notebook_is_its_code_cells_without_magics(tmp_path):
    path = tmp_path / "n.ipynb"
    path.write_text(notebook(lesson(), "for i in range(2):\n    !echo hi\n", "%%time\nx = 1\n"))
    code = code_of(path)
    assert "class Block" in code and "%" not in code and "!" not in code and "x = 1" not in code
    compile(code, "n.py", "exec")  # the indented shell line left a valid block
    path.write_text(notebook(lesson(), "y = 1\nprint(y\n"))
    with pytest.raises(NotGraded, match=r"n.ipynb: SyntaxError at cell 8, line 2: '\(' was never"):
        find_block(Submission("n", path, (path,)))  # the cell's line, not the joined cells' (s93)


def test_folders_are_students_and_a_flat_folder_that_imports_itself_is_one(tmp_path):
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "block.py").write_text("from parts import Head\n")
    (tmp_path / "one" / "parts.py").write_text("")
    (tmp_path / "many").mkdir()
    for name in ("ann", "ben"):
        (tmp_path / "many" / f"{name}.py").write_text("import torch\n")
    (tmp_path / "many" / "notes.txt").write_text("")
    (tmp_path / "many" / "cat").mkdir()
    (tmp_path / "many" / "cat" / "b.ipynb").write_text("{}")
    assert [s.student for s in submissions([tmp_path / "one"])] == ["one"]
    assert [s.student for s in submissions([tmp_path / "many"])] == ["ann", "ben", "cat"]
    assert [s.student for s in submissions([tmp_path / "many"], one=True)] == ["many"]


def test_the_library_call_returns_the_rows_in_order(tmp_path):
    for name in ("b", "a"):
        (tmp_path / f"{name}.py").write_text("x = 1\n")
    rows = grade([tmp_path / "b.py", tmp_path / "a.py"], jobs=2)
    assert [(r.student, r.verdict) for r in rows] == [("b", "ERROR"), ("a", "ERROR")]


def test_a_submission_writing_into_anothers_files_changes_no_row(tmp_path):
    # (s83 unseen set) ada's block, when built, took bob's scaling out of bob's file next to its
    # own; bob was then checked from the changed file: FAIL no_scaling, where bob alone PASSes
    write = (
        "\n\nfrom pathlib import Path\n_init = Block.__init__\n\n\n"
        "def _tamper(self, n_embd, n_head, block_size, dropout=0.2):\n"
        "    _init(self, n_embd, n_head, block_size, dropout)\n"
        "    bob = Path(__file__).resolve().parents[1] / 'bob' / 'model.py'\n"
        "    try:\n"
        "        bob.write_text(bob.read_text().replace(' * k.shape[-1] ** -0.5', ''))\n"
        "    except OSError:\n"
        "        pass\n\n\n"
        "Block.__init__ = _tamper\n"
    )
    for student, code in (("ada", lesson() + write), ("bob", lesson())):
        (tmp_path / student).mkdir()
        (tmp_path / student / "model.py").write_text(code)
    rows = {r.student: r for r in grade([tmp_path], jobs=1)}
    assert rows["bob"].verdict == "PASS" and rows["bob"].block == "model.py:Block", rows["bob"]
    assert "gptblock-grade-" not in rows["ada"].report + rows["bob"].report
    assert rows["bob"].path == str(tmp_path / "bob")


def test_a_students_folder_is_where_their_imports_start_and_an_ended_process_says_why(tmp_path):
    # (s88 unseen set) ``from parts.sizes import N`` in eve/parts/block.py: ERROR "No module named
    # 'parts'", where checked from eve's folder it loads; kev's KeyboardInterrupt: an ERROR row
    # whose report began "check Block(...)", the reason further down
    (tmp_path / "eve" / "parts").mkdir(parents=True)
    (tmp_path / "eve" / "parts" / "sizes.py").write_text("N = 32\n")
    (tmp_path / "eve" / "parts" / "block.py").write_text("from parts.sizes import N\n" + lesson())
    interrupt = "\n\ndef _stop(self, x):\n    raise KeyboardInterrupt\n\n\nBlock.forward = _stop\n"
    (tmp_path / "kev.py").write_text(lesson() + interrupt)
    rows = {r.student: r for r in grade([tmp_path], jobs=2)}
    assert rows["eve"].verdict == "PASS" and rows["eve"].block == "parts/block.py:Block", rows[
        "eve"
    ]
    assert rows["kev"].verdict == "ERROR", rows["kev"]
    assert "KeyboardInterrupt" in rows["kev"].report.splitlines()[0], rows["kev"].report


def test_grades_threads_find_blocks_at_once(tmp_path):
    # (stop 66's CI) grade --jobs 2 gave kev "could not grade it (SystemError: AST constructor
    # recursion depth mismatch)": CPython 3.11 counts the depth of a tree being built once for all
    # threads, and a thread switch inside a parse (a finaliser the collector runs) broke the count
    import sys

    class Finalised:
        def __del__(self):
            sum(range(50))  # Python code: the interpreter may switch threads here

    path = tmp_path / "s.py"
    path.write_text("x = " + "(" * 30 + "1" + ")" * 30 + "\n" + lesson() * 4)
    sub, failed = Submission("s", path, (path,)), []

    def work():
        for _ in range(30):
            for _ in range(50):
                cycle = Finalised()
                cycle.me = cycle  # freed by the collector, inside someone's parse
            try:
                find_block(sub)
            except SystemError as e:
                failed.append(e)
                return

    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=work) for _ in range(4)]
        [t.start() for t in threads]
        [t.join() for t in threads]
    finally:
        sys.setswitchinterval(before)
    assert not failed, failed
