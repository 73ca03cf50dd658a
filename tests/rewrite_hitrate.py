"""Rewrites x blocks: does the checker's verdict hold however a block is written (issue 28, item 5)?

``python tests/rewrite_hitrate.py`` checks every case of the zoos (``zoo_realworld``,
``zoo_public``, ``zoo_modern``) as written and under each rewrite of ``tests/rewrites.py``, and
counts the rewritten cases whose outcome (verdict, diagnosis, confident) differs from the
original's. Before a rewritten case counts, the rewrite is proved to keep the block the same
function (float64, 1e-10); a rewrite that finds nothing to change in a block is counted apart
("n/a"), not checked again, and so is one that changes whether the block's backward pass fails
("other backward": a LayerNorm by hand lets an in-place residual train), and so is one whose
block is another function where PyTorch's own paths differ ("other function": an encoder layer's
fast path, which the rewritten block cannot take, see ``rewrites.same_function``).

The full cross product is large; ``--zoo``, ``--rewrite``, ``--only`` (a regular expression on
``zoo:name``) and ``--mistakes`` (``none``: correct blocks only, ``first``: the correct block and its
first mistake, ``spread``: one mistake per block, ``all``) choose a subset. ``--save FILE`` writes the outcomes as JSON lines;
``--verbose`` prints each changed case's two reports.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import re
import sys
import time
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import torch

from gptblock import check_block
from gptblock.check.building.build import width
from rewrites import REWRITES, rewrite_module, rewritten, same_backward, same_function

ZOOS = ("realworld", "public", "modern")


@dataclass(frozen=True)
class Item:
    """One zoo case, buildable as written or rewritten."""

    zoo: str
    name: str
    expected: frozenset
    make: Callable[[str | None], tuple[Any, dict]]  # rewrite name or None -> (target, kwargs)
    tol: float = 1e-10  # how close the rewritten block must be (the zoo's TOLERANCE, if larger)

    def instance(self) -> torch.nn.Module:
        target, kwargs = self.make(None)
        if isinstance(target, torch.nn.Module):
            return target
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            return target(**kwargs)


def _realworld(mistakes: str) -> list[Item]:
    import zoo_realworld

    out = []
    for case in zoo_realworld.cases():
        if not _wanted(case.style.bugs, case.bugs, mistakes):
            continue

        def make(rw, case=case):
            block = case.build()
            return (rewrite_module(block, rw) if rw else block), {}

        out.append(Item("realworld", case.name, case.expected, make))
    return out


def _files(zoo: str, mistakes: str) -> list[Item]:
    package = __import__(f"zoo_{zoo}")
    out = []
    for case in package.cases():
        if not _wanted(tuple(package.spec(case.block).MISTAKES), case.mistakes, mistakes):
            continue

        def make(rw, case=case):
            module = case.module()
            block, args = module.BLOCK, dict(module.ARGS)
            if rw is None:
                return block, args
            if isinstance(block, type):
                return rewritten(block, rw), args
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)
                return rewrite_module(block(**args), rw), {}

        tol = max(1e-10, getattr(package.spec(case.block), "TOLERANCE", 0.0))
        out.append(Item(zoo, case.name, case.expected, make, tol))
    return out


def _wanted(all_bugs, bugs, mistakes: str) -> bool:
    """Whether a case is measured: ``none`` correct blocks only, ``first`` also each block's
    first mistake, ``spread`` one mistake per block chosen by its name (so the blocks between
    them cover the catalogue), ``all`` every case."""
    if not bugs:
        return True
    if mistakes == "none" or len(bugs) != 1:
        return mistakes == "all"
    if mistakes == "spread":
        names = tuple(all_bugs)
        return next(iter(bugs)) == names[zlib.crc32(" ".join(names).encode()) % len(names)]
    return mistakes == "all" or next(iter(bugs)) == next(iter(all_bugs))


def items(zoos=ZOOS, mistakes: str = "all", only: str = "") -> list[Item]:
    out: list[Item] = []
    for zoo in zoos:
        out += _realworld(mistakes) if zoo == "realworld" else _files(zoo, mistakes)
    return [i for i in out if re.search(only, f"{i.zoo}:{i.name}")]


def outcome(item: Item, rw: str | None) -> tuple[dict, str]:
    """The checker's verdict, diagnosis and confidence on the case, and its report."""
    try:
        target, kwargs = item.make(rw)
        report = check_block(target, **kwargs)
    except Exception as e:  # counted: a rewrite must not make the checker raise either
        return {"verdict": "error", "diagnosis": [], "confident": False}, f"{type(e).__name__}: {e}"
    said = {
        "verdict": report.verdict,
        "diagnosis": sorted(report.diagnosis),
        "confident": bool(report.confident),
    }
    return said, str(report)


def measure(its: list[Item], rws: list[str], verbose=False, save=None) -> dict:
    table: dict[str, Counter] = defaultdict(Counter)
    changed: list[str] = []
    with open(save, "w") if save else contextlib.nullcontext() as sink:
        for item in its:
            base, base_text = outcome(item, None)
            C = width(item.instance(), item.make(None)[1])
            for rw in rws:
                same, applied = same_function(item.instance(), rw, C, tol=item.tol)
                if not same:
                    table[rw]["other function"] += 1
                    continue
                if not applied:
                    table[rw]["n/a"] += 1
                    continue
                if not same_backward(item.instance(), rw, C):
                    table[rw]["other backward"] += 1  # e.g. an in-place residual now trains
                    continue
                said, text = outcome(item, rw)
                key = "same" if said == base else "changed"
                table[rw][key] += 1
                if key == "changed":
                    changed.append(
                        f"{rw:14s} {item.zoo}:{item.name}: {_short(base)} -> {_short(said)}"
                    )
                    if verbose:
                        print(
                            f"--- {rw} {item.zoo}:{item.name}\n{base_text}\n--- rewritten:\n{text}\n"
                        )
                if sink:
                    row = {
                        "zoo": item.zoo,
                        "case": item.name,
                        "rewrite": rw,
                        "base": base,
                        "said": said,
                    }
                    sink.write(json.dumps(row) + "\n")
                    sink.flush()
    return {"table": table, "changed": changed}


def _short(o: dict) -> str:
    sure = "" if o["confident"] or o["verdict"] == "PASS" else "?"
    return f"{o['verdict']}{sure} {o['diagnosis'] or ''}".strip()


def render(result: dict, rws: list[str], n_items: int) -> str:
    table = result["table"]
    lines = [
        f"{n_items} cases x {len(rws)} rewrites",
        f"{'rewrite':14s} {'same':>6s} {'changed':>8s} {'n/a':>6s} {'other backward':>15s} {'other function':>15s}",
    ]
    for rw in rws:
        t = table[rw]
        lines.append(
            f"{rw:14s} {t['same']:6d} {t['changed']:8d} {t['n/a']:6d} {t['other backward']:15d} {t['other function']:15d}"
        )
    total = sum(t["changed"] for t in table.values())
    checked = sum(t["same"] + t["changed"] for t in table.values())
    lines.append(f"rewritten cases checked: {checked}, outcome changed: {total}")
    lines += [f"  {c}" for c in result["changed"]]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo", action="append", choices=ZOOS, help="only these zoos")
    parser.add_argument("--rewrite", action="append", choices=list(REWRITES), help="only these")
    parser.add_argument("--mistakes", choices=("none", "first", "spread", "all"), default="all")
    parser.add_argument("--only", default="", help="only cases whose 'zoo:name' matches this regex")
    parser.add_argument("--save", help="write every outcome as a JSON line to this file")
    parser.add_argument("--verbose", action="store_true", help="print each change's reports")
    args = parser.parse_args()
    start = time.perf_counter()
    its = items(args.zoo or ZOOS, args.mistakes, args.only)
    rws = args.rewrite or list(REWRITES)
    print(render(measure(its, rws, args.verbose, args.save), rws, len(its)))
    print(f"({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
