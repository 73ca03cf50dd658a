"""The modern zoo's hit rate: ``python tests/zoo_modern/hitrate.py``.

Every case of ``zoo_modern`` (each style correct, with each of its mistakes and with its pairs)
is checked as a user would check it, ``gptblock.check_block(BLOCK, **ARGS)``, and counted as
``tests/zoo_public/hitrate.py`` counts (the same ``Outcome``): a correct block PASS, FAIL,
UNVERIFIED-or-other or error; a mistaken block diagnosed exactly, PASS (a false pass), wrong,
unsure, UNVERIFIED-or-other or error. ``--cli`` checks each through ``gptblock check FILE.py:NAME
--arg ...`` in a child process instead (isolated: a modern PASS then stands only when the
checker's process confirms it), as ``tests/zoo_public/hitrate.py --cli`` does.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time
from collections import Counter

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from zoo_modern import NAMES, cases
from zoo_public.hitrate import CORRECT_KINDS, Outcome, run_case, run_cli


def measure(
    blocks: list[str] | None = None, verbose: bool = False, cli: bool = False
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

    def share(n: int, of: list) -> str:
        return f"{n:4d} / {len(of):4d} = {n / max(len(of), 1):7.2%}"

    lines = [
        f"{len({o.case.block for o in outcomes})} modern styles, {len(outcomes)} cases: "
        f"{len(correct)} correct, {len(mistaken)} mistaken",
        "correct blocks:",
        *(f"  {k:<34}{share(c[k], correct)}" for k in CORRECT_KINDS),
        "mistaken blocks:",
        f"  {'diagnosed exactly':<34}{share(m['exact'], mistaken)}",
        f"  {'PASS (a false pass)':<34}{share(m['PASS'], mistaken)}",
        f"  {'wrong (confident, not the mistake)':<34}{share(m['wrong'], mistaken)}",
        f"  {'unsure':<34}{share(m['unsure'], mistaken)}",
        f"  {'UNVERIFIED/other':<34}{share(m['UNVERIFIED/other'], mistaken)}",
        f"  {'error (the checker raised)':<34}{share(m['error'], mistaken)}",
    ]
    misses = [o for o in outcomes if not o.hit]
    lines.append(f"misses ({len(misses)}):")
    for o in misses:
        said = list(o.diagnosis) if o.verdict != "error" else o.text.splitlines()[0][:120]
        lines.append(f"  {o.kind:<16} {o.case.name}: {o.verdict} {said}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("blocks", nargs="*", choices=[[], *NAMES], metavar="BLOCK")
    parser.add_argument(
        "--cli", action="store_true", help="check through `gptblock check` in a child process"
    )
    parser.add_argument("--verbose", action="store_true", help="print the report of every miss")
    args = parser.parse_args()
    start = time.perf_counter()
    print(table(measure(args.blocks or None, args.verbose, args.cli)))
    print(f"({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
