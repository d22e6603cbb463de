"""Ray Train's seam on a rank, put in place only when the run's code imports ``ray.train``.

The seam (:mod:`~nbtrain._cluster.rank.ray_train.seam`) imports ``ray.train.torch`` and Ray
Train v2's internals: 1.8 s of CPU and ~107 MB of memory in each rank process (measured
on the 2-core test machine), which a run that never calls Ray Train would pay for
nothing. So during a run, :func:`watch` puts the seam in place as ``ray.train`` is
imported (when the function is unpickled, or as it runs: ``ray.train.report`` reached
through ``ray`` imports it then), or at once when this process imported it before (a
warm worker's earlier run).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

from nbtrain._cluster.rank.session import active_session

if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec

SEAM_MODULE = "nbtrain._cluster.rank.ray_train.seam"
WATCHED = "ray.train"


def watch() -> None:
    """Until :func:`unwatch`, ``ray.train.*`` calls on this rank reach the run's session (``set_session``)."""
    if WATCHED in sys.modules:
        _install()
    elif not any(isinstance(finder, _ImportWatch) for finder in sys.meta_path):
        sys.meta_path.insert(0, _ImportWatch())


def unwatch() -> None:
    seam = sys.modules.get(SEAM_MODULE)
    if seam is not None:
        seam.uninstall()


def _install() -> None:
    session = active_session()
    if session is None:
        return  # imported between runs: the next run's watch() installs it
    try:
        seam = importlib.import_module(SEAM_MODULE)
    except ImportError as exc:  # Ray Train's packages are missing: its calls raise Ray's own error
        sys.stderr.write(f"nbtrain: Ray Train code will not run on this worker: {exc}\n")
        return
    seam.install(session)


class _ImportWatch(importlib.abc.MetaPathFinder):
    """Finds ``ray.train`` as the path finder would, with a loader that installs the seam once it ran."""

    def find_spec(self, fullname: str, path: Any = None, target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname != WATCHED:
            return None
        sys.meta_path.remove(self)  # once: the seam's own imports of ray.train.* pass by
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _InstallAfter(spec.loader)
        return spec


class _InstallAfter(importlib.abc.Loader):
    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        # what the import system does next, needed now: the seam's imports reach ray.train through ray
        parent, _, child = module.__name__.rpartition(".")
        setattr(sys.modules[parent], child, module)
        _install()

    def __getattr__(self, name: str) -> Any:  # resources, source and the like: the real loader's
        return getattr(self._loader, name)
