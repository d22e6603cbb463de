"""The notebook's own modules travel with the run, so the ranks import them as the notebook has them.

A notebook that does ``from mymodels import Net`` beside ``mymodels.py`` sends ``Net`` by name; a
rank, on another machine or just in another working directory, has no ``mymodels`` to import.
At launch nbtrain finds the modules the training function's pickle needs by name (and any module
its code imports) that live outside the Python installation — next to the notebook, or a
project installed in editable mode — and packs their files with the function. A rank unpacks
them into a directory of its node named by their content hash, puts it first on ``sys.path``,
and drops earlier imports of those modules: a warm worker that ran the previous version imports
the new one, never the old (``tests/test_shipped_modules.py``).

Refused before any rank starts, naming the module and what to do: more than
``MAX_SHIPPED_BYTES`` of files, or a compiled extension (it would need the cluster's platform).
Runs in the notebook kernel (:func:`dumps_with_modules`) and in the rank (:meth:`Shipment.load`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import site
import sys
import sysconfig
import tempfile
import types
import zipfile
from pathlib import Path
from typing import Any

from nbtrain._exceptions import NotSerializableError
from nbtrain._packing import code_origin

MAX_SHIPPED_BYTES = 100 * 2**20
SKIPPED_DIRS = frozenset({"__pycache__", ".git", ".ipynb_checkpoints", ".mypy_cache", ".pytest_cache"})
COMPILED_SUFFIXES = (".so", ".pyd", ".dylib")
NEVER_SHIPPED = frozenset({"__main__", "nbtrain"})  # __main__ travels by value; nbtrain is on the cluster


@dataclasses.dataclass(frozen=True)
class Shipment:
    """The function's pickle and the files of the modules it needs, as one picklable value."""

    function: bytes
    archive: bytes                   # a zip of the modules' files, paths relative to their sys.path entry
    modules: tuple[str, ...]         # their top-level names
    digest: str                      # a short content hash, shown in the dashboard's header

    def load(self) -> Any:
        """On the rank: the modules importable (this version of them), then the function."""
        import cloudpickle

        root = unpacked(self.archive, "nbtrain-shipped", self.digest)
        forget_earlier_versions(root, self.modules)
        sys.path[:] = [str(root)] + [entry for entry in sys.path if "nbtrain-shipped" not in entry]
        return cloudpickle.loads(self.function)


def forget_earlier_versions(root: Path, names: tuple[str, ...] = ()) -> None:
    """On a warm worker, before this run imports from ``root`` (a folder :func:`unpacked` made): forget the
    modules an earlier run imported from another such folder of the same kind (its version of them), and any
    module named ``names`` (or inside one), so that this run imports its own."""
    kind = f"{os.sep}{root.parent.name}{os.sep}"
    for name, module in list(sys.modules.items()):
        location = getattr(module, "__file__", None) or ""
        if name.partition(".")[0] in names or (kind in location and not location.startswith(str(root))):
            del sys.modules[name]


def unpacked(archive: bytes, kind: str, digest: str) -> Path:
    """On the rank: ``archive`` unzipped once per node into ``<tmp>/<kind>/<digest>`` (staged, then renamed,
    so that ranks sharing the node never see half of it)."""
    root = Path(tempfile.gettempdir()) / kind / digest
    if not root.exists():
        root.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{digest}-", dir=root.parent))
        with zipfile.ZipFile(io.BytesIO(archive)) as files:
            files.extractall(staging)
        try:
            staging.rename(root)
        except OSError:  # another rank of this node unpacked the same files first
            pass
    return root


def dumps_with_modules(fn: Any) -> tuple[bytes, tuple[str, ...]]:
    """Pickle ``fn`` and, when it needs modules the cluster may lack, their files with it; returns the
    bytes a rank loads with :func:`loads` and the shipped modules' names (``name@digest``)."""
    import cloudpickle

    function, names = code_origin.dumps_naming_modules(fn)
    installed = _installed_roots()
    local = sorted({top for name in names if (top := _local_top_level(name, installed)) is not None})
    if not local:
        return function, ()
    archive = _archive(local)
    digest = hashlib.sha256(archive).hexdigest()[:12]
    shipment = Shipment(function=function, archive=archive, modules=tuple(local), digest=digest)
    data: bytes = cloudpickle.dumps(shipment)
    return data, tuple(f"{name}@{digest[:7]}" for name in local)


def import_local_modules(names: list[str]) -> list[str]:
    """Import here the user's own modules among ``names`` (files beside the notebook, found without running
    them) that the notebook has not imported: a ``%%ray_train`` cell's ``from datautils import ...`` then
    travels with the run like any module the notebook uses. One that fails to import here is left to the
    ranks, which say why. Returns the names imported."""
    import importlib
    import importlib.util

    installed, imported = _installed_roots(), []
    for name in dict.fromkeys(name.partition(".")[0] for name in names):
        if name in sys.modules or name in NEVER_SHIPPED:
            continue
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        origin = getattr(spec, "origin", None)
        if spec is None or not origin or not os.path.isfile(origin) or os.path.realpath(origin).startswith(installed):
            continue
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - e.g. it needs a GPU: the ranks import it themselves, or say why
            continue
        imported.append(name)
    return imported


def loads(data: bytes) -> Any:
    """On the rank: the training function, its shipped modules importable first."""
    import cloudpickle

    loaded = cloudpickle.loads(data)
    return loaded.load() if isinstance(loaded, Shipment) else loaded


def _local_top_level(name: str, installed: tuple[str, ...]) -> str | None:
    """The top-level module of ``name`` when it is the user's own (outside the Python installation)."""
    import cloudpickle

    top = name.partition(".")[0]
    module = sys.modules.get(top)
    if top in NEVER_SHIPPED or not isinstance(module, types.ModuleType):
        return None
    if any(registered.partition(".")[0] == top for registered in cloudpickle.list_registry_pickle_by_value()):
        return None  # its functions and classes travel by value already
    location = getattr(module, "__file__", None)
    if not location:
        return None  # built into the interpreter, or a namespace package (nothing of its own to send)
    real = os.path.realpath(location)
    return None if real.startswith(installed) else top


def _installed_roots() -> tuple[str, ...]:
    """Where installed code lives: the standard library and every site-packages this interpreter sees."""
    paths = {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    paths.update(site.getsitepackages())
    paths.add(site.getusersitepackages())
    paths.update(entry for entry in sys.path if entry.endswith(("site-packages", "dist-packages")))
    return tuple(os.path.realpath(path) + os.sep for path in paths if path)


def _archive(names: list[str]) -> bytes:
    buffer = io.BytesIO()
    total = 0
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in names:
            for path, relative in _files_of(sys.modules[name]):
                if path.suffix in COMPILED_SUFFIXES:
                    msg = (f"The training code uses the module `{name}` from {_where(sys.modules[name])}, which the "
                           f"cluster may not have, and it holds a compiled extension ({relative}), which nbtrain "
                           f"cannot send: it must be built for the cluster's platform. Install `{name}` on the "
                           f"cluster's nodes (pip install it there), or give the run a runtime_env that does.")
                    raise NotSerializableError(msg)
                total += path.stat().st_size
                if total > MAX_SHIPPED_BYTES:
                    msg = (f"The training code uses the module `{name}` from {_where(sys.modules[name])}, which the "
                           f"cluster may not have, and its files pass {_size(MAX_SHIPPED_BYTES)}, more than "
                           f"nbtrain sends with a run. Install `{name}` on the cluster's nodes, or move its data "
                           f"files out of the package (load them from shared storage).")
                    raise NotSerializableError(msg)
                archive.write(path, relative)
    return buffer.getvalue()


def _files_of(module: types.ModuleType) -> list[tuple[Path, str]]:
    """A module's files with their paths as the importer sees them (a package: its whole directory)."""
    location = Path(str(module.__file__))
    if location.name != "__init__.py":
        return [(location, location.name)]
    package = location.parent
    found = []
    for folder, dirs, files in os.walk(package):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        for file in sorted(files):
            if not file.endswith(".pyc"):
                path = Path(folder) / file
                found.append((path, str(path.relative_to(package.parent))))
    return found


def _where(module: types.ModuleType) -> str:
    location = Path(str(module.__file__))
    return str(location.parent if location.name == "__init__.py" else location)


def _size(count: int) -> str:
    return f"{count / 2**20:.0f} MB" if count >= 2**20 else f"{count} bytes"
