"""Structure rules the lead reviews against, checked from the source text (``ast``, nothing imported):

- no import circles among resacct's modules and ``pytest_resacct`` — every import counts
  (absolute, relative, and those inside functions, which only hide a circle until the function
  runs); only ``if TYPE_CHECKING:`` blocks are left out, as they never run;
- no module under ``resacct/`` over 400 lines (issue 21's bar);
- the layer folders (facts, formulas, measurement, training) never import the CLI, the harness,
  the checks or the report writers, and facts import only facts.

Each rule has an allow-list of today's known exceptions, each with its reason; a new circle or a
new long module fails here, and so does an allow-list entry that no longer applies (delete it).
"""

from __future__ import annotations

import ast
import functools
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "resacct"

# one xdist worker for the module: its tests read one parse of the project's imports (_project_graph,
# ~1.1 CPU s), not one parse per worker that draws one of them
pytestmark = pytest.mark.xdist_group("import-layers")

# Import circles that are known and still to be broken. Each entry is the exact set of modules
# of one strongly connected component of the import graph: a circle that grows (a new module
# joins it) or a new one fails the test.
ALLOWED_CYCLES: dict[frozenset[str], str] = {}

MAX_MODULE_LINES = 400

# Modules over MAX_MODULE_LINES, each with why it is still allowed (none today).
ALLOWED_LONG_MODULES: dict[str, str] = {}


def _module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module under resacct/ and pytest_resacct.py."""
    modules = {"pytest_resacct": REPO / "pytest_resacct.py"}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _is_type_checking_block(node: ast.AST) -> bool:
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement that can run: module level or inside functions/classes, not under
    ``if TYPE_CHECKING:`` (its ``else:`` branch does run)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if _is_type_checking_block(node):
            stack.extend(node.orelse)  # type: ignore[attr-defined]
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def import_graph(files: dict[str, Path] | None = None) -> dict[str, set[str]]:
    """Module -> the project modules it imports (``files``: dotted name -> file, default the
    project's). ``from pkg import name`` points at ``pkg.name`` when that is a module, else at
    ``pkg``."""
    files = _module_files() if files is None else files
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in _runtime_imports(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:
                    base_parts = _package_of(name, path).split(".")
                    base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                    base = ".".join(base_parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base for alias in node.names
                ]
            for target in targets:
                # ``import a.b.c`` names a.b.c; keep the longest prefix that is a project module
                while target and target not in files:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[frozenset[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(frozenset(component))
    return components


def _describe(component: frozenset[str], graph: dict[str, set[str]]) -> str:
    edges = sorted(f"{a} -> {b}" for a in component for b in graph[a] if b in component)
    return "{" + ", ".join(sorted(component)) + "}\n      " + "\n      ".join(edges)


def test_import_graph_sees_relative_function_level_and_submodule_imports(tmp_path: Path) -> None:
    sources = {
        "pkg/__init__.py": "",
        "pkg/a.py": "from . import b\nfrom .sub.c import thing\n",
        "pkg/b.py": "def late():\n    import pkg.sub.c\n    from pkg import d\n",
        "pkg/sub/__init__.py": "from ..d import x\n",
        "pkg/sub/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\nelse:\n    import os\n",
        "pkg/d.py": "import torch\nfrom pkg import nothing_module\n",
    }
    files = {}
    for relative, text in sources.items():
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        parts = Path(relative).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    assert import_graph(files) == {
        "pkg": set(),
        "pkg.a": {"pkg.b", "pkg.sub.c"},
        "pkg.b": {"pkg.sub.c", "pkg.d"},  # function-level imports count
        "pkg.sub": {"pkg.d"},  # relative import from a package's __init__
        "pkg.sub.c": set(),  # TYPE_CHECKING-only import left out
        "pkg.d": {"pkg"},  # ``from pkg import <not a module>`` is the package itself
    }


@pytest.mark.slow  # ~1.0 s (a loaded run's seconds ÷ 6.2) on 2026-11-28
def test_import_graph_covers_the_project() -> None:
    graph = _project_graph()
    assert {"pytest_resacct", "resacct", "resacct.account", "resacct.harness.plugin"} <= set(graph)
    assert "resacct.errors" in graph["resacct.account.answers.gpt_step"]


@functools.cache
def _project_graph() -> dict[str, set[str]]:
    return import_graph()


def test_no_import_cycles_beyond_the_allow_list() -> None:
    graph = _project_graph()
    new = [c for c in import_cycles(graph) if c not in ALLOWED_CYCLES]
    assert not new, "import circles (break them: move the shared pieces into a lower module):\n" + "\n".join(
        _describe(c, graph) for c in new
    )


@pytest.mark.slow  # 1.21 s idle on 2026-11-28
def test_no_circle_hides_under_type_checking(monkeypatch: pytest.MonkeyPatch) -> None:
    """``if TYPE_CHECKING:`` imports never run, but a circle through one is still a circle for a
    reader and for the next runtime import (issue 21: account ↔ layout, machine_profile ↔
    machine_conditions). Counting them, there is none beyond the allow list."""
    monkeypatch.setattr(sys.modules[__name__], "_is_type_checking_block", lambda node: False)
    graph = import_graph()
    new = [c for c in import_cycles(graph) if c not in ALLOWED_CYCLES]
    assert not new, "circles through TYPE_CHECKING imports (type against a Protocol or move the type down):\n" + "\n".join(
        _describe(c, graph) for c in new)


@pytest.mark.slow  # 0.97 s idle on 2026-11-28
def test_cycle_allow_list_has_no_stale_entries() -> None:
    found = set(import_cycles(_project_graph()))
    stale = [sorted(c) for c in ALLOWED_CYCLES if c not in found]
    assert not stale, f"these allowed circles are gone (or changed): delete them from ALLOWED_CYCLES: {stale}"


def test_the_pytest_entry_point_is_imported_by_no_resacct_module() -> None:
    """``pytest_resacct`` is a shim on top of ``resacct.harness``: the dependency points one way.
    What the harness shares with it lives in ``resacct.harness.pytest_settings``."""
    graph = _project_graph()
    importers = sorted(name for name, targets in graph.items() if "pytest_resacct" in targets)
    assert not importers, f"these modules import the pytest entry point (import from resacct.harness.pytest_settings): {importers}"


def _line_count(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_module_much_over_400_lines() -> None:
    long = {
        str(path.relative_to(REPO)): _line_count(path)
        for path in sorted(PACKAGE.rglob("*.py"))
        if _line_count(path) > MAX_MODULE_LINES and str(path.relative_to(REPO)) not in ALLOWED_LONG_MODULES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by meaning, re-export old names): {long}"


#: the scripts beside the package: the same bar (a helper module beside the script, imported by it, when one grows)
SCRIPT_FOLDERS = ("tools", "benchmarks")


def test_no_script_much_over_400_lines() -> None:
    """tools/ and benchmarks/ hold scripts a reader opens too (tools/gpu_record.py was 546 lines): the same bar."""
    scripts = [path for folder in SCRIPT_FOLDERS for path in sorted((REPO / folder).rglob("*.py")) if "__pycache__" not in path.parts]
    assert any(path.name == "gpu_record.py" for path in scripts), "no script found under tools/: the rule checks nothing"
    long = {str(path.relative_to(REPO)): _line_count(path) for path in scripts
            if _line_count(path) > MAX_MODULE_LINES and str(path.relative_to(REPO)) not in ALLOWED_LONG_MODULES}
    assert not long, f"scripts over {MAX_MODULE_LINES} lines (split them into modules beside them): {long}"


def test_long_module_allow_list_has_no_stale_entries() -> None:
    stale = [
        name for name in ALLOWED_LONG_MODULES if not (REPO / name).exists() or _line_count(REPO / name) <= MAX_MODULE_LINES
    ]
    assert not stale, f"these modules are now short enough (or gone): delete them from ALLOWED_LONG_MODULES: {stale}"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ({"a": {"b"}, "b": {"a"}, "c": {"a"}}, [frozenset({"a", "b"})]),
        ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"d"}}, [frozenset({"a", "b", "c"})]),
    ],
)
def test_cycle_finder_on_small_graphs(source: dict[str, set[str]], expected: list[frozenset[str]]) -> None:
    assert import_cycles(source) == expected


# --- Layers --------------------------------------------------------------------------------------
# The library's layer folders: facts at the bottom, then formulas, measurement and the training
# substrate. None of them reaches up into the command line, the claims harness, the checks or the
# report writers; facts read nothing but facts (and the error and validation modules).
LAYER_FOLDERS = ("facts", "formulas", "measurement", "training")
ABOVE_THE_LAYERS = ("resacct.cli", "resacct.harness", "resacct.checks", "resacct.reporting")
FACTS_MAY_IMPORT = ("resacct.facts", "resacct.errors", "resacct.formulas.validation")
ALLOWED_FACT_IMPORTS: dict[tuple[str, str], str] = {}  # none: the state-tensor counts moved to resacct.facts.optimizer_state


def _in_layer(module: str, layers: tuple[str, ...] = LAYER_FOLDERS) -> bool:
    return any(module == f"resacct.{layer}" or module.startswith(f"resacct.{layer}.") for layer in layers)


def test_no_layer_reaches_up_into_the_cli_harness_checks_or_reports() -> None:
    graph = _project_graph()
    assert any(_in_layer(module) for module in graph), "no layer folder found: the rule checks nothing"
    upward = sorted((module, target) for module, targets in graph.items() if _in_layer(module)
                    for target in targets if target.startswith(ABOVE_THE_LAYERS))
    assert not upward, f"layer modules importing the CLI, harness, checks or reports: {upward}"


def test_facts_import_only_facts() -> None:
    graph = _project_graph()
    found = {(module, target) for module, targets in graph.items() if _in_layer(module, ("facts",))
             for target in targets if target.startswith("resacct.") and not target.startswith(FACTS_MAY_IMPORT)}
    assert found - set(ALLOWED_FACT_IMPORTS) == set(), f"facts importing a higher layer: {sorted(found - set(ALLOWED_FACT_IMPORTS))}"
    assert set(ALLOWED_FACT_IMPORTS) <= found, f"stale allow-list entries: {sorted(set(ALLOWED_FACT_IMPORTS) - found)}"


MAX_ROOT_MODULES = 6


def test_the_package_root_keeps_only_its_face() -> None:
    """Issue 21: the root holds the package's face (``__init__``, ``__main__``, the API, the errors);
    everything else lives in its layer folder or in ``resacct/account/``."""
    root_modules = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(root_modules) <= MAX_ROOT_MODULES, f"{len(root_modules)} modules directly under resacct/: {root_modules}"


ACCOUNT_STAGES = ("load", "trace", "peak", "fit", "answers", "render", "gpu")
GPU_STAGES = ("allocator", "tracing", "timing", "records", "answers")


@pytest.mark.parametrize(("folder", "stages"), [("account", ACCOUNT_STAGES), ("account/gpu", GPU_STAGES)])
def test_a_pipeline_folder_is_its_stages(folder: str, stages: tuple[str, ...]) -> None:
    """The house note: ``account/`` is read as the pipeline — its root holds only ``__init__`` and the stage folders
    (load → trace → peak → fit → answers → render, and gpu); so is ``account/gpu/`` (it had grown to 26 flat modules:
    allocator → tracing → timing → records → answers). A new module goes into the stage it belongs to, and each stage's
    ``__init__`` says what it holds."""
    root = PACKAGE / folder
    flat = sorted(path.name for path in root.glob("*.py") if path.name != "__init__.py")
    found = sorted(path.name for path in root.iterdir() if path.is_dir() and path.name != "__pycache__")
    assert flat == [], f"modules directly under resacct/{folder}/ (move each into its stage folder): {flat}"
    assert found == sorted(stages), f"{folder}/'s stage folders are {found}, expected {sorted(stages)}"
    for stage in stages:
        assert (root / stage / "__init__.py").read_text().startswith('"""'), f"{folder}/{stage}/__init__.py says what the stage holds"
