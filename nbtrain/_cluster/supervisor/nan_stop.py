"""A reported metric that became NaN: said once per attempt, and, under ``stop_on_nan``, the end of the run.

The rows come with each rank's push (a report batch); the attempt ends at the next watch tick, as a failure
that is not retried: the same code from the same checkpoint would meet the same NaN.
"""

from __future__ import annotations

import threading
from typing import Any

from nbtrain._cluster.supervisor.controller_callback import ControllerCallback, RunView
from nbtrain._cluster.supervisor.failure_policy import Failed, Failure, Outcome
from nbtrain._cluster.supervisor.feed import nan_keys


class NanStop(ControllerCallback):
    def __init__(self) -> None:
        self._seen = threading.Event()  # a NaN arrived under stop_on_nan: the attempt ends at the next tick

    def on_run_start(self, run: RunView) -> None:
        """A resumed run starts without the NaN that ended it."""
        self._seen.clear()

    def on_report_batch(self, run: RunView, rows: list[dict[str, Any]], nan_rows: list[dict[str, Any]]) -> None:
        """The attempt's first NaN is an event naming the rank, the metrics and the step."""
        if not nan_rows:
            return
        row = nan_rows[0]
        stop = run.spec.options.stop_on_nan
        with run.feed.lock:
            first = not any(e["kind"] == "nan" and e["attempt"] == run.attempt for e in run.feed.events)
        if first:
            action = "stopping the run (stop_on_nan)" if stop else "training continues"
            run.feed.event("nan", f"Rank {row['rank']} reported NaN for {', '.join(nan_keys(row))} at step "
                                  f"{row['step']}; {action}.", run.attempt)
        if stop:
            self._seen.set()

    def on_watch_tick(self, run: RunView) -> Outcome | None:
        if self._seen.is_set():
            return Failed([Failure(None, "nan", "a reported metric became NaN and stop_on_nan is set",
                                   retriable=False)])
        return None
