"""The second zoo's hit rate: ``python tests/zoo_public/hitrate.py`` prints the table in its README.

Every case of ``zoo_public`` (each block correct, with each of its mistakes and with its pairs)
is checked the way a user would check it: ``gptblock.check_block(BLOCK, **ARGS)``, the block's
class and the arguments its source builds it with (``--cli``: ``gptblock check FILE.py:NAME
--arg NAME=VALUE ...`` in a child process, for the blocks whose arguments a command line can
give; the others are checked in process and counted the same way).

The verdict is read from the report's ``result:`` line (``--cli``: from the exit code, 0 PASS,
1 FAIL, 2 cannot build, any other code by its report), so a third verdict such as
``UNVERIFIED`` is counted on its own instead of as a pass or a fail. Correct blocks count as
PASS, FAIL, UNVERIFIED-or-other, or error (the checker raised). Mistaken blocks count as
diagnosed exactly (FAIL, confident, exactly the catalogue ids of the mistakes made), PASS (a
false pass), wrong (a confident diagnosis that is not the mistakes made), unsure (a FAIL with
alternatives, without the comparison, or with no diagnosis), UNVERIFIED-or-other, or error.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from gptblock import check_block
from zoo_public import NAMES, Case, cases

TESTS = pathlib.Path(__file__).resolve().parents[1]
CORRECT_KINDS = ("PASS", "FAIL", "UNVERIFIED/other", "error")
MISTAKEN_KINDS = ("exact", "PASS", "wrong", "unsure", "UNVERIFIED/other", "error")


@dataclass(frozen=True)
class Outcome:
    """What the checker said about one case."""

    case: Case
    verdict: str  # "PASS", "FAIL", another word the report ends with, or "error"
    diagnosis: tuple[str, ...] = ()
    confident: bool = False
    text: str = ""  # the report, or the error
    compared: bool = False  # the report says the reference comparison ran

    @property
    def kind(self) -> str:
        """How the outcome counts (one of CORRECT_KINDS or MISTAKEN_KINDS)."""
        if self.verdict == "error":
            return "error"
        if self.verdict not in ("PASS", "FAIL"):
            return "UNVERIFIED/other"
        if not self.case.expected:
            return self.verdict
        if self.verdict == "PASS":
            return "PASS"
        if self.confident and set(self.diagnosis) == set(self.case.expected):
            return "exact"
        if self.confident and self.diagnosis:
            return "wrong"
        return "unsure"

    @property
    def hit(self) -> bool:
        return self.kind == ("exact" if self.case.expected else "PASS")


def verdict_of(report) -> str:
    """The word after ``result:`` in the report's text ("PASS", "FAIL", "UNVERIFIED", ...)."""
    for line in reversed(str(report).splitlines()):
        if line.startswith("result:"):
            words = line.split()
            return words[1] if len(words) > 1 else "?"
    return "PASS" if report.passed else "FAIL"


def run_case(case: Case) -> Outcome:
    """Check one case in this process, as ``check_block(BLOCK, **ARGS)``."""
    try:
        module = case.module()
        report = check_block(module.BLOCK, **module.ARGS)
    except Exception as e:  # the checker (or building the block) raised: counted, not fatal
        return Outcome(case, "error", text=f"{type(e).__name__}: {e}")
    confident = bool(getattr(report, "confident", False))
    compared = bool(getattr(report, "compared", False))
    return Outcome(
        case, verdict_of(report), tuple(report.diagnosis), confident, str(report), compared
    )


def cli_arguments(case: Case) -> list[str] | None:
    """``--arg NAME=VALUE`` for each constructor argument, or None when one is not a literal."""
    out = []
    for name, value in case.module().ARGS.items():
        if not isinstance(value, (int, float, str, bool)):
            return None
        out += ["--arg", f"{name}={value!r}"]
    return out


def run_cli(case: Case) -> Outcome:
    """Check one case as ``gptblock check FILE.py:NAME --arg ... --json`` would."""
    args = cli_arguments(case)
    if args is None:
        return run_case(case)  # a config object: no command line can give it
    module = case.module()
    target = f"{module.__file__}:{module.BLOCK.__name__}"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [sys.executable, "-m", "gptblock", "check", target, *args, "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    try:
        report = json.loads(done.stdout)["reports"][0]
    except (ValueError, KeyError, IndexError):
        return Outcome(case, "error", text=f"exit {done.returncode}: {done.stderr.strip()[-500:]}")
    verdict = {0: "PASS", 1: "FAIL"}.get(done.returncode)
    if verdict is None:
        verdict = str(
            report.get("verdict") or report.get("result") or f"exit-{done.returncode}"
        ).upper()
    return Outcome(
        case,
        verdict,
        tuple(report.get("diagnosis", ())),
        bool(report.get("confident")),
        done.stdout,
        bool(report.get("compared")),
    )


def measure(
    blocks: list[str] | None = None, cli: bool = False, verbose: bool = False
) -> list[Outcome]:
    outcomes = []
    for case in cases(blocks):
        outcome = (run_cli if cli else run_case)(case)
        outcomes.append(outcome)
        if verbose and not outcome.hit:
            print(
                f"--- {case.name}: {outcome.kind}, expected {sorted(case.expected)}\n{outcome.text}\n"
            )
    return outcomes


def table(outcomes: list[Outcome]) -> str:
    correct = [o for o in outcomes if not o.case.expected]
    mistaken = [o for o in outcomes if o.case.expected]
    c, m = Counter(o.kind for o in correct), Counter(o.kind for o in mistaken)
    blocks = sorted({o.case.block for o in outcomes})
    repos = {__import__("zoo_public").spec(b).SOURCE.split()[0] for b in blocks}

    def share(n: int, of: list) -> str:
        return f"{n:4d} / {len(of):4d} = {n / max(len(of), 1):7.2%}"

    lines = [
        f"{len(blocks)} blocks from {len(repos)} repositories, {len(outcomes)} cases: "
        f"{len(correct)} correct, {len(mistaken)} mistaken",
        "correct blocks:",
        *(f"  {k:<34}{share(c[k], correct)}" for k in CORRECT_KINDS),
        f"    {'of the PASS, compared':<32}{sum(o.kind == 'PASS' and o.compared for o in correct):4d}",
        f"    {'of the PASS, at two sizes':<32}{sum(o.kind == 'PASS' and 'checked again at' in o.text for o in correct):4d}",
        "mistaken blocks:",
        f"  {'diagnosed exactly':<34}{share(m['exact'], mistaken)}",
        f"  {'PASS (a false pass)':<34}{share(m['PASS'], mistaken)}",
        f"    {'of them, compared':<32}{sum(o.kind == 'PASS' and o.compared for o in mistaken):4d}",
        f"  {'wrong (confident, not the mistake)':<34}{share(m['wrong'], mistaken)}",
        f"  {'unsure':<34}{share(m['unsure'], mistaken)}",
        f"  {'UNVERIFIED/other':<34}{share(m['UNVERIFIED/other'], mistaken)}",
        f"  {'error (the checker raised)':<34}{share(m['error'], mistaken)}",
        "per block (correct verdict, mistaken diagnosed exactly):",
    ]
    for b in blocks:
        mine = [o for o in outcomes if o.case.block == b]
        right = next((o.kind for o in mine if not o.case.expected), "-")
        hits = sum(o.kind == "exact" for o in mine if o.case.expected)
        lines.append(
            f"  {b:<26} {right:<17} {hits:3d} / {sum(bool(o.case.expected) for o in mine):3d}"
        )
    misses = [o for o in outcomes if not o.hit]
    lines.append(f"failures ({len(misses)}):")
    for o in misses:
        said = list(o.diagnosis) if o.verdict != "error" else o.text.splitlines()[0][:120]
        lines.append(f"  {o.kind:<16} {o.case.name}: {o.verdict} {said}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "blocks",
        nargs="*",
        choices=[[], *NAMES],
        metavar="BLOCK",
        help="only these blocks (default: all)",
    )
    parser.add_argument(
        "--cli", action="store_true", help="check through `gptblock check` in a child process"
    )
    parser.add_argument("--verbose", action="store_true", help="print the report of every miss")
    args = parser.parse_args()
    start = time.perf_counter()
    outcomes = measure(args.blocks or None, args.cli, args.verbose)
    print(table(outcomes))
    print(f"({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
