"""What the supervisor sends each rank to start it: one picklable value per rank.

Built in the supervisor's process (:mod:`nbtrain._cluster.run.worker_group`), read in the rank's
(:mod:`.worker`): it lives on the rank's side so that the rank needs nothing of the run's code.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from nbtrain._cluster.commands import Command
from nbtrain._cluster.run_folder import RankFolder


@dataclasses.dataclass(frozen=True)
class WorkerPayload:
    """Everything one rank needs to join the process group and run the function."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    gpu_index: int | None
    cuda_visible_devices: str | None
    device_name: str          # "cuda:<gpu_index>" or "cpu"
    attempt: int
    run_name: str
    config: dict[str, Any]
    supervisor: Any
    relay: Any                # this node's push relay, or None: pushes go straight to the supervisor
    flush_interval_s: float
    storage: str | None
    weights_only: bool
    precision: str | None     # prepare_model's default (see parallel)
    backend: str
    master_addr: str
    master_port: int
    collective_timeout_s: float
    fn_bytes: bytes
    fn_takes_config: bool
    cpus_per_worker: float
    datasets: dict[str, Any]
    elastic: bool             # ask the supervisor, now and then, whether it wants a checkpoint (to resize)
    batch_scale: float        # prepare_loader's batch size factor (elastic runs; see elastic.scaling)
    lr_scale: float           # prepare_optimizer's learning rate factor (likewise)
    gns: bool                 # measure the gradient noise scale (see gradient_noise)
    adaptive_batch: tuple[int, int] | None  # per-rank batch bounds (see adaptive_batch)
    commands: list[Command]  # the run's commands so far (see steering): changes a new attempt re-applies
    folder: RankFolder | None = None  # where the run's relative paths go; None: where Ray put it (see run_folder)
    debug_capture_mb: float = 4.0  # a failing rank's post-mortem size cap; 0: none (see post_mortem)
    step_timing: bool = True       # split step time into data wait, compute, communication (see step_timing)


def local_payload(run_name: str, **fields: Any) -> WorkerPayload:
    """A payload for a session with no run around it (tests, benchmarks): rank 0 of 1 on the CPU, no
    supervisor to push to, no function to run; ``fields`` replace any of these."""
    values: dict[str, Any] = dict(
        rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0, gpu_index=None,
        cuda_visible_devices=None, device_name="cpu", attempt=1, run_name=run_name, config={}, supervisor=None,
        relay=None, flush_interval_s=1.0, storage=None, weights_only=True, precision=None, backend="gloo",
        master_addr="127.0.0.1", master_port=0, collective_timeout_s=60.0, fn_bytes=b"", fn_takes_config=False,
        cpus_per_worker=1.0, datasets={}, elastic=False, batch_scale=1.0, lr_scale=1.0, gns=False,
        adaptive_batch=None, commands=[])
    return WorkerPayload(**{**values, **fields})
