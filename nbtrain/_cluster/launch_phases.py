"""Where a launch's time goes: when each phase of a run's first attempt ended, each in the wall clock of the process
where it happened.

The notebook stamps the launch call (:attr:`RunSpec.launch_called`), the supervisor its own start and the moment its
ranks were leased or started and placed, and each rank what it did (its heartbeat's ``phases``): the process group
formed, the training function unpickled, its first report. A rank phase ends when it ended on every rank. The summary
carries them (``launch_phases``) and the notebook adds when its reader saw the first row; ``Run.timeline()`` turns them
into seconds since the launch call, so a slower launch names the phase that grew.
"""

from __future__ import annotations

import threading
from typing import Any

LAUNCH_CALL = "launch_call"            # the notebook's launch() began (its process)
SUPERVISOR_UP = "supervisor_up"        # the run's supervisor actor was made (its process)
RANKS_ASSIGNED = "ranks_assigned"      # every rank's worker leased or started, and placed (the supervisor's)
GROUP_FORMED = "group_formed"          # torch.distributed's process group joined, on every rank (theirs)
FUNCTION_LOADED = "function_loaded"    # the training function unpickled, on every rank
FIRST_STEP = "first_step"              # the first report, on every rank
FIRST_ROW = "first_row"                # the notebook's reader got its first metric row (the notebook's)

RANK_PHASES = (GROUP_FORMED, FUNCTION_LOADED, FIRST_STEP)
PHASES = (LAUNCH_CALL, SUPERVISOR_UP, RANKS_ASSIGNED, *RANK_PHASES, FIRST_ROW)  # in the order they happen


class LaunchPhases:
    """The supervisor's record of its run's first attempt's phases (later attempts, restarts, leave it as it is)."""

    def __init__(self, launch_called: float | None, supervisor_up: float) -> None:
        self._lock = threading.Lock()  # ranks' pushes land on several threads
        self._at: dict[str, float] = {SUPERVISOR_UP: supervisor_up}
        if launch_called is not None:
            self._at[LAUNCH_CALL] = launch_called
        self._attempt: int | None = None
        self._world_size = 0
        self._warm_ranks = 0
        self._by_rank: dict[int, dict[str, float]] = {}
        self.first_step = threading.Event()  # every rank of the first attempt reported once

    def ranks_assigned(self, attempt: int, world_size: int, warm_ranks: int, at: float) -> None:
        """The first attempt's ``world_size`` ranks are placed, ``warm_ranks`` of them in warm workers lent again."""
        with self._lock:
            if self._attempt is not None:
                return
            self._attempt, self._world_size, self._warm_ranks = attempt, world_size, warm_ranks
            self._at[RANKS_ASSIGNED] = at

    def rank_reached(self, rank: int, attempt: int, phases: dict[str, float]) -> None:
        """What a rank's heartbeat says it did, and when; another attempt's is left out."""
        if not phases or attempt != self._attempt:
            return
        with self._lock:
            mine = self._by_rank.setdefault(rank, {})
            for phase, at in phases.items():
                if phase in RANK_PHASES:
                    mine.setdefault(phase, at)
            if all(FIRST_STEP in self._by_rank.get(r, {}) for r in range(self._world_size)):
                self.first_step.set()

    def summary(self) -> dict[str, Any]:
        """``at``: each phase ended so far, by name (a rank phase once every rank is past it, at the last one's
        time); ``world_size`` and ``warm_ranks``: how many ranks the first attempt had, and how many were lent warm."""
        with self._lock:
            at = dict(self._at)
            for phase in RANK_PHASES:
                times = [self._by_rank.get(rank, {}).get(phase) for rank in range(self._world_size)]
                if times and all(t is not None for t in times):
                    at[phase] = max(t for t in times if t is not None)
            return {"at": at, "world_size": self._world_size, "warm_ranks": self._warm_ranks}


def timeline(launch_phases: dict[str, Any] | None, first_row: float | None = None) -> dict[str, float]:
    """Seconds from the launch call to the end of each phase reached, in the phases' order: a summary's
    ``launch_phases`` and when the notebook saw the first row. Empty when the launch call is not known (a run
    started by an older nbtrain)."""
    at = dict((launch_phases or {}).get("at") or {})
    if first_row is not None:
        at[FIRST_ROW] = first_row
    called = at.get(LAUNCH_CALL)
    if called is None:
        return {}
    return {phase: round(at[phase] - called, 4) for phase in PHASES if phase != LAUNCH_CALL and phase in at}
