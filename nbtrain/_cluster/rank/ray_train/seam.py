"""Ray Train v2 code, unchanged, on nbtrain's ranks.

A function written for ``ray.train.torch.TorchTrainer`` calls ``ray.train.report``,
``ray.train.get_context``, ``ray.train.get_checkpoint``, ``ray.train.get_dataset_shard``
and ``ray.train.torch.prepare_model`` / ``prepare_data_loader`` / ``get_device``. All of
them reach the worker's :class:`TrainFnUtils`, which Ray Train v2 lets a runner replace
(its local mode does, with ``set_train_fn_utils``). :class:`NbtrainTrainFnUtils` answers
them from the rank's :class:`~nbtrain._cluster.rank.session.TrainingSession`:

- ``report(metrics, checkpoint=)`` is ``nbtrain.report``: every rank, every call, no
  barrier, no wait for a controller. Rank 0's checkpoint directory is stored with the
  run (other ranks' checkpoints are not kept: Ray Train's usual pattern writes the same
  files on every rank, or only on rank 0).
- ``get_checkpoint()`` is the run's latest checkpoint as a ``ray.train.Checkpoint`` of a
  local directory (after a restart, or on ``resume=True``).
- ``get_context()`` gives the rank's world size and ranks; ``get_dataset_shard(name)``
  the rank's shard of ``datasets=``; the collectives go over nbtrain's process group.

The seam is internal to Ray (:mod:`nbtrain._ray_compat`), so it is tested
against the Ray versions in :data:`TESTED_RAY_MINORS`; on another Ray each of these calls raises an error
that says so instead of misbehaving. This module is imported on the workers only
(it imports ``ray.train.torch``, so that code reaching it as an attribute works).
"""

from __future__ import annotations

import tempfile
from typing import Any

import ray
import ray.train
import ray.train.torch  # functions reach ray.train.torch as an attribute of ray.train

from nbtrain._cluster.rank.data.counted_shard import get_dataset_shard
from nbtrain._cluster.rank.session import TrainingSession
from nbtrain._cluster.rank.worker_api import checkpoint_to_resume, store_checkpoint
from nbtrain._cluster.storage import storage_uri
from nbtrain._cluster.storage.run_storage import checkpoint_files, pack_directory
from nbtrain._exceptions import NbtrainError
from nbtrain._ray_compat import LocalTrainContext, TrainFnUtils, set_train_fn_utils
from nbtrain._version import TESTED_RAY_MINORS


def untested_ray(version: str = ray.__version__) -> str | None:
    """Why Ray Train code cannot run on this Ray (an untested version), or None when it can."""
    minor = ".".join(version.split(".")[:2])
    if minor in TESTED_RAY_MINORS:
        return None
    return (f"Ray Train code (ray.train.report, get_context, prepare_model...) runs under nbtrain on Ray "
            f"{', '.join(TESTED_RAY_MINORS)}; this cluster has Ray {version}, whose internal Ray Train seam "
            f"nbtrain is not tested with. Install a tested Ray on the cluster (pip install 'ray=="
            f"{TESTED_RAY_MINORS[-1]}.*'), or use nbtrain.report / nbtrain.get_context / nbtrain.prepare_model.")


class NbtrainTrainFnUtils(TrainFnUtils):
    """What ``ray.train.*`` calls reach on an nbtrain rank (see the module docstring)."""

    def __init__(self, session: TrainingSession) -> None:
        ctx = session.context
        self._session = session
        self._context = LocalTrainContext(
            experiment_name=ctx.run_name, world_size=ctx.world_size, world_rank=ctx.rank,
            local_rank=ctx.local_rank, local_world_size=ctx.local_world_size, node_rank=ctx.node_rank,
        )

    def report(self, metrics: dict[str, Any], checkpoint: Any = None, checkpoint_dir_name: str | None = None,
               *args: Any, **kwargs: Any) -> None:
        if checkpoint is not None and self._session.context.rank == 0:
            with checkpoint.as_directory() as directory:
                store_checkpoint(pack_directory(directory), "directory")
        self._session.report(dict(metrics))

    def get_checkpoint(self) -> Any:
        found = checkpoint_to_resume()
        if found is None:
            return None
        meta, source = found
        form = meta.get("format", "torch")
        if form == "dcp" and not storage_uri.is_remote(str(source)):  # a DCP directory in a storage= directory
            return ray.train.Checkpoint.from_directory(str(source))
        data, path = (source, None) if isinstance(source, bytes) else (None, source)
        directory = checkpoint_files(form, data, path, tempfile.mkdtemp(prefix="nbtrain-ckpt-"))
        return ray.train.Checkpoint.from_directory(str(directory))

    def get_all_reported_checkpoints(self, *args: Any, **kwargs: Any) -> list[Any]:
        return []  # nbtrain keeps the latest checkpoints, not Ray Train's reported-checkpoint records

    def get_dataset_shard(self, dataset_info: Any) -> Any:
        name = dataset_info.dataset_name
        if name is None and len(self._session.datasets) == 1:
            name = next(iter(self._session.datasets))
        return get_dataset_shard(name or "train")

    def get_context(self) -> LocalTrainContext:
        return self._context

    def get_preemption_info(self) -> None:
        return None

    def is_distributed(self) -> bool:
        # False makes ray.train.torch.get_device() take the current CUDA device, which the
        # worker has set to this rank's GPU (nbtrain's process group is not Ray Train's).
        return False

    def barrier(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.barrier()

    def broadcast_from_rank_zero(self, data: Any) -> Any:
        import torch.distributed as dist

        if not dist.is_initialized():
            return data
        box = [data]
        dist.broadcast_object_list(box, src=0)
        return box[0]


class _RefuseOnUntestedRay:
    """Stands in for the seam on an untested Ray: every ``ray.train.*`` call raises the reason."""

    def __init__(self, reason: str) -> None:
        self._reason = reason

    def __getattr__(self, name: str) -> Any:
        raise NbtrainError(self._reason)


def install(session: TrainingSession) -> None:
    """Make ``ray.train.*`` calls on this worker reach ``session`` (until :func:`uninstall`)."""
    reason = untested_ray()
    set_train_fn_utils(_RefuseOnUntestedRay(reason) if reason else NbtrainTrainFnUtils(session))


def uninstall() -> None:
    set_train_fn_utils(None)

