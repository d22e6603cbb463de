"""What the supervisor sends each rank to start it: one picklable value per rank, grouped by concern.

Built in the supervisor's process (:mod:`nbtrain._cluster.supervisor.worker_group`), read in the rank's
(:mod:`.worker`): it lives on the rank's side so that the rank needs nothing of the run's code.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from nbtrain._cluster.commands import Command
from nbtrain._cluster.working_folder import RankFolder


@dataclasses.dataclass(frozen=True)
class RankPlace:
    """Where the rank is among the run's ranks, on its node, and which device it uses (see rank_layout)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    gpu_index: int | None
    cuda_visible_devices: str | None
    device_name: str          # "cuda:<gpu_index>" or "cpu"


@dataclasses.dataclass(frozen=True)
class ProcessGroupJoin:
    """How the rank joins torch's process group."""

    backend: str
    master_addr: str
    master_port: int
    collective_timeout_s: float


@dataclasses.dataclass(frozen=True)
class CodeToRun:
    """The training function, what it is given, and where it runs."""

    fn_bytes: bytes
    fn_takes_config: bool
    config: dict[str, Any]
    datasets: dict[str, Any]  # this rank's shard of each Ray Dataset
    cpus_per_worker: float    # torch's threads (and OMP_NUM_THREADS)
    folder: RankFolder | None = None  # where the run's relative paths go; None: where Ray put it (see working_folder)


@dataclasses.dataclass(frozen=True)
class ReportTo:
    """Where the rank's rows, logs and answers go."""

    supervisor: Any
    relay: Any                # this node's push relay, or None: pushes go straight to the supervisor
    flush_interval_s: float


@dataclasses.dataclass(frozen=True)
class CheckpointSettings:
    """Where checkpoints are written and how they are loaded."""

    storage: str | None
    weights_only: bool


@dataclasses.dataclass(frozen=True)
class TrainingAids:
    """What ``prepare_model``, ``prepare_loader`` and ``prepare_optimizer`` do, and what the rank measures."""

    precision: str | None     # prepare_model's default (see parallel)
    batch_scale: float        # prepare_loader's batch size factor (elastic runs; see elastic.scaling)
    lr_scale: float           # prepare_optimizer's learning rate factor (likewise)
    gns: bool                 # measure the gradient noise scale (see gradient_noise)
    adaptive_batch: tuple[int, int] | None  # per-rank batch bounds (see adaptive_batch)
    step_timing: bool = True  # split step time into data wait, compute, communication (see step_timing)


@dataclasses.dataclass(frozen=True)
class WorkerPayload:
    """Everything one rank needs to join the process group and run the function."""

    run_name: str
    attempt: int
    place: RankPlace
    process_group: ProcessGroupJoin
    code: CodeToRun
    report_to: ReportTo
    checkpoints: CheckpointSettings
    training: TrainingAids
    commands: list[Command]  # the run's commands so far (see steering): changes a new attempt re-applies
    debug_capture_mb: float = 4.0  # a failing rank's post-mortem size cap; 0: none (see post_mortem)


_GROUPS = {"place": RankPlace, "process_group": ProcessGroupJoin, "code": CodeToRun, "report_to": ReportTo,
           "checkpoints": CheckpointSettings, "training": TrainingAids}


def local_payload(run_name: str, **fields: Any) -> WorkerPayload:
    """A payload for a session with no run around it (tests, benchmarks): rank 0 of 1 on the CPU, no
    supervisor to push to, no function to run; ``fields`` (named as in any group, e.g. ``lr_scale=2.0``)
    replace any of these."""
    values: dict[str, Any] = dict(
        rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0, gpu_index=None,
        cuda_visible_devices=None, device_name="cpu", attempt=1, run_name=run_name, config={}, supervisor=None,
        relay=None, flush_interval_s=1.0, storage=None, weights_only=True, precision=None, backend="gloo",
        master_addr="127.0.0.1", master_port=0, collective_timeout_s=60.0, fn_bytes=b"", fn_takes_config=False,
        cpus_per_worker=1.0, datasets={}, batch_scale=1.0, lr_scale=1.0, gns=False, adaptive_batch=None,
        commands=[])
    values.update(fields)
    groups = {name: cls(**{f.name: values.pop(f.name) for f in dataclasses.fields(cls) if f.name in values})
              for name, cls in _GROUPS.items()}
    return WorkerPayload(**groups, **values)
