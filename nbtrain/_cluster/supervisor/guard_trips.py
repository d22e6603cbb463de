"""A rank's guard tripped (see :mod:`nbtrain._cluster.supervisor.guard_decisions`): the guard's action goes to
every rank as one of the run's commands, or the run stops, as the user's stop would (recorded, so a restarted supervisor
keeps it)."""

from __future__ import annotations

import threading

from nbtrain._cluster.supervisor.controller_callback import ControllerCallback, RunView
from nbtrain._states import RunState

GUARD_STOP_WAIT_S = 30.0  # how long the guard's stop waits for the ranks to end


class GuardTrips(ControllerCallback):
    def on_guard_tripped(self, run: RunView, attempt: int, branch: int, step: int, kind: str, message: str) -> None:
        """A trip of the current attempt of a live run is decided; one that asks to stop stops the run on a thread
        of its own (this one is the rank's call, and must not wait for the ranks to end)."""
        with run.feed.lock:
            state, running = run.state, run.table.steering_now()
        if state.is_terminal or attempt != run.attempt:
            return
        if run.steering.guards.tripped(attempt, branch, step, kind, message, running, live=state == RunState.RUNNING):
            threading.Thread(target=run.request_stop, args=(GUARD_STOP_WAIT_S,), name="nbtrain-guard-stop",
                             daemon=True).start()
