"""What the controller hands a worker-group factory to start one attempt, and what it gets back.

The controller starts each attempt's ranks through a factory (:meth:`WorkerGroup.start` on a cluster, a fake
in unit tests) and gives it one :class:`AttemptStart`; the factory returns an :class:`AttemptGroup`, which
the controller watches to the end and shuts down. Both live here, apart from the controller and the worker
group, so that each side (and a test's fake) needs only this module to speak to the other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from nbtrain._cluster.commands import Command
from nbtrain._cluster.spec import RunSpec
from nbtrain._cluster.supervisor.failure_policy import Outcome
from nbtrain._cluster.supervisor.worker_table import WorkerTable


@dataclasses.dataclass(frozen=True)
class AttemptStart:
    """One attempt's start, as its worker group needs it."""

    spec: RunSpec
    attempt: int
    world_size: int                      # this attempt's ranks: fixed, or an elastic run's size for now
    supervisor: Any                      # the run's supervisor actor: where ranks push and ask
    datasets: dict[str, Any] | None      # Ray Datasets to split between the ranks
    table: WorkerTable                   # each rank's row, filled as they are placed
    commands: list[Command]              # the run's commands so far: changes a new attempt re-applies
    stop_requested: Callable[[], bool]   # the user's stop, checked while starting
    on_placed: Callable[[], None]        # the placement group is ready (the run becomes ``starting``)
    run_dir: Path                        # the run's directory (see working_folder)
    say: Callable[[str], None]           # an event on the run's feed (a rank started again)
    on_assigned: Callable[[int], None]   # every rank leased or started and placed; how many were lent warm


class NotPlaced(Exception):
    """An elastic attempt above its minimum size was not placed within its grace (``waited_s``): the room its
    size was read from is gone (another job took it as the run asked, or Ray's picture of free resources was a
    moment behind), or its placement strategy cannot use that room. Its group is removed; the controller starts
    the attempt again at the size its sizing policy falls back to, rather than wait out ``placement_timeout_s``
    and fail."""

    def __init__(self, size: int, waited_s: float) -> None:
        super().__init__(f"{size} ranks not placed within {waited_s:.0f} s")
        self.size = size
        self.waited_s = waited_s


class AttemptGroup(Protocol):
    """One attempt's ranks, as the controller uses them
    (:class:`~nbtrain._cluster.supervisor.worker_group.WorkerGroup`)."""

    pushes: dict[int, int]                 # rank -> pushes it sent in all, from its outcome
    unsent: dict[int, dict[str, float]]    # rank -> what its last flush could not send

    def watch(self, table: WorkerTable, interrupt: Callable[[], Outcome | None]) -> Outcome: ...

    def shutdown(self, table: WorkerTable) -> None: ...


StartGroup = Callable[[AttemptStart], AttemptGroup]
