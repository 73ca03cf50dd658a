"""``gptblock grade``: check a class's submissions (``gptblock.check.grading``), one row each,
into a gradebook rewritten atomically after every row, so Ctrl-C keeps the rows done."""

from __future__ import annotations

import argparse
import re
import sys

from tqdm import tqdm

from ..check import DEFAULT_TIMEOUT, parse_argument
from ..check.grading import Row, grade, gradescope, write_csv, write_json
from ..check.submissions import submissions
from ..errors import UserValueError
from ..files import atomic_write_json, check_destination
from .formatting import add_command, add_timeout_option, check_timeout


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = add_command(
        sub,
        "grade",
        run,
        description=(
            "Check every submission as `gptblock check` checks one, in child processes: a .py "
            "file, an .ipynb notebook (its code cells) or a student's folder of them; a folder of "
            "those is a folder of submissions. Each submission's block is the nn.Module subclass "
            "named Block (else with 'block' in its name, else the one no other class uses, else the "
            "one that builds on the most others); a class that embeds tokens is a model, not a "
            "block. When several could be, its row says which and --class picks. A submission that crashes, "
            "exits, hangs or does not parse is a row (ERROR or TIMEOUT) and the batch goes on. "
            "Exit code 0 when the batch ran, whatever the verdicts; 2 for bad arguments."
        ),
        epilog="docs/grading.md: from a folder of submissions to a gradebook and a Gradescope "
        "autograder.",
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="a submission, or a folder of them")
    p.add_argument(
        "--arg",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a constructor argument for every block, VALUE a Python literal (else a string); "
        "given to the parameter of that name or role (d_model to n_embd); repeat for more",
    )
    p.add_argument(
        "--class",
        dest="name",
        metavar="NAME",
        help="the class (or factory) to check in each submission (default: found as above)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        metavar="N",
        help="submissions checked at once (default: the cores no other process keeps busy)",
    )
    add_timeout_option(p, DEFAULT_TIMEOUT, "each submission")
    p.add_argument("--csv", metavar="FILE", help="write the gradebook as CSV")
    p.add_argument("--json", metavar="FILE", help="write the gradebook as JSON")
    p.add_argument(
        "--gradescope",
        metavar="FILE",
        help="write Gradescope's results.json for the one submission PATH is (a folder: one "
        "student's, as /autograder/submission)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    kwargs = dict(parse_argument(a) for a in args.arg)
    if args.jobs is not None and args.jobs < 1:
        raise UserValueError(f"--jobs must be >= 1, got {args.jobs}")
    check_timeout(args.timeout)
    for out in (args.csv, args.json, args.gradescope):
        if out is not None:
            check_destination(out)  # before the minutes of checking
    if args.gradescope is not None and len(args.paths) != 1:
        raise UserValueError(f"--gradescope grades one submission; got {len(args.paths)} PATHs")
    subs = submissions(args.paths, one=args.gradescope is not None)
    order = {str(s.path): i for i, s in enumerate(subs)}
    rows: list[Row] = []
    bar = tqdm(total=len(subs), unit="submission", disable=args.no_progress or None)

    def done(row: Row) -> None:
        rows.append(row)
        rows.sort(key=lambda r: order[r.path])  # the gradebook in the submissions' order
        if args.csv:
            write_csv(rows, args.csv)
        if args.json:
            write_json(rows, args.json)
        bar.set_postfix_str(f"{row.student}: {row.verdict}")
        bar.update()

    try:
        grade(
            subs, kwargs=kwargs, name=args.name, jobs=args.jobs, timeout=args.timeout, on_row=done
        )
    finally:
        bar.close()
        _table(rows)
    if args.gradescope is not None:
        atomic_write_json(args.gradescope, gradescope(rows[0]), indent=2)
    return 0


_LOADING = r"^cannot load .*?\.(py|ipynb)(:[\w.]+)?: "  # the file's name, said in its column


def _table(rows: list[Row]) -> None:
    if not rows:
        return
    cells = [("student", "file:class", "verdict", "seconds", "mistakes (or why not checked)")]
    for r in rows:
        said = " ".join(r.mistakes) or ("; ".join(r.failed) if r.verdict == "FAIL" else "")
        if r.verdict in ("ERROR", "TIMEOUT"):  # whole, last: the file is the second column's
            said = re.sub(_LOADING, "", r.report.splitlines()[0]) if r.report else ""
        cells.append((r.student, r.block or "-", r.verdict, f"{r.seconds:.1f}", said or "-"))
    widths = [max(len(c[i]) for c in cells) for i in range(4)]
    for c in cells:
        row = [*(v.ljust(w) for v, w in zip(c[:3], widths, strict=False)), c[3].rjust(widths[3])]
        print("  ".join([*row, c[4]]))
    counts = {v: sum(r.verdict == v for r in rows) for v in dict.fromkeys(r.verdict for r in rows)}
    said = f"{len(rows)} submission{'s' * (len(rows) != 1)}: "
    print(said + ", ".join(f"{n} {v}" for v, n in counts.items()))
    sys.stdout.flush()
