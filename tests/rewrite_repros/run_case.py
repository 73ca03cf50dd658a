"""One zoo case checked as written and under one rewrite of ``tests/rewrites.py``: both reports.

    PYTHONPATH=src python tests/rewrite_repros/run_case.py 'modern:qwen3/correct' split_scale

The case is named as ``tests/rewrite_hitrate.py`` prints it (``zoo:name``, matched exactly)."""

import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from gptblock.check.building.build import width
from rewrite_hitrate import items, outcome
from rewrites import same_function


def main() -> None:
    case, rewrite = sys.argv[1], sys.argv[2]
    zoo = case.partition(":")[0]
    (item,) = items((zoo,), "all", f"^{re.escape(case)}$")
    C = width(item.instance(), item.make(None)[1])
    print("same function, substitutions:", same_function(item.instance(), rewrite, C, tol=item.tol))
    for rw in (None, rewrite):
        said, text = outcome(item, rw)
        print(f"=== {rw or 'as written'}: {said}\n{text}\n")


if __name__ == "__main__":
    main()
