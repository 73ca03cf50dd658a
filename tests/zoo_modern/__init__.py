"""The modern zoo: correct modern blocks (RMSNorm, rotary positions, gated MLPs, grouped keys and
values) in the styles real code writes them, and the mistakes learners make in them (issue 20,
item 5).

Each module of ``blocks`` is one style, written for this zoo after a public source (named in its
first line and in ``SOURCE``), in the format of ``tests/zoo_public`` (whose loader this reuses):
``BLOCK`` and ``ARGS`` build it; ``REFERENCE`` holds ``gptblock.reference.modern.ModernOptions``'
fields that compute the same function, and ``weights(block)`` maps the block's weights to the
oracle's names (``proof`` checks the two equal, in float64); ``MISTAKES`` are edits of its text,
``id`` or ``id:how``, each the line a learner gets wrong in *that* code; ``PAIRS`` a few of them
made together.
"""

from __future__ import annotations

import functools
import pathlib
import re
from types import ModuleType

from zoo_public import MARKER, Case, _folder, _import, edited

__all__ = ["BLOCKS_DIR", "MARKER", "NAMES", "Case", "cases", "load", "spec"]

BLOCKS_DIR = pathlib.Path(__file__).resolve().parent / "blocks"
NAMES: list[str] = sorted(p.stem for p in BLOCKS_DIR.glob("*.py") if not p.stem.startswith("_"))


class ModernCase(Case):
    """A case of this zoo: like ``zoo_public.Case``, its module loaded from ``blocks`` here."""

    def module(self) -> ModuleType:
        return load(self.block, self.mistakes)


@functools.cache
def spec(block: str) -> ModuleType:
    """The correct block's module, imported from its own file."""
    return _import(f"zoo_modern.blocks.{block}", BLOCKS_DIR / f"{block}.py")


def cases(blocks: list[str] | None = None) -> list[Case]:
    """Every block correct, with each of its mistakes, and with each of its pairs."""
    out: list[Case] = []
    for block in blocks or NAMES:
        m = spec(block)
        out.append(ModernCase(block, ()))
        out += [ModernCase(block, (key,)) for key in m.MISTAKES]
        out += [ModernCase(block, tuple(pair)) for pair in getattr(m, "PAIRS", ())]
    return out


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
    path = _folder() / f"modern_{block}__{slug}.py"
    path.write_text(text)
    return _import(f"zoo_modern_variants.{block}__{slug}", path)
