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
import sys
from collections.abc import Callable
from types import ModuleType

from nbtrain._cluster.rank.session import active_session
from nbtrain._cluster.rank.their_code.on_import import after_import

SEAM_MODULE = "nbtrain._cluster.rank.ray_train.seam"
WATCHED = "ray.train"
_watching: Callable[[], None] | None = None  # stops the watch for ray.train's import, while it waits


def watch() -> None:
    """Until :func:`unwatch`, ``ray.train.*`` calls on this rank reach the run's session (``set_session``)."""
    global _watching
    if WATCHED not in sys.modules and _watching is not None:
        return  # an earlier run's watch still waits for the import
    _watching = after_import(WATCHED, _install)


def unwatch() -> None:
    seam = sys.modules.get(SEAM_MODULE)
    if seam is not None:
        seam.uninstall()


def _install(_ray_train: ModuleType | None = None) -> None:
    session = active_session()
    if session is None:
        return  # imported between runs: the next run's watch() installs it
    try:
        seam = importlib.import_module(SEAM_MODULE)
    except ImportError as exc:  # Ray Train's packages are missing: its calls raise Ray's own error
        sys.stderr.write(f"nbtrain: Ray Train code will not run on this worker: {exc}\n")
        return
    seam.install(session)
