"""What the supervisor's faces share: the run's parts, and the reads both faces answer from.

:class:`~nbtrain._cluster.supervisor.supervisor.RunSupervisor` is one Ray actor whose methods are grouped by who calls
them: :class:`~nbtrain._cluster.supervisor.supervisor_for_ranks.ForRanks` (the ranks and their nodes' relays),
:class:`~nbtrain._cluster.supervisor.supervisor_for_notebooks.ForNotebooks` (notebooks, sweeps, the CLI) and its own
lifecycle (:mod:`nbtrain._cluster.supervisor.supervisor`: start, recover, retire). Each face is a class its methods
live in; the actor class composes them, so Ray sees one actor and its callers keep its method names.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from nbtrain._cluster.commands import PATCH
from nbtrain._cluster.storage.run_storage import RunStorage
from nbtrain._cluster.supervisor.controller import RunController
from nbtrain._cluster.supervisor.feed import RunFeed
from nbtrain._cluster.supervisor.worker_table import WorkerTable

READERS = "readers"  # the concurrency group of notebook-facing long polls
READER_THREADS = 16
RANKS = "ranks"  # the concurrency group of the standing questions for commands: one thread each while it
# waits, one per rank, or one per node where the node's relay asks for its ranks (relay/node_question)
RANK_THREADS = 256

Found = tuple[dict[str, Any], bytes | None, str | None]  # a checkpoint: its meta, and its bytes or its path


class SupervisorBase:
    """The parts every face of the supervisor uses (set by ``RunSupervisor.__init__``)."""

    _storage: RunStorage
    _feed: RunFeed
    _table: WorkerTable
    _run: RunController
    _files_where: dict[str, Any] | None
    _deleted: bool   # the run's files were removed: the actor is about to be killed
    _retired: bool   # the ended run is left to its files: the actor is exiting
    _final_files: threading.Lock  # held while the final files are written, so delete() never races them

    def _say(self, kind: str, message: str) -> None:
        """An event of the run's current attempt (the sizing policy's)."""
        self._feed.event(kind, message, self._run.attempt)

    def _read_checkpoint(self, checkpoint: dict[str, Any] | None) -> Found | None:
        if checkpoint is None:
            return None
        path = checkpoint["path"]
        if self._run.spec.options.storage:
            return checkpoint, None, path
        with open(path, "rb") as handle:
            return checkpoint, handle.read(), None

    def _summary_locked(self) -> dict[str, Any]:
        run = self._run
        options = run.spec.options
        workers = self._table.snapshot()
        for worker in workers:
            worker["latest"] = dict(self._feed.latest_by_rank.get(worker["rank"], {}))
        return {
            "name": run.spec.name, "state": run.state.value, "attempt": run.attempt,
            "max_failures": options.max_failures, "workers": workers, "error": run.error,
            "failures": list(run.failures), "checkpoint": run.checkpoint, "started": run.started,
            "ended": run.ended, "now": time.time(), "config_summary": run.spec.config_summary,
            "modules": list(run.spec.modules), "parent": run.spec.parent,
            "world_size": run.world_size or options.max_workers,
            "workers_range": [options.min_workers, options.max_workers],
            "gpus_per_worker": options.gpus_per_worker, "cpus_per_worker": options.cpus_per_worker,
            "total_steps": options.total_steps, "total_epochs": options.total_epochs,
            "step": min([w.get("step", 0) for w in workers] or [0]), "owner": run.spec.owner,
            "latest": dict(self._feed.latest), "launch": run.spec.launch_id,
            **self._table.steering_summary(),
            "changes": run.steering.changes(),
            "guard": run.steering.guard(),
            "rewinds": sum(1 for command in run.steering.rewinds() if command.applied_step is not None),
            "patches": sum(1 for command in run.steering.all()
                           if command.kind == PATCH and command.applied_step is not None),
            "files": self._files_where,
            "launch_phases": run.phases.summary(),
        }
