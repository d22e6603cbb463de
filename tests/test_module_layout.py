"""The package's layout holds: no import circles between nbtrain's modules nor between its folders,
imports point the documented way (views → client → cluster → the shared root: import-linter's contracts in
pyproject.toml), and each sub-package says what it holds and which process runs it.

Every ``import`` counts, at module level, inside functions and under ``TYPE_CHECKING`` alike: a
circle through a function-level import is still two modules that each need the other.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "nbtrain"

# A %%ray_train cell's `nbtrain` name is the public API itself, which imports everything (the magics
# included, for %load_ext): the code that runs the cell on a rank hands that module to the cell.
EXEMPT = {("nbtrain._views.cell_program", "nbtrain")}


def _modules(package: Path = PACKAGE) -> dict[str, Path]:
    found = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
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


def _graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    modules = _modules(package)
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
    payload, worker = "nbtrain._cluster.rank.payload", "nbtrain._cluster.rank.actor.worker"
    graph[payload] = graph[payload] | {worker}
    assert any({payload, worker} <= set(circle)
               for circle in _circles(graph))


def test_every_sub_package_says_what_it_holds() -> None:
    for init in PACKAGE.rglob("__init__.py"):
        if "labextension" in init.parts:
            continue
        docstring = ast.get_docstring(ast.parse(init.read_text()))
        assert docstring and len(docstring) > 60, f"{init.relative_to(PACKAGE.parent)} has no docstring to say so"


@pytest.mark.quick
def test_no_two_modules_share_a_file_name() -> None:
    """A file name says which module it is: in a traceback or a search, ``stacks.py`` must not be two things."""
    by_name: dict[str, list[str]] = {}
    for module in PACKAGE.rglob("*.py"):
        if module.name != "__init__.py" and "labextension" not in module.parts:
            by_name.setdefault(module.name, []).append(str(module.relative_to(PACKAGE.parent)))
    assert {name: paths for name, paths in by_name.items() if len(paths) > 1} == {}


# ------------------------------------------------------------------------------------------------ direction
# Which folder may import which is import-linter's (the contracts in pyproject.toml, run by `lint-imports` with
# lint): checked here, that they hold and that they would catch a wrong-way import planted in a copy.

def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` with the project's contracts on the ``nbtrain`` package found first under ``root``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    command = "from importlinter.cli import lint_imports_command; lint_imports_command()"  # the lint-imports script
    return subprocess.run([sys.executable, "-c", command, "--config", str(PACKAGE.parent / "pyproject.toml"),
                           "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_imports_point_the_documented_way_and_a_wrong_way_import_is_caught(tmp_path: Path) -> None:
    kept = _lint_imports(PACKAGE.parent)
    assert kept.returncode == 0, kept.stdout[-3000:] + kept.stderr[-3000:]
    shutil.copytree(PACKAGE, tmp_path / "nbtrain", ignore=shutil.ignore_patterns("__pycache__", "labextension"))
    planted = tmp_path / "nbtrain" / "_cluster" / "names.py"
    planted.write_text(planted.read_text() + "\n\ndef _back():\n    from nbtrain._client import views\n")
    broken = _lint_imports(tmp_path)
    assert broken.returncode != 0 and "nbtrain._cluster.names -> nbtrain._client.views" in broken.stdout, \
        broken.stdout[-3000:]


# ------------------------------------------------------------------------------------------- folder circles
# A folder is a package (its __init__ and its modules); the root's modules are left out (the public API on
# top, the shared modules at the bottom: the direction check above places them). No edge may close a circle.


def _folder(module: str, modules: dict[str, Path]) -> str:
    return module if modules[module].name == "__init__.py" else module.rpartition(".")[0]


def _folder_graph(graph: dict[str, set[str]], modules: dict[str, Path], root: str = "nbtrain") -> dict[str, set[str]]:
    folders: dict[str, set[str]] = {}
    for name, targets in graph.items():
        source = _folder(name, modules)
        if source == root:
            continue
        folders.setdefault(source, set())
        for target in targets:
            into = _folder(target, modules)
            if into not in (root, source):
                folders[source].add(into)
    for targets in list(folders.values()):
        for target in targets:
            folders.setdefault(target, set())
    return folders


def test_no_folder_imports_another_that_imports_it_back() -> None:
    assert _circles(_folder_graph(_graph(), _modules())) == []


def test_the_folder_checks_find_a_planted_circle(tmp_path: Path) -> None:
    package = tmp_path / "nbtrain"
    files = {  # a folder circle that is no module circle (spec → payload → names), and the cluster importing up
        "__init__.py": "from nbtrain._client import launching\n",
        "_paths.py": "",
        "_client/__init__.py": "",
        "_client/launching.py": "from nbtrain import _paths\n",
        "_cluster/__init__.py": "",
        "_cluster/names.py": "from nbtrain import _paths\n",
        "_cluster/spec.py": "def folder():\n    from nbtrain._cluster.rank import payload\n",
        "_cluster/rank/__init__.py": "",
        "_cluster/rank/payload.py": "from .. import names\n",
        "_cluster/rank/worker.py": "def back():\n    import nbtrain._client.launching\n",
    }
    for name, text in files.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    graph = _graph(package)
    assert _circles(graph) == []
    assert _circles(_folder_graph(graph, _modules(package))) == [["nbtrain._cluster", "nbtrain._cluster.rank"]]

