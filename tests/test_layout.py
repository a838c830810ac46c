"""The shape of the package: its layers (`vlrl.LAYERS`: a module imports only from its own layer and those below),
no import cycle (imports inside functions count), one job per module stated in its first docstring, no module past
500 lines, at most a dozen modules flat in vlrl/, and docs/design.md's layers and module table matching the tree."""

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


def layer_of(module: str) -> int:
    """The index in `vlrl.LAYERS` of a module's layer, by its package (or its own name, flat in vlrl/)."""
    import vlrl

    top = module.split(".")[1] if "." in module else "__init__"
    for index, (_, members) in enumerate(vlrl.LAYERS):
        if top in members:
            return index
    raise AssertionError(f"{module} belongs to no layer of vlrl.LAYERS: add its package there and to docs/design.md")


def upward_imports(known: dict[str, Path]) -> list[str]:
    """Each import from a lower layer to a higher one, as "module (layer) imports module (layer)"."""
    import vlrl

    found = []
    for name, path in known.items():
        if name == "vlrl":
            continue
        for target in imports_of(path, known):
            if layer_of(target) > layer_of(name):
                found.append(f"{name} ({vlrl.LAYERS[layer_of(name)][0]}) imports {target} "
                             f"({vlrl.LAYERS[layer_of(target)][0]})")
    return sorted(found)


def test_no_import_goes_up_a_layer():
    assert upward_imports(modules()) == []


def test_an_upward_import_is_seen(tmp_path):
    low, high, leaf = tmp_path / "low.py", tmp_path / "high.py", tmp_path / "leaf.py"
    low.write_text("def f():\n    from vlrl.training import train\n")
    high.write_text("from vlrl.base import errors\n")
    leaf.write_text("")
    known = {"vlrl.base.low": low, "vlrl.training.train": high, "vlrl.base.errors": leaf}
    assert upward_imports(known) == ["vlrl.base.low (base) imports vlrl.training.train (training)"]


def test_every_package_is_a_layer_and_few_modules_stand_flat():
    import vlrl

    members = {m for _, ms in vlrl.LAYERS for m in ms}
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists() and p.name != "presets"}
    flat = {p.stem for p in PACKAGE.glob("*.py") if p.name != "__init__.py"}
    assert packages | flat == members, f"vlrl.LAYERS and the tree differ: {sorted((packages | flat) ^ members)}"
    assert len(flat - {"__main__"}) <= 12, f"{len(flat)} modules flat in vlrl/: put them in their layer's package"


def test_design_md_draws_the_layers():
    import vlrl

    text = (ROOT / "docs" / "design.md").read_text()
    drawn = " -> ".join(name for name, _ in vlrl.LAYERS)
    assert drawn in text, f"docs/design.md should show the layers as in vlrl.LAYERS: {drawn}"


@pytest.mark.parametrize("old", ["vlrl.prompts", "vlrl.episodes.trainer", "vlrl.records"])
def test_a_moved_module_imports_under_its_old_name_with_a_warning(old, monkeypatch):
    import importlib
    import sys

    import vlrl

    monkeypatch.delitem(sys.modules, old, raising=False)  # imported under its old name earlier in this process
    with pytest.warns(DeprecationWarning, match=vlrl.MOVED[old]):
        module = importlib.import_module(old)
    assert module is importlib.import_module(vlrl.MOVED[old])


def test_public_names_import_without_a_warning(recwarn):
    from vlrl.recipe import gspo_config
    from vlrl.rewards import format_reward

    import vlrl.config.recipe
    import vlrl.grammar.rewards
    import vlrl.model.loading
    from vlrl.model import load_model

    assert format_reward is vlrl.grammar.rewards.format_reward and gspo_config is vlrl.config.recipe.gspo_config
    assert load_model is vlrl.model.loading.load_model
    assert not [w for w in recwarn if issubclass(w.category, DeprecationWarning) and "vlrl" in str(w.message)]


def test_no_code_imports_a_moved_name():
    import vlrl

    old = set(vlrl.MOVED) | set(vlrl.PUBLIC_NAMES)
    for path in [*PACKAGE.rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "bench").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
                     if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
            used = old & set(names)
            if path.name != "test_layout.py":
                assert not used, f"{path.relative_to(ROOT)} imports {used}: import the module where it lives now"


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


MAX_DOCSTRING_LINES = 25


def long_docstrings(paths) -> list[str]:
    """The modules among `paths` whose docstring runs past MAX_DOCSTRING_LINES lines, as "path (N lines)"."""
    found = []
    for path in paths:
        tree = ast.parse(path.read_text())
        if ast.get_docstring(tree) is not None:
            lines = tree.body[0].end_lineno - tree.body[0].lineno + 1
            if lines > MAX_DOCSTRING_LINES:
                found.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path} ({lines} lines)")
    return found


def test_a_docstring_says_what_and_why_in_a_few_lines():
    """Measurements and their history belong in bench/results/, where bench/README.md finds them."""
    paths = sorted([*PACKAGE.rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "bench").rglob("*.py")])
    assert long_docstrings(paths) == [], f"docstrings over {MAX_DOCSTRING_LINES} lines: move the detail out"


def test_a_long_docstring_is_seen(tmp_path):
    (tmp_path / "long.py").write_text('"""' + "line\n" * 30 + '"""\n')
    (tmp_path / "short.py").write_text('"""One line."""\n')
    found = [name.split(" ")[0] for name in long_docstrings([tmp_path / "long.py", tmp_path / "short.py"])]
    assert [Path(f).name for f in found] == ["long.py"]


def test_design_table_matches_the_tree():
    text = (ROOT / "docs" / "design.md").read_text()
    table = text[text.index("## Modules"):]
    table = table[:table.index("\n## ", 1)]
    named = set(re.findall(r"^\| `([\w/]+(?:\.py)?/?)`", table, flags=re.MULTILINE))
    tree = {p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py")}
    tree |= {f"{p.name}/" for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()
             and p.name != "presets"}
    assert named == tree, f"docs/design.md's table lacks {sorted(tree - named)}, names missing {sorted(named - tree)}"
