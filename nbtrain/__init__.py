"""nbtrain: distributed PyTorch training on Ray, from a notebook cell.

Driver side::

    import nbtrain
    nbtrain.connect()                              # embedded local cluster, or "ray://head:10001"
    run = nbtrain.launch(train, config={"lr": 0.01}, workers=2)
    run.dashboard()
    nbtrain.launch_script("train.py", args=["--epochs", "5"], workers=2)   # a torchrun script, unchanged

Worker side (inside the training function): ``get_context``, ``report``,
``prepare_model`` (DDP or FSDP, mixed precision), ``prepare_optimizer``, ``backward``,
``prepare_loader``, ``save_checkpoint``, ``load_checkpoint``,
``get_dataset_shard``; code written for Ray Train (``ray.train.report``,
``ray.train.torch.prepare_model``...) runs unchanged, and ``nbtrain.TorchTrainer``
stands in for ``ray.train.torch.TorchTrainer``.

In a notebook: ``%load_ext nbtrain``, then ``%ray_connect`` and ``%%ray_train``.
Heavy imports (torch, widgets, plotly) happen only where they are used, so
``import nbtrain`` stays cheap for the cluster processes that import it too.
"""

from __future__ import annotations

from typing import Any

from nbtrain._client.connecting.connection import Cluster, disconnect
from nbtrain._client.entry.connect import connect
from nbtrain._client.entry.launch import attach, launch, runs
from nbtrain._client.entry.script_launch import launch_script
from nbtrain._client.entry.sweep import Sweep, Trial, attach_sweep, sweeps
from nbtrain._client.entry.sweep_start import tune
from nbtrain._client.entry.torch_trainer import TorchTrainer
from nbtrain._client.run.handle import Run
from nbtrain._client.warm import release_warm
from nbtrain._cluster.rank.data.counted_shard import get_dataset_shard
from nbtrain._cluster.rank.data.loading import prepare_loader
from nbtrain._cluster.rank.rank_steering import on_command
from nbtrain._cluster.rank.reporting import report
from nbtrain._cluster.rank.rewinding import on_rewind
from nbtrain._cluster.rank.session import TrainContext
from nbtrain._cluster.rank.worker_api import (
    backward,
    checkpoint_requested,
    get_context,
    load_checkpoint,
    prepare_model,
    prepare_optimizer,
    save_checkpoint,
    steerable,
    stop_requested,
)
from nbtrain._exceptions import (
    ConnectionFailedError,
    InvalidOptionError,
    NbtrainError,
    NotConnectedError,
    NotSerializableError,
    ResourcesUnavailableError,
    RunExistsError,
    RunFailedError,
    RunNotFoundError,
    StorageError,
    SweepFailedError,
    VersionMismatchError,
)
from nbtrain._states import RunState, WorkerState
from nbtrain._version import __version__ as __version__
from nbtrain._views.compare import compare

__all__ = [
    "Cluster",
    "ConnectionFailedError",
    "InvalidOptionError",
    "LaunchPanel",
    "NbtrainError",
    "NotConnectedError",
    "NotSerializableError",
    "ResourcesUnavailableError",
    "Run",
    "RunExistsError",
    "RunFailedError",
    "RunNotFoundError",
    "RunState",
    "StorageError",
    "Sweep",
    "SweepFailedError",
    "TorchTrainer",
    "TrainContext",
    "Trial",
    "VersionMismatchError",
    "WorkerState",
    "attach",
    "attach_sweep",
    "backward",
    "checkpoint_requested",
    "compare",
    "connect",
    "disconnect",
    "get_context",
    "get_dataset_shard",
    "launch",
    "launch_script",
    "load_checkpoint",
    "on_command",
    "on_rewind",
    "prepare_loader",
    "prepare_model",
    "prepare_optimizer",
    "release_warm",
    "report",
    "runs",
    "save_checkpoint",
    "steerable",
    "stop_requested",
    "sweeps",
    "tune",
]


def __getattr__(name: str) -> Any:
    if name == "LaunchPanel":
        from nbtrain._views.launch_panel import LaunchPanel

        return LaunchPanel
    if name in ("lightning", "huggingface"):  # import PyTorch Lightning / transformers: only when asked for
        import importlib

        return importlib.import_module(f"nbtrain.{name}")
    msg = f"module 'nbtrain' has no attribute {name!r}"
    raise AttributeError(msg)


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """Where the built JupyterLab extension lives (``jupyter labextension develop``)."""
    return [{"src": "labextension", "dest": "nbtrain"}]


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext nbtrain``: registers ``%ray_connect``, ``%%ray_train`` and friends."""
    from nbtrain._views.magics import register

    register(ipython)
