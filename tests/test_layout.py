"""The import direction the README's Layout section promises: each module imports only those
listed above it, the NumPy oracle imports nothing else of gptblock, nothing imports the CLI."""

import ast
import pathlib

import pytest

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "gptblock"

# The layers, bottom up; a module may import only from its own or an earlier layer. A layer is a
# top-level module or a sub-package: blocks/, model/, data/, runs/, train/, interop/, bench/, ...
LAYERS = [
    ["errors", "files", "distributed", "early"],
    ["reference"],
    ["blocks", "lesson"],
    ["devices"],
    ["model"],
    ["exercises", "example"],
    ["lens", "check"],
    ["data"],
    ["sampling"],
    ["runs"],
    ["train"],
    ["interop"],
    ["loading"],
    ["bench"],
    ["cli"],
]
# Arrows that point up: none is left (the model imports no I/O and not the lens), and the test
# below fails on a new one.
KNOWN_UPWARD: set[tuple[str, str]] = set()
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def owner(path):
    """The entry of LAYERS a source file belongs to (its top-level module or sub-package)."""
    return path.relative_to(SRC).parts[0].removesuffix(".py")


def imported(path):
    """The gptblock modules ``path`` imports, by their top-level name (doctests and imports
    for type annotations only, under ``if TYPE_CHECKING:``, aside)."""
    tree = ast.parse(path.read_text())
    package = path.relative_to(SRC).parent.parts  # () at the top, ("check",) in check/
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            node.body = []
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - node.level + 1]
            parts = [*base, *(node.module.split(".") if node.module else [])]
            names = [parts[0]] if parts else [alias.name for alias in node.names]
            found.update(names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gptblock."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("gptblock."))
    return found - {owner(path)}


SOURCES = [p for p in sorted(SRC.rglob("*.py")) if p.name not in ("__init__.py", "__main__.py")]
SOURCES += [SRC / pkg / "__init__.py" for pkg in ("check", "reference", "lens", "cli", "interop")]


def test_every_module_has_a_place():
    assert {owner(p) for p in SOURCES} == set(RANK)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(SRC)))
def test_imports_point_down_the_layers(path):
    mine = RANK[owner(path)]
    upward = {m for m in imported(path) if RANK.get(m, -1) > mine}
    upward -= {m for o, m in KNOWN_UPWARD if o == owner(path)}
    assert not upward, f"{owner(path)} imports {sorted(upward)}, listed after it"


def test_the_known_upward_arrows_are_still_there():
    found = {
        (owner(p), m) for p in SOURCES for m in imported(p) if RANK.get(m, -1) > RANK[owner(p)]
    }
    assert found == KNOWN_UPWARD


def test_the_readme_map_lists_the_layers_in_this_order():
    # README.md's "A map of the packages": an entry per line at two spaces' indent, its names
    # before the description ("errors.py, files.py, distributed.py    UserError ...").
    readme = (SRC.parents[1] / "README.md").read_text(encoding="utf-8")
    block = readme.split("## A map of the packages", 1)[1].split("```text\n", 1)[1]
    block = block.split("```", 1)[0].split("src/gptblock/\n", 1)[1].split("\ntests/", 1)[0]
    entries = [line[2:].split("  ")[0] for line in block.splitlines() if line[2] != " "]
    names = [n.strip().removesuffix(".py").removesuffix("/") for e in entries for n in e.split(",")]
    assert sorted(names) == sorted(RANK), "the map and LAYERS name different modules"
    ranks = [RANK[n] for n in names]
    assert ranks == sorted(ranks), f"the map's order is not LAYERS': {names}"


def test_the_oracle_imports_nothing_of_gptblock():
    for path in (SRC / "reference").glob("*.py"):
        assert imported(path) == set(), path


# What reads or writes files, the machine's state or other processes.
IO_MODULES = {"io", "json", "os", "pathlib", "pickle", "safetensors", "shutil", "subprocess"}


@pytest.mark.parametrize("package", ["reference", "blocks", "lesson", "model"])
def test_the_blocks_and_the_model_import_no_io(package):
    # The model computes; reading files and the machine's memory (/proc) belongs to the layers
    # that own them (devices.available_memory, runs/, interop/).
    root = SRC / package
    for path in sorted(root.rglob("*.py")) if root.is_dir() else [root.with_suffix(".py")]:
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                found.add(node.module.split(".")[0])
            elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "open":
                found.add("open()")
        assert not found & (IO_MODULES | {"open()"}), f"{path.relative_to(SRC)}: {found}"


def module_imports(path):
    """The gptblock modules ``path`` imports, by dotted name under gptblock, type-only imports
    (under ``if TYPE_CHECKING:``) included: a circle of types is still a circle to a reader."""
    package = path.relative_to(SRC).parent.parts
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = [*package[: len(package) - node.level + 1]]
            parts = [*base, *(node.module.split(".") if node.module else [])]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gptblock."):
            parts = node.module.split(".")[1:]
        else:
            continue
        for alias in node.names:  # `from . import state` imports the module state
            submodule = [*parts, alias.name]
            if (SRC.joinpath(*submodule).with_suffix(".py")).is_file():
                found.add(".".join(submodule))
            elif parts:
                found.add(".".join(parts))
    return found - {module_name(path)}


def module_name(path):
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


# Circles of modules: none is left, and none may come back.
KNOWN_CIRCLES: set[frozenset[str]] = set()


def reachable(graph, start):
    seen, todo = set(), [start]
    while todo:
        for b in graph.get(todo.pop(), ()):
            if b not in seen:
                seen.add(b)
                todo.append(b)
    return seen


def test_no_module_imports_itself_round_a_circle():
    graph = {module_name(p): module_imports(p) for p in sorted(SRC.rglob("*.py"))}
    reach = {a: reachable(graph, a) for a in graph}
    circles = {
        frozenset({a} | {b for b in reach[a] if a in reach[b]}) for a in graph if a in reach[a]
    }
    assert circles == KNOWN_CIRCLES


MAX_LINES = 400  # STYLE.md: a file a reader can hold; past it, split along a seam


def test_no_source_file_is_over_400_lines():
    long = {
        str(p.relative_to(SRC)): n
        for p in sorted(SRC.rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"over {MAX_LINES} lines: {long}"


# check/'s rooms, bottom up (check/__init__.py's map): a module of a room may import only its
# own room and the rooms before it; ``serve`` imports no other room (``gptblock.early`` copies it
# alone into the runner's process); ``run`` and the package itself sit above them all.
CHECK_ROOMS = ["serve", "mistakes", "building", "roles", "compare", "isolation", "run"]


def check_room(path):
    """The room of a module under check/ (``run`` for the files at check/'s top)."""
    parts = path.relative_to(SRC / "check").parts
    return parts[0] if len(parts) > 1 else "run"


@pytest.mark.parametrize(
    "path", sorted((SRC / "check").rglob("*.py")), ids=lambda p: str(p.relative_to(SRC))
)
def test_the_checker_rooms_import_down(path):
    assert {check_room(p) for p in (SRC / "check").rglob("*.py")} == set(CHECK_ROOMS)
    package = path.relative_to(SRC).parent.parts
    rooms = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - node.level + 1]
            parts = [*base, *(node.module.split(".") if node.module else [])]
            names = parts[1:2] if len(parts) > 1 else []
            rooms.update(names or [a.name for a in node.names] if parts[:1] == ["check"] else [])
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gptblock.check."):
            rooms.add(node.module.split(".")[2])
    mine = CHECK_ROOMS.index(check_room(path))
    upward = {r for r in rooms if r in CHECK_ROOMS and CHECK_ROOMS.index(r) > mine}
    assert not upward, f"{path.name} ({CHECK_ROOMS[mine]}) imports the later rooms {upward}"
