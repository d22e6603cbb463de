"""Run and worker lifecycles as types, with the legal moves written once.

The run's controller is the only writer of a run's state; it asks
:func:`check_transition` before every change so an impossible move (a stopped
run "succeeding", say) is a loud bug rather than a silent inconsistency. An
ended run leaves its terminal state only one way: the user resumes it.
"""

from __future__ import annotations

import enum


class RunState(str, enum.Enum):
    PENDING = "pending"          # waiting for resources (placement group)
    STARTING = "starting"        # worker actors and process group coming up
    RUNNING = "running"
    RESTARTING = "restarting"    # a failure happened; a new worker group is being built
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL

    def __str__(self) -> str:
        return self.value


_TERMINAL = frozenset({RunState.SUCCEEDED, RunState.FAILED, RunState.STOPPED})
TERMINAL_STATE_NAMES = frozenset(state.value for state in _TERMINAL)  # for readers of JSON (the lab server)

_LEGAL: dict[RunState, frozenset[RunState]] = {
    RunState.PENDING: frozenset({RunState.STARTING, RunState.RESTARTING, RunState.FAILED, RunState.STOPPED}),
    RunState.STARTING: frozenset({RunState.RUNNING, RunState.RESTARTING, RunState.FAILED, RunState.STOPPED}),
    RunState.RUNNING: frozenset({RunState.SUCCEEDED, RunState.RESTARTING, RunState.FAILED, RunState.STOPPED}),
    RunState.RESTARTING: frozenset({RunState.PENDING, RunState.STARTING, RunState.FAILED, RunState.STOPPED}),
    RunState.SUCCEEDED: frozenset(),
    RunState.FAILED: frozenset(),
    RunState.STOPPED: frozenset(),
}


def check_transition(current: RunState, new: RunState, *, resume: bool = False) -> None:
    """Raise ``RuntimeError`` if a run may not move from ``current`` to ``new``.

    ``resume``: the user asked to continue an ended run, the one way out of a terminal state.
    """
    if resume and current.is_terminal and new == RunState.RESTARTING:
        return
    if new not in _LEGAL[current]:
        msg = f"illegal run state transition {current.value} -> {new.value}"
        raise RuntimeError(msg)


class WorkerState(str, enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    STALLED = "stalled"     # alive, but no progress for longer than stall_timeout
    PAUSED = "paused"       # held at a step by run.pause() until run.resume() (never counted as stalled)
    FINISHED = "finished"
    FAILED = "failed"       # the training function raised on this rank
    DEAD = "dead"           # the process died (killed, OOM, node lost)
    STOPPED = "stopped"

    def __str__(self) -> str:
        return self.value
