"""The shape of the package: no import cycle (imports inside functions count), one job per module stated in its
first docstring, no module past 500 lines, and docs/design.md's module table matching the tree."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "vlrl"
MAX_LINES = 500


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def imports_of(path: Path, known: dict) -> set[str]:
    """The vlrl modules `path` imports anywhere in it (top level, inside functions, under TYPE_CHECKING)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != "vlrl":
                out.add(name)
    return out


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}

    def visit(node, path):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt, path)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node, [])):
            return cycle
    return None


def test_find_cycle_sees_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle():
    known = modules()
    graph = {name: imports_of(path, known) - {name} for name, path in known.items()}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


@pytest.mark.parametrize("name", sorted(modules()))
def test_module_is_small_and_says_its_job(name):
    path = modules()[name]
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines: split it by job (docs/design.md)"
    if path.name != "__main__.py" and path.parent.name != "presets":
        assert ast.get_docstring(ast.parse(path.read_text())), f"{path.relative_to(ROOT)} has no docstring"


def test_design_table_matches_the_tree():
    text = (ROOT / "docs" / "design.md").read_text()
    table = text[text.index("## Modules"):]
    table = table[:table.index("\n## ", 1)]
    named = set(re.findall(r"^\| `([\w/]+(?:\.py)?/?)`", table, flags=re.MULTILINE))
    tree = {p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py")}
    tree |= {f"{p.name}/" for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()
             and p.name != "presets"}
    assert named == tree, f"docs/design.md's table lacks {sorted(tree - named)}, names missing {sorted(named - tree)}"
