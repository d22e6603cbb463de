"""The run's controller: an explicit state machine that runs attempts until the run ends.

Every change of the run's state goes through :meth:`RunController.transition`,
which checks the move against :mod:`nbtrain._states`, records the end time,
persists the state and tells readers (an event on the feed). The control
thread loops: start a worker group (``pending`` → ``starting`` → ``running``),
watch it, and ask two policies what next, as Ray Train v2's controller asks its
scaling and failure policies. The sizing policy
(:mod:`nbtrain._cluster.elastic.policy`) gives each attempt's size, may end an
attempt at a checkpoint to resize (each watch tick), may turn ranks lost with
their node into a shrink, and withdraws its autoscaler request at the end; the
:class:`~nbtrain._cluster.run.failure_policy.FailurePolicy` decides between a
restart from the latest checkpoint and the end of the run. The worker group
comes from a factory (:meth:`WorkerGroup.start`), which a unit test replaces
with a fake that returns scripted outcomes.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import ray

from nbtrain._cluster.commands import Command
from nbtrain._cluster.elastic import policy
from nbtrain._cluster.elastic.policy import Cluster, RayCluster, Resize
from nbtrain._cluster.feed.feed import RunFeed, nan_keys
from nbtrain._cluster.run import failure_policy, stall_stacks
from nbtrain._cluster.run.failure_policy import Failed, Failure, FailurePolicy, Outcome, Restart, Stopped, Succeeded
from nbtrain._cluster.run.run_steering import RunSteering
from nbtrain._cluster.run.stragglers import StragglerWatch
from nbtrain._cluster.run.worker_group import StartFailed, StopRequested, WorkerGroup, remove_leftover_group
from nbtrain._cluster.run.worker_table import WorkerTable
from nbtrain._cluster.spec import RunSpec
from nbtrain._cluster.storage import profiles
from nbtrain._cluster.storage.run_storage import RunStorage, drop_checkpoints_after, kept_checkpoint
from nbtrain._exceptions import StorageError
from nbtrain._guards import checked_guard
from nbtrain._packing.runtime_env import pip_problem, setup_failure
from nbtrain._states import RunState, check_transition

# said once, at the end of the first attempt whose ranks sent no metric row: unchanged code may log nowhere nbtrain sees
NO_ROWS_NOTE = ("No metric rows came from this run: its code reports nothing nbtrain sees, so the dashboard has no "
                "curves (the ranks' logs are there). For live curves call nbtrain.report(loss=...) in the training "
                "loop, or write scalars with torch.utils.tensorboard.SummaryWriter(...).add_scalar(tag, value, step): "
                "each rank's become its rows.")
NO_ROWS_AFTER_S = 60.0  # a stopped or failed attempt shorter than this had no time to report: it gets no such note
DEAD_RANK_LINES = 15  # a dead rank's last printed lines in the run's error
FINAL_PUSHES_IDLE_S = 15.0  # give up on a rank's missing pushes after this long without one


def lost_pushes_note(rank: int, pushes: int) -> str:
    """What a rank's pushes that were sent and never arrived mean: an event, so no row goes missing unsaid."""
    return (f"Rank {rank}'s last {pushes} push{'es' if pushes != 1 else ''} of metric rows and log lines were sent "
            f"but never reached the run's supervisor ({FINAL_PUSHES_IDLE_S:g} s after the rank ended): the run's "
            "history lacks what they held. A busy or lost head node does this; its rows before them are all there.")


def no_rows_note_due(outcome: Outcome, ran_s: float, rows: int, said_before: bool) -> bool:
    """Whether :data:`NO_ROWS_NOTE` is true of an attempt that sent ``rows`` rows in ``ran_s`` s of running: its
    code returned without reporting, or it ran ``NO_ROWS_AFTER_S`` before it was stopped or failed (a run stopped
    3 s in, its kernel shut down, had not reached its first ``report()``)."""
    if rows or said_before:
        return False
    return isinstance(outcome, Succeeded) or ran_s >= NO_ROWS_AFTER_S


def unsent_note(rank: int, unsent: dict[str, float]) -> str:
    """What a rank's outcome says its last flush could not send: an event, so no row goes missing unsaid."""
    return (f"Rank {rank}'s last {unsent['rows']:.0f} metric rows and {unsent['logs']:.0f} log chunks never reached "
            f"the run's supervisor: it took none of the rank's pushes within {unsent['wait_s']:g} s as the rank ended "
            "(a busy head node). Report every few steps rather than every step, or give the head node more CPU.")


class AttemptGroup(Protocol):
    """One attempt's ranks, as the controller uses them (:class:`WorkerGroup`)."""

    pushes: dict[int, int]
    unsent: dict[int, dict[str, float]]

    def watch(self, table: WorkerTable, interrupt: Callable[[], Outcome | None]) -> Outcome: ...

    def shutdown(self, table: WorkerTable) -> None: ...


# WorkerGroup.start's signature: spec, attempt, world size, supervisor, datasets, table, commands,
# stop_requested, on_placed, run_dir, say
StartGroup = Callable[[RunSpec, int, int, Any, "dict[str, Any] | None", WorkerTable, "list[Command]",
                       Callable[[], bool], Callable[[], None], Path, Callable[[str], None]], AttemptGroup]


class RunController:
    def __init__(self, spec: RunSpec, datasets: dict[str, Any] | None, feed: RunFeed, storage: RunStorage,
                 table: WorkerTable, supervisor: Any, on_end: Callable[[], None],
                 before_transition: Callable[[RunState], None], *, start_group: StartGroup = WorkerGroup.start,
                 cluster: Cluster | None = None) -> None:
        self.spec = spec
        self._start_group = start_group
        self._cluster: Cluster = cluster or RayCluster()
        self._on_end = on_end  # called by the control thread once the run has ended
        self._before_transition = before_transition
        self.datasets = datasets
        self.feed = feed
        self.table = table
        self._storage = storage
        self._supervisor = supervisor
        self._launch_id = spec.launch_id  # kept through resumes: the files stay this launch's
        self._lock = feed.lock
        self._stop = threading.Event()
        self._nan = threading.Event()
        self._thread: threading.Thread | None = None
        self.state = RunState.PENDING
        self.attempt = 0
        self.failures: list[dict[str, Any]] = []
        self.error: str | None = None
        self.results: list[bytes] | None = None
        self.checkpoint: dict[str, Any] | None = None
        self.resume_from: dict[str, Any] | None = None  # the checkpoint the current attempt started from
        self.steering = RunSteering(lambda kind, message: self.feed.event(kind, message, self.attempt),
                                    self._persist_locked, rewound=self._rewound)
        self.started = time.time()
        self.ended: float | None = None
        self.stop_requested = False
        self.world_size = 0  # the current attempt's ranks (elastic runs: it changes)
        self.sizing = policy.for_run(spec.options, self._cluster, self._say)
        self._stragglers = StragglerWatch(spec.options.straggler_window_s)

    # ------------------------------------------------------------------ the state machine
    def transition(self, new: RunState, why: str = "", *, resume: bool = False) -> None:
        """The one way the run's state changes (``resume``: the user's move out of an ended run).

        ``before_transition`` runs first, outside the lock, so that what must be complete when
        readers see the end (the metric loggers' last rows) is complete.
        """
        if new != self.state:
            self._before_transition(new)
        with self._lock:
            if new == self.state:
                return
            check_transition(self.state, new, resume=resume)
            self.state = new
            self.ended = time.time() if new.is_terminal else None
            self.persist()
        self.feed.event("state", f"{new.value}" + (f": {why}" if why else ""), self.attempt)

    def guard_tripped(self, attempt: int, branch: int, step: int, kind: str, message: str) -> None:
        """A rank's guard saw trouble (see guard_decisions): its action goes to every rank, or the run stops."""
        with self._lock:
            state, running = self.state, self.table.steering_now()
        if state.is_terminal or attempt != self.attempt:
            return
        if self.steering.guards.tripped(attempt, branch, step, kind, message, running, live=state == RunState.RUNNING):
            threading.Thread(target=self.request_stop, args=(30.0,), name="nbtrain-guard-stop", daemon=True).start()

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
            if self.spec.options.guard:
                self.steering.start_with_guard(checked_guard(self.spec.options.guard, "launch(guard=...)"))
            self.persist()
            self.feed.event("state", f"run {self.spec.name} created", self.attempt)
            for note in self.spec.notes:
                self.feed.event("note", note, self.attempt)
            return
        self.feed.replay()
        self.attempt, self.failures, self.error = saved["attempt"], saved["failures"], saved["error"]
        self.checkpoint, self.started, self.ended = saved["checkpoint"], saved["started"], saved["ended"]
        self.stop_requested = saved.get("stop_requested", False)
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
    def start(self, fresh_budget: bool) -> None:
        self._thread = threading.Thread(target=self._control, name="nbtrain-control", daemon=True,
                                        args=(fresh_budget,))
        self._thread.start()

    def request_stop(self, timeout: float) -> RunState:
        with self._lock:
            if not self.state.is_terminal and not self.stop_requested:
                self.stop_requested = True
                self.persist()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)
        return self.state

    def resume(self, spec: RunSpec, datasets: dict[str, Any] | None) -> str:
        """Start an ended run again as a new attempt; ``"resumed"``, or the state that prevents it."""
        with self._lock:
            if not self.state.is_terminal:
                return self.state.value
            if spec.options != self.spec.options:  # else the policy keeps what it knows (nodes drained)
                self.sizing = policy.for_run(spec.options, self._cluster, self._say)
            self.spec, self.datasets = spec, datasets
            self.error, self.stop_requested = None, False
            self._stop.clear()
            self._nan.clear()
            source = "the latest checkpoint" if self.checkpoint else "scratch"
        self.transition(RunState.RESTARTING, f"resumed by the user from {source}", resume=True)
        self.start(fresh_budget=True)
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

    def note_nan_rows(self, rows: list[dict[str, Any]]) -> None:
        row = rows[0]
        with self._lock:
            first = not any(e["kind"] == "nan" and e["attempt"] == self.attempt for e in self.feed.events)
        if first:
            action = "stopping the run (stop_on_nan)" if self.spec.options.stop_on_nan else "training continues"
            self.feed.event("nan", f"Rank {row['rank']} reported NaN for {', '.join(nan_keys(row))} at step "
                                   f"{row['step']}; {action}.", self.attempt)
        if self.spec.options.stop_on_nan:
            self._nan.set()

    # ------------------------------------------------------------------ the control thread
    def _control(self, fresh_budget: bool) -> None:
        # a user's resume starts the failure budget afresh; a supervisor restart does not
        on_failure = FailurePolicy(self.spec.options.max_failures,
                                   0 if fresh_budget else len({f["attempt"] for f in self.failures}))
        try:
            while True:
                with self._lock:
                    self.attempt += 1
                    self.resume_from = self.checkpoint
                    self.persist()
                self.steering.new_attempt(self.attempt)
                outcome = self._run_attempt()
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
                decision = on_failure.decide(outcome)
                if isinstance(decision, Restart):
                    self.transition(RunState.RESTARTING, f"attempt {self.attempt + 1}/"
                                                         f"{self.spec.options.max_failures + 1} after: {decision.why}")
                    if self._stop.wait(decision.delay_s):
                        self.transition(RunState.STOPPED, "stopped by the user")
                        return
                    continue
                with self._lock:
                    self.error = failure_policy.format_error(self.failures, self.world_size,
                                                             self.spec.options.max_failures, self.attempt,
                                                             on_failure.failed_attempts)
                self.transition(RunState.FAILED, decision.why)
                return
        except Exception:  # noqa: BLE001 - a bug here must still end the run visibly
            with self._lock:
                self.error = "nbtrain's run supervisor hit an internal error:\n" + traceback.format_exc()
            if not self.state.is_terminal:
                self.transition(RunState.FAILED, "internal error")
        finally:
            if self.state.is_terminal:  # retiring on its own thread: a stop() waiting for this one is answered first
                self.sizing.end()
                threading.Thread(target=self._on_end, name="nbtrain-retire", daemon=True).start()

    def _last_lines(self, failure: Failure) -> list[str]:
        """A dead rank's last printed lines, for the run's error (its traceback died with it)."""
        if failure.kind != "died" or failure.rank is None:
            return []
        return self.feed.last_log_lines(failure.rank, self.attempt, DEAD_RANK_LINES)

    def _resize(self, resize: Resize) -> None:
        """An elastic run goes on at another size: a new attempt from the latest checkpoint, no failure counted."""
        self.sizing.resize(resize)
        self.feed.event("resize", resize.why, self.attempt)
        self.transition(RunState.RESTARTING, resize.why)

    def _run_attempt(self) -> Outcome:
        """One worker group from placement to the end."""
        self.table.reset(self.attempt)
        if self.state == RunState.RESTARTING:
            self.transition(RunState.PENDING)
        self.world_size = self.sizing.attempt_size(self.attempt)
        if self.attempt == 1 and (problem := pip_problem(self.spec.options.runtime_env)) is not None:
            return Failed([Failure(None, "runtime_env", problem, retriable=False)])
        try:
            group = self._start_group(self.spec, self.attempt, self.world_size, self._supervisor, self.datasets,
                                      self.table, self.steering.all(),
                                      self._stop.is_set, lambda: self.transition(RunState.STARTING),
                                      self._storage.dir, lambda said: self._say("startup", said))
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
            # pushes travel beside the outcome: let the last rows land before readers see the end
            lost = self.feed.wait_for_pushes(self.attempt, group.pushes, FINAL_PUSHES_IDLE_S)
            for rank, pushes in sorted(lost.items()):
                self.feed.event("note", lost_pushes_note(rank, pushes), self.attempt)
            for rank, unsent in sorted(group.unsent.items()):
                if unsent["rows"] or unsent["logs"]:
                    self.feed.event("note", unsent_note(rank, unsent), self.attempt)
            if no_rows_note_due(outcome, time.monotonic() - running_since, self.feed.row_count,
                                any(e["message"] == NO_ROWS_NOTE for e in self.feed.events)):
                self.feed.event("note", NO_ROWS_NOTE, self.attempt)
            return outcome
        finally:
            group.shutdown(self.table)

    def _interrupt(self) -> Outcome | None:
        """Checked every watch tick: the user's stop, a NaN under stop_on_nan, a stalled rank."""
        if self._stop.is_set():
            return Stopped()
        if self._nan.is_set():
            return Failed([Failure(None, "nan", "a reported metric became NaN and stop_on_nan is set",
                                   retriable=False)])
        options = self.spec.options
        stalled = []
        for rank, quiet in self.table.newly_stalled(options.stall_timeout_s):
            message = (f"Rank {rank} made no progress for {quiet:.0f} s (stall_timeout={options.stall_timeout_s:g} s); "
                       f"it may be stuck in a collective or in data loading.")
            self.feed.event("stall", message, self.attempt)
            stalled.append((rank, message))
        if stalled:  # where each rank is: an event next (a stall that ends the attempt waits for it first)
            attempt, ends = self.attempt, options.on_stall in ("fail", "restart")
            stall_stacks.ask(self.steering, self.table.steering_now(),
                             lambda said: self.feed.event("stacks", said, attempt), wait=ends)
            if ends:
                rank, message = stalled[0]
                return Failed([Failure(rank, "stalled", message, retriable=options.on_stall == "restart")])
        running = self.table.running_ranks()
        held = [said.held_after_epoch for rank, said in self.table.steering_now().items() if rank in running]
        if held and None not in held:
            self.feed.event("state", f"every rank finished epoch {held[0]}: stopping, as run.stop(after='epoch') "
                                     "asked (held at the next epoch's start, so run.result stays None: check "
                                     "nbtrain.stop_requested() after each epoch and return to keep a result)",
                            self.attempt)
            return Stopped()
        for rank, quiet in self.table.newly_recovered():
            self.feed.event("stall", f"Rank {rank} made progress again after {quiet:.0f} s without.", self.attempt)
        if options.step_timing:
            for rank, flagged, message in self._stragglers.look(self.table.snapshot(), self.attempt):
                self.table.note(rank, straggler=flagged)
                self.feed.event("straggler", message, self.attempt)
        return self.sizing.tick(self.checkpoint, self.table)
