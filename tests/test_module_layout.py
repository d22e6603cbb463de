"""The package's layout holds: no import circles between nbtrain's modules, and each sub-package says what
it holds and which process runs it.

Every ``import`` counts, at module level, inside functions and under ``TYPE_CHECKING`` alike: a
circle through a function-level import is still two modules that each need the other. One edge is
exempt, named below with its reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "nbtrain"

# A %%ray_train cell's `nbtrain` name is the public API itself, which imports everything (the magics
# included, for %load_ext): the code that runs the cell on a rank hands that module to the cell.
EXEMPT = {("nbtrain._views.cell_program", "nbtrain")}


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The nbtrain modules ``name`` imports (``from pkg import mod`` counts as ``pkg.mod``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                           for alias in node.names)
    return {target for target in targets if target in modules and target != name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: {t for t in _imports(name, path, modules) if (name, t) not in EXEMPT}
            for name, path in modules.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
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
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
    return circles


def test_no_module_imports_another_that_imports_it_back() -> None:
    graph = _graph()
    assert len(graph) > 80, "the walk found too few modules"
    assert _circles(graph) == []


def test_the_circle_check_finds_a_circle() -> None:
    graph = _graph()
    graph["nbtrain._cluster.rank.payload"] = graph["nbtrain._cluster.rank.payload"] | {"nbtrain._cluster.rank.worker"}
    assert ["nbtrain._cluster.rank.payload", "nbtrain._cluster.rank.worker"] in _circles(graph)


def test_every_sub_package_says_what_it_holds() -> None:
    for init in PACKAGE.rglob("__init__.py"):
        if "labextension" in init.parts:
            continue
        docstring = ast.get_docstring(ast.parse(init.read_text()))
        assert docstring and len(docstring) > 60, f"{init.relative_to(PACKAGE.parent)} has no docstring to say so"


MODULES_PER_FOLDER = 14  # past this a folder lists several concerns: split it by the decision each file makes


def test_no_folder_holds_more_modules_than_a_reader_scans_at_once() -> None:
    crowded = {}
    for folder in {path.parent for path in PACKAGE.rglob("*.py")}:
        modules = [path for path in folder.glob("*.py") if path.name != "__init__.py"]
        if len(modules) > MODULES_PER_FOLDER:
            crowded[str(folder.relative_to(PACKAGE.parent))] = len(modules)
    assert crowded == {}, f"group these folders' modules into sub-packages by concern: {crowded}"
