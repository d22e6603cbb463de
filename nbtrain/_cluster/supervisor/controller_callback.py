"""The controller's callback seam: one no-op method per hook, and what a callback may see of the run.

Hooks, in the order a run meets them:

* :meth:`~ControllerCallback.on_run_start` — the control thread starts (a launch, a resume, a supervisor restart);
* :meth:`~ControllerCallback.on_attempt_start` — an attempt's ranks are about to be started;
* :meth:`~ControllerCallback.on_report_batch` — a rank's push of metric rows landed in the run's history;
* :meth:`~ControllerCallback.on_guard_tripped` — a rank's guard saw trouble (see :mod:`nbtrain._guards`);
* :meth:`~ControllerCallback.on_watch_tick` — every tick of the watch over the attempt's ranks: an
  :data:`~nbtrain._cluster.supervisor.failure_policy.Outcome` to end the attempt with, or None;
* :meth:`~ControllerCallback.on_attempt_end` — the attempt's ranks ended (before they are shut down);
* :meth:`~ControllerCallback.on_run_end` — the run takes its final state, before any reader sees it.

Report batches and guard trips come on the supervisor's threads, the others on the control thread.

Everything the controller watches besides its two policies is a callback, one concern per module, so a reader
who wants "what happens when a metric is NaN" opens :mod:`.nan_stop`:

* :mod:`.nan_stop` — a NaN in a reported metric: said once per attempt, and the end of the run under ``stop_on_nan``;
* :mod:`.stall_watch` — a rank that makes no progress: said, its stacks asked for, the attempt ended per ``on_stall``;
* :mod:`.stragglers` — ranks whose own step time stays above the others' (flagged, said);
* :mod:`.epoch_hold` — ``run.stop(after="epoch")``: the attempt ends once every rank holds after its epoch;
* :mod:`.guard_trips` — a rank's guard tripped: the guard's action for every rank, or the run's stop;
* :mod:`.logger_lifecycle` — the TensorBoard / MLflow writers: open while the run is live, fed every report batch;
* :mod:`.missing_rows` — rows that never reached the supervisor, and a run whose code reports none: said;
* :mod:`.resizes` — an elastic run's sizing policy, asked each tick whether to resize, told when the run ends.

The supervisor's :mod:`.controller_parts` builds the list, the one place that wires them.
"""

from __future__ import annotations

from typing import Any, Protocol

from nbtrain._cluster.elastic.policy import SizingPolicy
from nbtrain._cluster.spec import RunSpec
from nbtrain._cluster.supervisor.attempt import AttemptGroup
from nbtrain._cluster.supervisor.failure_policy import Outcome
from nbtrain._cluster.supervisor.feed import RunFeed
from nbtrain._cluster.supervisor.run_steering import RunSteering
from nbtrain._cluster.supervisor.worker_table import WorkerTable
from nbtrain._states import RunState


class RunView(Protocol):
    """What a callback sees of the run (:class:`~nbtrain._cluster.supervisor.controller.RunController`): named here by
    what the callbacks read, so that they need not import the controller that calls them."""

    @property
    def spec(self) -> RunSpec: ...

    @property
    def feed(self) -> RunFeed: ...

    @property
    def table(self) -> WorkerTable: ...

    @property
    def steering(self) -> RunSteering: ...

    @property
    def sizing(self) -> SizingPolicy: ...

    @property
    def attempt(self) -> int: ...

    @property
    def state(self) -> RunState: ...

    @property
    def checkpoint(self) -> dict[str, Any] | None: ...

    def request_stop(self, timeout: float) -> RunState: ...


class ControllerCallback:
    """A concern the controller watches; each hook does nothing unless a subclass says otherwise."""

    def on_run_start(self, run: RunView) -> None:
        """The control thread starts: a launch, a user's resume, or a restarted supervisor taking up its run."""

    def on_attempt_start(self, run: RunView) -> None:
        """Attempt ``run.attempt`` is about to start its ranks (its size is known)."""

    def on_report_batch(self, run: RunView, rows: list[dict[str, Any]], nan_rows: list[dict[str, Any]]) -> None:
        """A rank's push landed: ``rows`` (new to the history), ``nan_rows`` those of them holding NaN."""

    def on_guard_tripped(self, run: RunView, attempt: int, branch: int, step: int, kind: str, message: str) -> None:
        """A rank of ``attempt`` saw ``kind`` trouble at ``step`` (``branch``: the rewinds it applied this attempt)."""

    def on_watch_tick(self, run: RunView) -> Outcome | None:
        """Each watch tick; an outcome ends the attempt with it (the first callback to answer wins)."""
        return None

    def on_attempt_end(self, run: RunView, outcome: Outcome, group: AttemptGroup, ran_s: float) -> None:
        """The attempt's ranks ended with ``outcome`` after ``ran_s`` s of running; ``group`` is not yet shut down."""

    def on_run_end(self, run: RunView, state: RunState) -> None:
        """The run ends ``state``: called before the state is recorded, so what readers see then is complete."""
