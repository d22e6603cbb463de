"""An elastic run's resizes, from the sizing policy the controller was given (:mod:`nbtrain._cluster.elastic.policy`):
asked each watch tick whether to end the attempt at a checkpoint to grow, shrink or leave a draining node, and
told when the run ends (it withdraws its request to the autoscaler). A fixed-size run's policy never resizes."""

from __future__ import annotations

from nbtrain._cluster.supervisor.controller_callback import ControllerCallback, RunView
from nbtrain._cluster.supervisor.failure_policy import Outcome
from nbtrain._states import RunState


class Resizes(ControllerCallback):
    def on_watch_tick(self, run: RunView) -> Outcome | None:
        return run.sizing.tick(run.checkpoint, run.table)

    def on_run_end(self, run: RunView, state: RunState) -> None:
        run.sizing.end()
