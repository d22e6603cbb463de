"""Ray Train v2's seam for a runner of its own: what ``ray.train.*`` calls reach on a worker.

Imported by :mod:`nbtrain._cluster.rank.ray_train.seam` alone, on the ranks (it imports Ray Train, so it
is not re-exported by :mod:`nbtrain._ray_compat`).

- ``TrainFnUtils`` / ``set_train_fn_utils``: the object every ``ray.train.report``, ``get_context``,
  ``get_checkpoint``... call reaches, and how Ray Train's local mode replaces it.
  Public instead: none (Ray Train's public API assumes its own controller).
  Degrades: on a Ray outside ``TESTED_RAY_MINORS`` each ``ray.train.*`` call raises an error saying
  which Ray to install (:func:`nbtrain._cluster.rank.ray_train.seam.untested_ray`); where the seam is
  gone, importing it fails on the rank, and the rank's failure names this module.
- ``LocalTrainContext``: the context ``ray.train.get_context()`` returns, as Ray Train's local mode
  builds it (``ray.train.v2.api.context``, not exported by ``ray.train``).
"""

from __future__ import annotations

from ray.train.v2._internal.execution.train_fn_utils import TrainFnUtils, set_train_fn_utils
from ray.train.v2.api.context import LocalTrainContext

__all__ = ["LocalTrainContext", "TrainFnUtils", "set_train_fn_utils"]
