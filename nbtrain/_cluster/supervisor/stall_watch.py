"""A rank that makes no progress for ``stall_timeout_s``: said once, its stacks asked for, and per ``on_stall``
the attempt goes on (``warn``), fails (``fail``) or restarts (``restart``); its recovery is said once too."""

from __future__ import annotations

from nbtrain._cluster.supervisor import stall_stacks
from nbtrain._cluster.supervisor.controller_callback import ControllerCallback, RunView
from nbtrain._cluster.supervisor.failure_policy import Failed, Failure, Outcome


class StallWatch(ControllerCallback):
    def on_watch_tick(self, run: RunView) -> Outcome | None:
        """The ranks newly stalled (an event each, then their stacks) and those moving again (an event each)."""
        options, attempt = run.spec.options, run.attempt
        stalled = []
        for rank, quiet in run.table.newly_stalled(options.stall_timeout_s):
            message = (f"Rank {rank} made no progress for {quiet:.0f} s (stall_timeout={options.stall_timeout_s:g} s); "
                       f"it may be stuck in a collective or in data loading.")
            run.feed.event("stall", message, attempt)
            stalled.append((rank, message))
        if stalled:  # where each rank is: an event next (a stall that ends the attempt waits for it first)
            ends = options.on_stall in ("fail", "restart")
            stall_stacks.ask(run.steering, run.table.steering_now(),
                             lambda said: run.feed.event("stacks", said, attempt), wait=ends)
            if ends:
                rank, message = stalled[0]
                return Failed([Failure(rank, "stalled", message, retriable=options.on_stall == "restart")])
        for rank, quiet in run.table.newly_recovered():
            run.feed.event("stall", f"Rank {rank} made progress again after {quiet:.0f} s without.", attempt)
        return None
