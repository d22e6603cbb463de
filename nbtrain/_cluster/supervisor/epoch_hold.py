"""``run.stop(after="epoch")``: each rank holds at its next epoch's start; once every running rank holds, the
attempt ends stopped (the ranks are held, so the function returns nothing: ``run.result`` stays None)."""

from __future__ import annotations

from nbtrain._cluster.supervisor.controller_callback import ControllerCallback, RunView
from nbtrain._cluster.supervisor.failure_policy import Outcome, Stopped


class EpochHold(ControllerCallback):
    def on_watch_tick(self, run: RunView) -> Outcome | None:
        running = run.table.running_ranks()
        held = [said.held_after_epoch for rank, said in run.table.steering_now().items() if rank in running]
        if held and None not in held:
            run.feed.event("state", f"every rank finished epoch {held[0]}: stopping, as run.stop(after='epoch') "
                                    "asked (held at the next epoch's start, so run.result stays None: check "
                                    "nbtrain.stop_requested() after each epoch and return to keep a result)",
                           run.attempt)
            return Stopped()
        return None
