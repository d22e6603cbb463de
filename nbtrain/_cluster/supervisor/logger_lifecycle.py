"""The run's TensorBoard / MLflow writers (``loggers=``): open while the run is live, each report batch written,
closed with the run's final state before anyone sees it.

Closed loggers stay in place until the next attempt opens new ones, so that a push racing the close reaches
them and its rows are written or counted as dropped, never lost unsaid (see
:mod:`nbtrain._cluster.supervisor.metric_loggers`).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from nbtrain._cluster.spec import RunSpec
from nbtrain._cluster.supervisor.controller_callback import ControllerCallback, RunView
from nbtrain._cluster.supervisor.feed import RunFeed
from nbtrain._cluster.supervisor.metric_loggers import MetricLoggers
from nbtrain._states import RunState


def start_loggers(spec: RunSpec, run_dir: Path, feed: RunFeed) -> MetricLoggers | None:
    """The run's writers, announced as an event; None without ``loggers=``."""
    options = spec.options
    if not options.loggers:
        return None
    loggers = MetricLoggers(options.loggers, spec.name, run_dir, Path(options.logger_dir or run_dir),
                            dict(options.config or {}), dict(options.env or {}),
                            on_error=lambda message: feed.event("loggers", message, 0))
    for kind, where in loggers.where.items():
        feed.event("loggers", f"every rank's metrics are also written to {kind} at {where}", 0)
    return loggers


class LoggerLifecycle(ControllerCallback):
    def __init__(self, run_dir: Path) -> None:
        self._run_dir = run_dir
        self._loggers: MetricLoggers | None = None
        self._lock = threading.Lock()  # the control thread's start and end, and a user's resume

    def on_attempt_start(self, run: RunView) -> None:
        """Opened for the run's first attempt, and again after a resume (the closed ones are replaced)."""
        with self._lock:
            if self._loggers is None or self._loggers.closed:
                self._loggers = start_loggers(run.spec, self._run_dir, run.feed)

    def on_report_batch(self, run: RunView, rows: list[dict[str, Any]], nan_rows: list[dict[str, Any]]) -> None:
        loggers = self._loggers  # read once: a close meanwhile is MetricLoggers' to account for
        if loggers is not None:
            loggers.write(rows)

    def on_run_end(self, run: RunView, state: RunState) -> None:
        """Closed with the final state, before readers see it: their last rows are written by then."""
        with self._lock:
            if self._loggers is not None:
                self._loggers.close(state.value)
