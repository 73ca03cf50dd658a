"""A second zoo of blocks, from public code nobody tuned the checker for (issue 18, item 5).

Each module of ``blocks`` is one block taken from one public repository (named, with its path
and commit, in the module's header): the source's own code, reduced to the lessons' maths (a
pre-norm block: LayerNorm -> causal multi-head self-attention scaled by 1/sqrt(hs) -> residual;
LayerNorm -> MLP of width 4C -> residual), but kept in the source's own shape: its layer types,
parameter layout, packing, views or einsums, function style, names and constructor signature.

Every block module holds, besides the block itself, plain data the zoo reads and the checker
never sees:

* ``SOURCE``: where the code comes from (also in the header comment);
* ``BLOCK`` and ``ARGS``: the block's class and the arguments its source would build it with
  (its own constructor: sizes, or a config object); the checker is given both, as a user would;
* ``REFERENCE``: ``n_head`` and the keyword arguments of ``gptblock.blocks.mha.TransformerBlock``
  (``activation``, ``norm_eps``) that compute the same function;
* ``weights(block)``: the explicit mapping of the block's weights to the lessons' roles, each
  a weight (out, in) and a bias (``None`` where the block has none), and the norms' gain and
  bias (``None`` where a norm has no parameters); ``proof.reference`` loads them into a
  ``TransformerBlock``, and the tests prove the two equal before the block counts;
* ``MISTAKES``: for each catalogued mistake (``id`` or ``id:how``), the edits of the source's
  text that make it, each ``(old, new)`` with ``old`` found exactly once: the line a learner
  would get wrong in *that* code;
* ``PAIRS``: a few of them made together.

A mistaken block is the block's file with its edits applied, written to a temporary folder and
imported from there, so the checker sees exactly the code a learner would have written.
"""

from __future__ import annotations

import functools
import importlib.util
import pathlib
import re
import sys
import tempfile
from dataclasses import dataclass
from types import ModuleType

from zoo_realworld.common import expected

BLOCKS_DIR = pathlib.Path(__file__).resolve().parent / "blocks"
NAMES: list[str] = sorted(p.stem for p in BLOCKS_DIR.glob("*.py") if not p.stem.startswith("_"))


@dataclass(frozen=True)
class Case:
    """One block of the zoo: a block file, correct or with some of its ``MISTAKES`` made."""

    block: str  # the module's name in ``blocks``
    mistakes: tuple[str, ...]  # keys of its MISTAKES; () for the correct block

    @property
    def name(self) -> str:
        return f"{self.block}/{'+'.join(self.mistakes) or 'correct'}"

    @property
    def expected(self) -> frozenset[str]:
        """The catalogue ids the checker should diagnose; empty for a correct block."""
        return frozenset(expected(self.mistakes))

    def module(self) -> ModuleType:
        """The block's module as a learner would have written it, with the mistakes made."""
        return load(self.block, self.mistakes)

    def build(self):
        module = self.module()
        return module.BLOCK(**module.ARGS)


@functools.cache
def spec(block: str) -> ModuleType:
    """The correct block's module, imported from its own file."""
    return _import(f"zoo_public.blocks.{block}", BLOCKS_DIR / f"{block}.py")


def cases(blocks: list[str] | None = None) -> list[Case]:
    """Every block correct, with each of its mistakes, and with each of its pairs."""
    out = []
    for block in blocks or NAMES:
        m = spec(block)
        out.append(Case(block, ()))
        out += [Case(block, (key,)) for key in m.MISTAKES]
        out += [Case(block, tuple(pair)) for pair in getattr(m, "PAIRS", ())]
    return out


MARKER = "# ----- the zoo's data"
"""The line after which a block module holds the zoo's data; edits apply to the code above it."""


def edited(text: str, edits: list[tuple[str, str]], where: str) -> str:
    """``text`` with every ``(old, new)`` edit made in the block's code (above ``MARKER``); each
    ``old`` must occur there exactly once."""
    code, data = text.split(MARKER, 1)
    for old, new in edits:
        n = code.count(old)
        if n != 1:
            raise ValueError(f"{where}: {old!r} occurs {n} times in the code, expected once")
        code = code.replace(old, new)
    return code + MARKER + data


@functools.cache
def load(block: str, mistakes: tuple[str, ...] = ()) -> ModuleType:
    """The block's module with ``mistakes`` made, from a file of its own in a temporary folder."""
    if not mistakes:
        return spec(block)
    table = spec(block).MISTAKES
    text = (BLOCKS_DIR / f"{block}.py").read_text()
    for key in mistakes:
        text = edited(text, table[key], f"{block}/{key}")
    slug = re.sub(r"\W", "_", "+".join(mistakes))
    path = _folder() / f"{block}__{slug}.py"
    path.write_text(text)
    return _import(f"zoo_public_variants.{block}__{slug}", path)


@functools.cache
def _folder() -> pathlib.Path:
    return pathlib.Path(tempfile.mkdtemp(prefix="zoo_public_"))


def _import(name: str, path: pathlib.Path) -> ModuleType:
    module_spec = importlib.util.spec_from_file_location(name, path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is made
    module_spec.loader.exec_module(module)
    return module
