"""The zoo's hit rate: ``python tests/zoo_realworld/hitrate.py`` prints the table in the README.

For every case of the zoo (each style correct, with each of its bugs and with its pairs) it runs
``gptblock.check_block`` and counts: correct blocks that pass, mistaken blocks whose diagnosis
names exactly the injected mistakes (confidently), diagnoses the checker says it is unsure of,
diagnoses stated with confidence that are wrong, mistaken blocks reported PASS, correct blocks
reported FAIL, and blocks left UNVERIFIED. ``--verbose`` prints every miss's report.
"""

import argparse
import pathlib
import sys
import time
from collections import Counter

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from gptblock import check_block
from zoo_realworld import STYLES, cases, run_case


def measure(verbose=False):
    outcomes, reports = [], {}
    for case in cases():
        outcome, report = run_case(case, check_block)
        outcomes.append(outcome)
        reports[case.name] = report
        if verbose and outcome.verdict not in ("pass", "exact"):
            print(
                f"--- {case.name}: {outcome.verdict}, expected {sorted(case.expected)}\n{report}\n"
            )
    return outcomes


def table(outcomes):
    correct = [o for o in outcomes if not o.case.expected]
    mistaken = [o for o in outcomes if o.case.expected]
    c, m = Counter(o.verdict for o in correct), Counter(o.verdict for o in mistaken)
    single = [o for o in mistaken if len(o.case.bugs) == 1]
    multi = [o for o in mistaken if len(o.case.bugs) > 1]
    lines = [
        f"{len(STYLES)} styles, {len(outcomes)} blocks: {len(correct)} correct, {len(mistaken)} mistaken "
        f"({len(single)} with one mistake, {len(multi)} with two or three)",
        f"correct blocks that pass:            {c['pass']:4d} / {len(correct):4d} = {c['pass'] / len(correct):7.2%}",
        f"mistaken blocks diagnosed exactly:   {m['exact']:4d} / {len(mistaken):4d} = {m['exact'] / len(mistaken):7.2%}",
        f"  one mistake:                       {sum(o.verdict == 'exact' for o in single):4d} / {len(single):4d}",
        f"  two or three:                      {sum(o.verdict == 'exact' for o in multi):4d} / {len(multi):4d}",
        f"diagnoses stated as unsure:          {m['unsure'] + c['unsure']:4d}",
        f"wrong diagnoses stated confidently:  {m['wrong'] + c['wrong']:4d}",
        f"mistaken blocks reported PASS:       {m['false pass']:4d}",
        f"correct blocks reported FAIL:        {sum(o.result == 'FAIL' for o in correct):4d}",
        f"UNVERIFIED (not compared):           {m['unverified'] + c['unverified']:4d}",
    ]
    misses = [o for o in outcomes if o.verdict not in ("pass", "exact")]
    for o in misses:
        lines.append(f"  {o.verdict:6s} {o.case.name}: diagnosed {list(o.diagnosis)}")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verbose", action="store_true", help="print the report of every miss")
    args = parser.parse_args()
    start = time.perf_counter()
    outcomes = measure(args.verbose)
    print(table(outcomes))
    print(f"({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
