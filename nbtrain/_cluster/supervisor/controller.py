"""The run's controller: an explicit state machine that runs attempts until the run ends.

Every change of the run's state goes through :meth:`RunController.transition`,
which checks the move against :mod:`nbtrain._states`, records the end time,
persists the state and tells readers (an event on the feed). The control
thread loops: start a worker group (``pending`` → ``starting`` → ``running``),
watch it, and ask two policies what next, as Ray Train v2's controller asks its
scaling and failure policies. Both are handed to it (the supervisor builds them):
the sizing policy (:mod:`nbtrain._cluster.elastic.policy`) gives each attempt's
size and may turn ranks lost with their node into a shrink; the
:class:`~nbtrain._cluster.supervisor.failure_policy.FailurePolicy` decides between a
restart from the latest checkpoint and the end of the run. Whatever else it
watches (NaN, stalls, stragglers, the epoch hold, guards, loggers, missing rows,
resizes) is a callback told at each hook (:mod:`.controller_callback`): nothing
it watches is a branch of its loop. The worker group comes from a factory
(:meth:`WorkerGroup.start`, given an :class:`~nbtrain._cluster.supervisor.attempt.AttemptStart`),
which a unit test replaces with a fake that returns scripted outcomes.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import ray

from nbtrain._cluster.command_kinds.stop import wait_for_ranks_s
from nbtrain._cluster.commands import STOP, SteeringBeat
from nbtrain._cluster.elastic.policy import Resize, SizingPolicy
from nbtrain._cluster.launch_phases import LaunchPhases
from nbtrain._cluster.spec import RunSpec
from nbtrain._cluster.storage import profiles
from nbtrain._cluster.storage.run_storage import RunStorage, drop_checkpoints_after, kept_checkpoint
from nbtrain._cluster.supervisor.attempt import AttemptGroup, AttemptStart, NotPlaced, StartGroup
from nbtrain._cluster.supervisor.controller_callback import ControllerCallback
from nbtrain._cluster.supervisor.failure_policy import (
    Failed,
    Failure,
    FailurePolicy,
    Outcome,
    Restart,
    Stopped,
    Succeeded,
    format_error,
)
from nbtrain._cluster.supervisor.feed import RunFeed
from nbtrain._cluster.supervisor.run_steering import RunSteering
from nbtrain._cluster.supervisor.worker_group import StartFailed, StopRequested, WorkerGroup, remove_leftover_group
from nbtrain._cluster.supervisor.worker_table import WorkerTable
from nbtrain._exceptions import StorageError
from nbtrain._guards import checked_guard
from nbtrain._packing.runtime_env import pip_problem, setup_failure
from nbtrain._states import RunState, check_transition

DEAD_RANK_LINES = 15  # a dead rank's last printed lines in the run's error


class RunController:
    """One run's attempts, from its parts: the two policies that decide, the callbacks that watch, and the
    factory of each attempt's worker group. ``failure_policy`` counts the failed attempts against the run's
    ``max_failures``; ``sizing`` sizes each attempt; ``callbacks`` are told at each hook, in their order."""

    def __init__(self, spec: RunSpec, datasets: dict[str, Any] | None, feed: RunFeed, storage: RunStorage,
                 table: WorkerTable, supervisor: Any, on_end: Callable[[], None], *, failure_policy: FailurePolicy,
                 sizing: SizingPolicy, callbacks: Sequence[ControllerCallback] = (),
                 start_group: StartGroup = WorkerGroup.start) -> None:
        self.spec = spec
        self._start_group = start_group
        self._on_end = on_end  # called by the control thread once the run has ended
        self.failure_policy = failure_policy
        self.sizing = sizing
        self.callbacks = tuple(callbacks)
        self.datasets = datasets
        self.feed = feed
        self.table = table
        self._storage = storage
        self._supervisor = supervisor
        self._launch_id = spec.launch_id  # kept through resumes: the files stay this launch's
        self._lock = feed.lock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.state = RunState.PENDING
        self.attempt = 0
        self.failures: list[dict[str, Any]] = []
        self.error: str | None = None
        self.results: list[bytes] | None = None
        self.checkpoint: dict[str, Any] | None = None
        self.resume_from: dict[str, Any] | None = None  # the checkpoint the current attempt started from
        self.steering = RunSteering(lambda kind, message, **fields: self.feed.event(kind, message, self.attempt,
                                                                                 **fields),
                                    self._persist_locked, rewound=self._rewound)
        self.started = time.time()
        self.ended: float | None = None
        self.stop_requested = False
        self._ranks_end_by: float | None = None  # a stop waits until then for the ranks to end at its step
        self.world_size = 0  # the current attempt's ranks (elastic runs: it changes)
        self.phases = LaunchPhases(spec.launch_called, time.time())  # where the first attempt's start went

    # ------------------------------------------------------------------ the state machine
    def transition(self, new: RunState, why: str = "", *, resume: bool = False) -> None:
        """The one way the run's state changes (``resume``: the user's move out of an ended run).

        The callbacks' ``on_run_end`` runs first when ``new`` ends the run, outside the lock, so that what must
        be complete when readers see the end (the metric loggers' last rows) is complete.
        """
        if new != self.state and new.is_terminal:
            for callback in self.callbacks:
                callback.on_run_end(self, new)
        with self._lock:
            if new == self.state:
                return
            check_transition(self.state, new, resume=resume)
            self.state = new
            self.ended = time.time() if new.is_terminal else None
            self.persist()
        self.feed.event("state", f"{new.value}" + (f": {why}" if why else ""), self.attempt, state=new.value)

    def guard_tripped(self, attempt: int, branch: int, step: int, kind: str, message: str) -> None:
        """A rank's guard saw trouble (see guard_decisions): the callbacks decide (:mod:`.guard_trips`)."""
        for callback in self.callbacks:
            callback.on_guard_tripped(self, attempt, branch, step, kind, message)

    def report_batch(self, rows: list[dict[str, Any]], nan_rows: list[dict[str, Any]]) -> None:
        """A rank's push landed in the history (``nan_rows``: its rows holding NaN): the callbacks are told."""
        for callback in self.callbacks:
            callback.on_report_batch(self, rows, nan_rows)

    def _rewound(self, step: int) -> None:
        """The ranks went back to their restore point at ``step``: so does the run's checkpoint (a restart resumes
        there), and the checkpoints of the branch left are deleted."""
        with self._lock:
            latest = self.checkpoint
            if latest is None or latest["step"] <= step or latest.get("format") == "dcp":
                return
            self.checkpoint = kept_checkpoint(latest, step)
            self.persist()
        try:
            drop_checkpoints_after(latest, self.attempt, step)
        except (OSError, StorageError) as exc:  # recorded as the run's: only files of the branch left stay
            self.feed.event("storage", f"the checkpoints past step {step} could not be deleted: {exc}", self.attempt)

    def _say(self, kind: str, message: str) -> None:
        self.feed.event(kind, message, self.attempt)

    def _persist_locked(self) -> None:
        """persist() from a thread that holds no lock (steering's): one writer of the state file at a time."""
        with self._lock:
            self.persist()

    def persist(self) -> None:
        self._storage.save_state({
            "launch": self._launch_id, "state": self.state.value, "attempt": self.attempt, "failures": self.failures,
            "error": self.error, "checkpoint": self.checkpoint, "started": self.started,
            "ended": self.ended, "stop_requested": self.stop_requested, "commands": self.steering.saved(),
        })

    def recover(self) -> None:
        """Take up a run this supervisor's previous process recorded, or record a new one."""
        saved = self._storage.load_state()
        if not saved:
            if self.spec.settings_at_start:
                self.steering.start_with(self.spec.settings_at_start)
            for source in self.spec.patches_at_start:
                self.steering.start_with_patch(source)
            if self.spec.options.guard:
                self.steering.start_with_guard(checked_guard(self.spec.options.guard, "launch(guard=...)"))
            self.persist()
            self.feed.event("state", f"run {self.spec.name} created", self.attempt, state=self.state.value)
            for note in self.spec.notes:
                self.feed.event("note", note, self.attempt)
            return
        self.feed.replay()
        self.attempt, self.failures, self.error = saved["attempt"], saved["failures"], saved["error"]
        self.checkpoint, self.started, self.ended = saved["checkpoint"], saved["started"], saved["ended"]
        self.stop_requested = saved.get("stop_requested", False)
        # a supervisor restart takes up the run's failure budget where it was; a user's resume starts it afresh
        self.failure_policy.failed_attempts = len({f["attempt"] for f in self.failures})
        self.steering = RunSteering(self.steering.record, self._persist_locked, saved.get("commands"),
                                    rewound=self._rewound)
        self.state = RunState(saved["state"])  # as recorded: this is where the machine stood
        if self.state.is_terminal:
            return
        remove_leftover_group(self.spec, self.attempt)
        if self.stop_requested:  # the user's stop wins over Ray bringing the supervisor back mid-stop
            self.transition(RunState.STOPPED, "stopped by the user (the supervisor restarted while stopping)")
            return
        self.feed.event("restart", "the run's supervisor process was restarted; its workers died with it. "
                                   "Restarting them from the latest checkpoint (history kept).", self.attempt)
        self.transition(RunState.RESTARTING, "the supervisor restarted")

    # ------------------------------------------------------------------ requests
    def start(self) -> None:
        """Run attempts on the control thread until the run ends."""
        self._thread = threading.Thread(target=self._control, name="nbtrain-control", daemon=True)
        self._thread.start()

    def request_stop(self, timeout: float) -> RunState:
        running = {}
        with self._lock:
            if not self.state.is_terminal and not self.stop_requested:
                self.stop_requested = True
                self.persist()
                running = self.table.steering_now() if self.state == RunState.RUNNING else {}
        if running:
            self._ranks_end_at_one_step(running)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)
        return self.state

    def _ranks_end_at_one_step(self, running: dict[int, SteeringBeat]) -> None:
        """Have every rank end its function at one step (:mod:`~nbtrain._cluster.command_kinds.stop`), so their
        processes go back to the warm pool, where they can reach it soon; the watch waits that long for them."""
        try:
            command = self.steering.issue(STOP, {}, running, live=True, attempt=self.attempt)
        except ValueError:
            return
        wait_s = wait_for_ranks_s(running, command.at_step)
        if wait_s is not None:
            self._ranks_end_by = time.monotonic() + wait_s

    def resume(self, spec: RunSpec, datasets: dict[str, Any] | None, failure_policy: FailurePolicy,
               sizing: SizingPolicy | None = None) -> str:
        """Start an ended run again as a new attempt; ``"resumed"``, or the state that prevents it.

        ``failure_policy``: a fresh one (a user's resume starts the failure budget afresh, for ``spec``'s
        ``max_failures``); ``sizing``: a new sizing policy when the options changed, else None and the run's
        keeps what it knows (nodes drained).
        """
        with self._lock:
            if not self.state.is_terminal:
                return self.state.value
            self.failure_policy = failure_policy
            if sizing is not None:
                self.sizing = sizing
            self.spec, self.datasets = spec, datasets
            self.error, self.stop_requested, self._ranks_end_by = None, False, None
            self._stop.clear()
            source = "the latest checkpoint" if self.checkpoint else "scratch"
        self.transition(RunState.RESTARTING, f"resumed by the user from {source}", resume=True)
        self.start()
        return "resumed"

    def drain(self, node_id: str, deadline_s: float) -> str:
        """``run.drain(node)``: the sizing policy moves the ranks off the node, or refuses (a fixed size)."""
        return self.sizing.drain(node_id, deadline_s, self.table)

    def checkpoint_wanted(self, attempt: int) -> bool:
        """Whether the ranks of ``attempt`` should checkpoint now (an elastic run about to resize)."""
        return self.sizing.checkpoint_wanted(attempt)

    def command_result(self, command_id: int, rank: int, ok: bool, value: Any) -> None:
        """A rank's answer to a command; a profile's trace (gzipped bytes) is kept in the run's directory, and its
        path is the answer's (the notebook may be far from the ranks: it reads the table, and the path)."""
        if ok and isinstance(value, dict) and isinstance(value.get("trace"), bytes):
            value = {**value, "trace": profiles.write(self._storage.dir, command_id, rank, value["trace"])}
        self.steering.result(command_id, rank, ok, value)

    # ------------------------------------------------------------------ the control thread
    def _control(self) -> None:
        for callback in self.callbacks:
            callback.on_run_start(self)
        try:
            while True:
                with self._lock:
                    self.attempt += 1
                    self.resume_from = self.checkpoint
                    self.persist()
                self.steering.new_attempt(self.attempt)
                outcome = self._run_attempt()
                if isinstance(outcome, Succeeded) and self._stop.is_set():  # every rank ended at the stop's step
                    self.transition(RunState.STOPPED, "stopped by the user")
                    return
                if isinstance(outcome, Succeeded):
                    self.results = outcome.results
                    if (epoch := self.steering.stop_after_epoch()) is not None:  # the function returned as asked
                        self.transition(RunState.STOPPED, f"after epoch {epoch}, as run.stop(after='epoch') asked; "
                                                          "the training function returned its result")
                    else:
                        self.transition(RunState.SUCCEEDED)
                    return
                if isinstance(outcome, Stopped):
                    self.transition(RunState.STOPPED, "stopped by the user")
                    return
                if isinstance(outcome, Resize):
                    self._resize(outcome)
                    continue
                with self._lock:
                    self.failures.extend(f.as_dict(self.attempt, self._last_lines(f)) for f in outcome.failures)
                shrink = self.sizing.after_failure(outcome.died_on)
                if shrink is not None:
                    self._resize(shrink)
                    continue
                decision = self.failure_policy.decide(outcome)
                if isinstance(decision, Restart):
                    self.transition(RunState.RESTARTING, f"attempt {self.attempt + 1}/"
                                                         f"{self.spec.options.max_failures + 1} after: {decision.why}")
                    if self._stop.wait(decision.delay_s):
                        self.transition(RunState.STOPPED, "stopped by the user")
                        return
                    continue
                with self._lock:
                    self.error = format_error(self.failures, self.world_size, self.spec.options.max_failures,
                                              self.attempt, self.failure_policy.failed_attempts)
                self.transition(RunState.FAILED, decision.why)
                return
        except Exception:  # noqa: BLE001 - a bug here must still end the run visibly
            with self._lock:
                self.error = "nbtrain's run supervisor hit an internal error:\n" + traceback.format_exc()
            if not self.state.is_terminal:
                self.transition(RunState.FAILED, "internal error")
        finally:
            if self.state.is_terminal:  # retiring on its own thread: a stop() waiting for this one is answered first
                threading.Thread(target=self._on_end, name="nbtrain-retire", daemon=True).start()

    def _last_lines(self, failure: Failure) -> list[str]:
        """A dead rank's last printed lines, for the run's error (its traceback died with it)."""
        if failure.kind != "died" or failure.rank is None:
            return []
        return self.feed.last_log_lines(failure.rank, self.attempt, DEAD_RANK_LINES)

    def _resize(self, resize: Resize) -> None:
        """An elastic run goes on at another size: a new attempt from the latest checkpoint, no failure counted."""
        self.sizing.resize(resize)
        self.feed.event("resize", resize.why, self.attempt, from_size=self.world_size, to_size=resize.size)
        self.transition(RunState.RESTARTING, resize.why)

    def _run_attempt(self) -> Outcome:
        """One worker group from placement to the end."""
        self.table.reset(self.attempt)
        if self.state == RunState.RESTARTING:
            self.transition(RunState.PENDING)
        self.world_size = self.sizing.attempt_size(self.attempt)
        if self.attempt == 1 and (problem := pip_problem(self.spec.options.runtime_env)) is not None:
            return Failed([Failure(None, "runtime_env", problem, retriable=False)])
        for callback in self.callbacks:
            callback.on_attempt_start(self)
        try:
            group = self._start_placed_group()
        except StopRequested:
            return Stopped()
        except StartFailed as failed:
            return Failed([failed.failure])
        except ray.exceptions.RuntimeEnvSetupError as exc:  # the user's runtime_env: said as theirs, not ours
            return Failed([Failure(None, "runtime_env", setup_failure(str(exc), "Ray could not build the ranks' "
                                                                     "environment"), retriable=False)])
        try:
            self.transition(RunState.RUNNING)
            running_since = time.monotonic()
            outcome = group.watch(self.table, self._interrupt)
            ran_s = time.monotonic() - running_since
            for callback in self.callbacks:
                callback.on_attempt_end(self, outcome, group, ran_s)
            return outcome
        finally:
            group.shutdown(self.table)

    def _start_placed_group(self) -> AttemptGroup:
        """The attempt's ranks, started; an elastic attempt whose size could not be placed starts again at the
        size its policy falls back to (same attempt, no failure counted), said as a resize."""
        while True:
            try:
                return self._start_group(AttemptStart(
                    spec=self.spec, attempt=self.attempt, world_size=self.world_size, supervisor=self._supervisor,
                    datasets=self.datasets, table=self.table, commands=self.steering.all(),
                    stop_requested=self._stop.is_set, on_placed=lambda: self.transition(RunState.STARTING),
                    run_dir=self._storage.dir, say=lambda said: self._say("startup", said),
                    on_assigned=lambda warm: self.phases.ranks_assigned(self.attempt, self.world_size, warm,
                                                                        time.time())))
            except NotPlaced as unplaced:
                smaller = self.sizing.not_placed(unplaced.size, unplaced.waited_s)
                if smaller is None:  # a policy that keeps its size: as a placement that timed out
                    raise StartFailed(Failure(None, "resources", f"{unplaced}: the cluster has no room for them now",
                                              retriable=False)) from unplaced
                self.feed.event("resize", smaller.why, self.attempt, from_size=self.world_size, to_size=smaller.size)
                self.sizing.resize(smaller)
                self.world_size = self.sizing.attempt_size(self.attempt)

    def _interrupt(self) -> Outcome | None:
        """Checked every watch tick: the user's stop (once the ranks had their time to end at its step), then each
        callback's (the first outcome ends the attempt)."""
        if self._stop.is_set():
            ending = self._ranks_end_by is not None and time.monotonic() < self._ranks_end_by
            return None if ending else Stopped()
        for callback in self.callbacks:
            outcome = callback.on_watch_tick(self)
            if outcome is not None:
                return outcome
        return None
