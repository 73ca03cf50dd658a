"""How long `gptblock grade` takes on a class of lesson-style submissions (issue 29: 40 in at most
2.5 minutes on the project's 2-core machine, and never slower than one `gptblock check` per
submission, one after another).

Writes N submissions into a temporary folder, as a class hands them in: the lesson's block as
.py files and notebooks, under the lesson's and other names, some with a catalogued mistake
(no score scaling, the lecture's C ** -0.5, no mask, post-norm) and one that crashes at import.
Then times the whole command, `python -m gptblock grade FOLDER`, --repeats times (a process
each, its start included), and prints each time, the median and the spread. --baseline also
times `python -m gptblock check FILE:NAME` on every submission, one after another, once.

    python benchmarks/grade_class.py                      # 40 submissions, 3 runs
    python benchmarks/grade_class.py --submissions 3 --repeats 1 --baseline

Time nothing while other jobs share the machine: each submission's check imports torch in a
child process, so a busy neighbour slows every one of them.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gptblock.check.submissions import Submission, find_block

ROOT = Path(__file__).resolve().parents[1]
# the lesson's code verbatim, its block's name to fill in
LESSON = (ROOT / "tests" / "lesson_reference.py").read_text().replace("class Block(", "class NAME(")
SCALE = " * k.shape[-1] ** -0.5"
MASK = 'wei = wei.masked_fill(self.tril[:T, :T] == 0, float("-inf"))'
VARIANTS = [  # (what, the code's change); cycled through the class
    ("correct", lambda c: c),
    ("no scaling", lambda c: c.replace(SCALE, "")),
    ("correct", lambda c: c),
    ("C ** -0.5", lambda c: c.replace(SCALE, " * C ** -0.5")),
    ("correct", lambda c: c),
    ("no mask", lambda c: c.replace(MASK, "pass")),
    ("post-norm", lambda c: c.replace("x + self.sa(self.ln1(x))", "self.ln1(x + self.sa(x))")),
]
NAMES = ["Block", "Block", "TransformerBlock", "DecoderBlock", "Block", "GPTBlock"]


def write_class(folder: Path, n: int) -> None:
    """``n`` submissions: .py files, every third a notebook, the last but one crashing."""
    for i in range(n):
        _, change = VARIANTS[i % len(VARIANTS)]
        code = change(LESSON).replace("NAME", NAMES[i % len(NAMES)])
        if n > 2 and i == n - 2:
            code += "\nraise RuntimeError('a crash at import')\n"
        if i % 3 == 2:
            cells = [{"cell_type": "code", "source": "!pip install torch\n"}]
            cells += [{"cell_type": "code", "source": code, "outputs": []}]
            (folder / f"student{i:02d}.ipynb").write_text(json.dumps({"cells": cells}))
        else:
            (folder / f"student{i:02d}.py").write_text(code)


def timed(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--submissions", type=int, default=40, help="how many submissions")
    p.add_argument("--repeats", type=int, default=3, help="timed runs of the whole command")
    p.add_argument("--jobs", type=int, help="gptblock grade --jobs (default: its own)")
    p.add_argument("--baseline", action="store_true", help="also time `gptblock check` on each")
    p.add_argument("--json", metavar="FILE", help="write the times as JSON")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "class"
        folder.mkdir()
        write_class(folder, args.submissions)
        grade = [sys.executable, "-m", "gptblock", "grade", str(folder), "--no-progress"]
        grade += ["--csv", str(Path(tmp) / "grades.csv")]
        grade += [] if args.jobs is None else ["--jobs", str(args.jobs)]
        times = []
        for r in range(args.repeats):
            times.append(timed(grade))
            print(f"run {r + 1}: {times[-1]:.1f} s for {args.submissions} submissions", flush=True)
        print(f"gptblock grade: median {statistics.median(times):.1f} s, "
              f"min {min(times):.1f}, max {max(times):.1f} ({len(times)} runs)")  # fmt: skip
        result = {"submissions": args.submissions, "grade_s": times}
        if args.baseline:
            start = time.perf_counter()
            for f in sorted(folder.iterdir()):
                found = find_block(Submission(f.stem, f, (f,)))
                target = f
                if f.suffix == ".ipynb":  # what grade checks: its code as a file (not timed)
                    target = Path(tmp) / f"{f.stem}.py"
                    target.write_text(found.code)
                timed([sys.executable, "-m", "gptblock", "check", f"{target}:{found.name}"])
            result["checks_one_after_another_s"] = time.perf_counter() - start
            print(f"gptblock check, one per submission, one after another: "
                  f"{result['checks_one_after_another_s']:.1f} s")  # fmt: skip
        with open(Path(tmp) / "grades.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        verdicts = [r["verdict"] for r in rows]
        print(
            f"the last gradebook: {len(rows)} rows,", {v: verdicts.count(v) for v in set(verdicts)}
        )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
