"""PyTorch Lightning on nbtrain's ranks: ``nbtrain.lightning.trainer(...)`` inside ``%%ray_train``.

Example (a cell run with ``%%ray_train --workers 2``)::

    trainer = nbtrain.lightning.trainer(max_epochs=3, precision="bf16-mixed")
    trainer.fit(MNISTClassifier(lr=1e-3), datamodule=MNISTDataModule())

The Trainer is wired to the rank it runs on: a DDP (or ``strategy="fsdp"``) strategy
over the process group nbtrain already joined, a cluster environment that gives
Lightning nbtrain's ranks, a logger that streams everything ``self.log`` logs on
every rank to the dashboard (``log_every_n_steps=1``), and a callback that saves a
Lightning checkpoint with the run after each training epoch (``run.checkpoint_dir()``
holds ``checkpoint.ckpt``; :func:`resume_path` gives it back after a restart).
The progress bar is off (the dashboard shows progress; a bar per rank floods the
logs); pass ``enable_progress_bar=True`` to have it. Ray's own Lightning helpers
(``ray.train.lightning.RayDDPStrategy``, ``RayLightningEnvironment``,
``RayTrainReportCallback``, ``prepare_trainer``) work as well, through nbtrain's
Ray Train support.

Uses the ``lightning`` package, 2.3 or later (``ModelParallelStrategy``, which
FSDP2 runs on, came with it): ``pip install 'nbtrain[lightning]'``.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

from nbtrain._cluster.rank import parallel
from nbtrain._cluster.rank.reporting import report
from nbtrain._cluster.rank.session import current_session
from nbtrain._cluster.rank.worker_api import RUN_PRECISION, checkpoint_to_resume, store_checkpoint
from nbtrain._cluster.storage.run_storage import pack_directory
from nbtrain._exceptions import InvalidOptionError

try:
    import lightning.pytorch as pl
    from lightning.pytorch.loggers.logger import Logger, rank_zero_experiment
    from lightning.pytorch.plugins.environments import ClusterEnvironment
    from lightning.pytorch.utilities.model_helpers import is_overridden
except ModuleNotFoundError:
    msg = ("nbtrain.lightning needs the `lightning` package (2.3 or later) in the notebook and on the cluster: "
           "pip install 'nbtrain[lightning]'.")
    raise ModuleNotFoundError(msg) from None

__all__ = ["NbtrainCheckpoint", "NbtrainEnvironment", "NbtrainLogger", "resume_path", "trainer", "trainer_defaults"]

STRATEGY_CHOICES = ("ddp", "fsdp")
CHECKPOINT_NAME = "checkpoint.ckpt"


class NbtrainEnvironment(ClusterEnvironment):
    """Lightning's view of the cluster: nbtrain's ranks, in a process group already joined."""

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        return os.environ.get("MASTER_ADDR", "127.0.0.1")

    @property
    def main_port(self) -> int:
        return int(os.environ.get("MASTER_PORT", "0"))

    @staticmethod
    def detect() -> bool:
        return False

    def world_size(self) -> int:
        return int(current_session().context.world_size)

    def set_world_size(self, size: int) -> None:
        pass  # nbtrain set it

    def global_rank(self) -> int:
        return int(current_session().context.rank)

    def set_global_rank(self, rank: int) -> None:
        pass

    def local_rank(self) -> int:
        return int(current_session().context.local_rank)

    def node_rank(self) -> int:
        return int(current_session().context.node_rank)


class _OnNbtrainRanks:
    """What a strategy asks of the rank: its device, and a sampler shard over all ranks (not devices times nodes)."""

    @property
    def root_device(self) -> Any:
        return current_session().context.device

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        ctx = current_session().context
        return {"num_replicas": ctx.world_size, "rank": ctx.rank}


class NbtrainDDPStrategy(_OnNbtrainRanks, pl.strategies.DDPStrategy):
    """DDP over nbtrain's process group."""


class NbtrainFSDPStrategy(_OnNbtrainRanks, pl.strategies.ModelParallelStrategy):
    """FSDP2 (``fully_shard``) over nbtrain's process group, on GPUs and on CPUs; checkpoints hold the full state.

    A LightningModule with its own ``configure_model`` shards itself there, as Lightning's
    ``ModelParallelStrategy`` asks; one without is sharded for it: the submodules that
    ``auto_wrap_policy`` picks (module classes, or a function of a module), then the whole.
    """

    def __init__(self, auto_wrap_policy: Any = None, **kwargs: Any) -> None:
        kwargs.setdefault("data_parallel_size", current_session().context.world_size)
        kwargs.setdefault("tensor_parallel_size", 1)
        kwargs.setdefault("save_distributed_checkpoint", False)
        super().__init__(**kwargs)
        self.auto_wrap_policy = auto_wrap_policy

    def connect(self, model: Any) -> None:
        if not is_overridden("configure_model", model, pl.LightningModule):
            model.configure_model = lambda: self._shard(model)
        super().connect(model)

    def _shard(self, model: Any) -> None:
        from torch.distributed.tensor import DTensor

        if any(isinstance(p, DTensor) for p in model.parameters()):
            return  # configure_model runs again for each fit/validate/test: shard once
        parallel.shard(model, self.auto_wrap_policy, {"mesh": self.device_mesh["data_parallel"]})


class NbtrainLogger(Logger):
    """Streams what ``self.log`` logs, on every rank, as ``nbtrain.report`` rows (step: Lightning's global step)."""

    @property
    def name(self) -> str:
        return "nbtrain"

    @property
    def version(self) -> str:
        return current_session().context.run_name

    @property
    @rank_zero_experiment
    def experiment(self) -> None:
        return None

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        report(**metrics, **({} if step is None else {"step": step}))

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass  # the run's config is kept with the run already


class NbtrainCheckpoint(pl.Callback):
    """Saves a Lightning checkpoint with the run after every training epoch (on every rank: FSDP gathers), and
    between batches when the notebook asks (``run.checkpoint_now()``); lets the notebook steer the Trainer's
    optimizers (``run.adjust``, pause, commands) and stop after the epoch (``run.stop(after="epoch")``)."""

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        steering = current_session().steering
        steering.epochs_counted = True
        for optimizer in trainer.optimizers:
            steering.steer(optimizer)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        current_session().steering.at_epoch_start(trainer.current_epoch)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if current_session().steering.checkpoint_wanted:  # the same step on every rank: the collective is safe
            self._save(trainer)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._save(trainer)
        if current_session().steering.stop_requested():  # run.stop(after="epoch"): fit() returns as it ends
            trainer.should_stop = True

    @staticmethod
    def _save(trainer: Any) -> None:
        with tempfile.TemporaryDirectory(prefix="nbtrain-lightning-") as directory:
            trainer.save_checkpoint(os.path.join(directory, CHECKPOINT_NAME))  # a collective; rank 0 writes
            if trainer.global_rank == 0:
                store_checkpoint(pack_directory(directory), "directory")
        current_session().steering.saved_checkpoint()


def resume_path() -> str | None:
    """The Lightning checkpoint this attempt started from as a local file, for ``trainer.fit(..., ckpt_path=...)``.

    Returns:
        The ``checkpoint.ckpt`` path, or ``None`` on a fresh start.

    Raises:
        NbtrainError: called outside a training function.

    Example::

        trainer.fit(model, datamodule=dm, ckpt_path=nbtrain.lightning.resume_path())
    """
    from nbtrain._cluster.storage.run_storage import unpack_directory

    found = checkpoint_to_resume()
    if found is None or found[0].get("format") != "directory":
        return None
    directory = unpack_directory(found[1], tempfile.mkdtemp(prefix="nbtrain-lightning-"))
    path = directory / CHECKPOINT_NAME
    return str(path) if path.exists() else None


def trainer_defaults(device: Any) -> dict[str, Any]:
    """The Trainer arguments :func:`trainer` sets unless given: one device per rank (the rank's), no bar.

    Args:
        device: the rank's ``torch.device`` (``nbtrain.get_context().device``).

    Returns:
        ``Trainer`` keyword arguments.

    Example::

        nbtrain.lightning.trainer_defaults(nbtrain.get_context().device)["accelerator"]   # "cpu"
    """
    return {
        "accelerator": "gpu" if device.type == "cuda" else "cpu", "devices": 1, "num_nodes": 1,
        "enable_progress_bar": False, "log_every_n_steps": 1, "enable_checkpointing": False,
        "default_root_dir": tempfile.mkdtemp(prefix="nbtrain-lightning-"),
    }


def trainer(*, strategy: Any = "ddp", precision: Any = RUN_PRECISION, **trainer_kwargs: Any) -> Any:
    """A ``Trainer`` for this rank (see the module docstring); every Trainer argument may be given.

    ``strategy``: ``"ddp"``, ``"fsdp"`` or a strategy object of your own. ``precision``:
    any Lightning precision (``"bf16-mixed"``, ``"16-mixed"``, ``"32-true"``...); by
    default the run's ``precision`` option.

    Args:
        strategy: ``"ddp"``, ``"fsdp"`` or a Lightning strategy object.
        precision: a Lightning precision, or the run's option.
        **trainer_kwargs: any other ``lightning.Trainer`` argument.

    Returns:
        A ``lightning.Trainer`` on nbtrain's process group, logging and checkpointing with the run.

    Raises:
        NbtrainError: called outside a training function, or an unknown ``strategy`` name.

    Example::

        trainer = nbtrain.lightning.trainer(max_epochs=3, precision="bf16-mixed")
        trainer.fit(model, datamodule=dm)
    """
    session = current_session()
    if precision == RUN_PRECISION:
        precision = session.payload.training.precision
    if isinstance(strategy, str):
        if strategy not in STRATEGY_CHOICES:
            choices = " or ".join(map(repr, STRATEGY_CHOICES))
            msg = f"nbtrain.lightning.trainer(strategy={strategy!r}): choose {choices}, or pass a Lightning strategy."
            raise InvalidOptionError(msg)
        strategy = NbtrainFSDPStrategy() if strategy == "fsdp" else NbtrainDDPStrategy()
    if getattr(strategy, "cluster_environment", None) is None:
        strategy.cluster_environment = NbtrainEnvironment()
    loggers = trainer_kwargs.pop("logger", None)
    loggers = [] if loggers in (None, True) else (list(loggers) if isinstance(loggers, (list, tuple)) else [loggers])
    callbacks = [*trainer_kwargs.pop("callbacks", []), NbtrainCheckpoint()]
    return pl.Trainer(**{**trainer_defaults(session.context.device), **trainer_kwargs}, strategy=strategy,
                      callbacks=callbacks, logger=[*loggers, NbtrainLogger()],
                      **({} if precision is None else {"precision": precision}))
