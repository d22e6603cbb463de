"""What the notebook sends to the cluster to start a run: one picklable value.

The training function travels as cloudpickle bytes so the supervisor never has
to import the user's code (a notebook's ``__main__``); only workers unpickle it.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any


@dataclasses.dataclass
class RunSpec:
    name: str
    fn_bytes: bytes
    fn_takes_config: bool
    config: dict[str, Any]
    workers: int = 2
    cpus_per_worker: float = 1
    gpus_per_worker: float = 0
    max_failures: int = 0
    backend: str | None = None           # None: nccl when gpus_per_worker > 0, else gloo
    collective_timeout_s: float = 300.0
    stall_timeout_s: float = 120.0
    on_stall: str = "warn"                # warn | fail | restart
    placement_timeout_s: float = 60.0
    placement_strategy: str = "PACK"
    storage: str | None = None            # shared path for checkpoints on multi-node clusters
    stop_on_nan: bool = False
    flush_interval_s: float = 0.25  # rows reach the notebook ~0.15 s later at p50; fewer actor calls leave the cores to DDP
    checkpoint_weights_only: bool = True
    total_steps: int | None = None
    total_epochs: int | None = None
    datasets: dict[str, Any] | None = None  # travels beside the pickled spec (see launch())
    owner: dict[str, Any] = dataclasses.field(default_factory=dict)  # notebook path, host, pid
    created: float = dataclasses.field(default_factory=time.time)
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    sources: dict[str, str] = dataclasses.field(default_factory=dict)  # cell code, for tracebacks

    @property
    def resolved_backend(self) -> str:
        if self.backend:
            return self.backend
        return "nccl" if self.gpus_per_worker > 0 else "gloo"
