"""The per-worker training session: what ``report()`` and friends talk to.

``report()`` is on the training step's hot path, so it only turns tensors into
numbers and appends a tuple to a deque. A background thread drains
that deque every ``flush_interval_s`` and sends one push to the supervisor: an actor
call, or in wide runs a message to its node's push relay's socket (see
:mod:`~nbtrain._cluster.relay.push_relay`), carrying the rows, a heartbeat and any new
log text. Nothing on the
step path waits for the supervisor, let alone the notebook.
"""

from __future__ import annotations

import collections
import dataclasses
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from nbtrain._cluster.commands import Heartbeat
from nbtrain._cluster.elastic.gradient_noise import NoiseScale
from nbtrain._cluster.launch_phases import FIRST_STEP
from nbtrain._cluster.rank import reporting, rewinding, their_code
from nbtrain._cluster.rank.inspection.resources import Resources
from nbtrain._cluster.rank.inspection.step_timing import StepTimes
from nbtrain._cluster.rank.log_tee import LogTee
from nbtrain._cluster.rank.payload import WorkerPayload
from nbtrain._cluster.rank.rank_steering import RankSteering
from nbtrain._cluster.rank.reporting import NOT_IN_A_RUN, Reporter
from nbtrain._cluster.relay.relay_link import Pending, RayPush, RelayLink, open_link
from nbtrain._exceptions import NbtrainError

PUSH_ORDER_WAIT_S = 30.0
FIRST_ROW_SETTLE_S = 0.002  # from report()'s hook, which wakes the flusher, to its row in the deque
FINAL_PUSH_WAIT_S = 10.0
FINAL_PUSH_TRIES = 3
# One push carries at most this much: the supervisor ingests a push under its lock, so a rank
# reporting faster than a tick can carry must not make its pushes (and polls' waits) grow.
MAX_PUSH_ROWS = 20_000
MAX_PUSH_LOGS = 20_000
MAX_WAITING_ROWS = 200_000  # rows a rank keeps for the supervisor while it does not answer (~100 MB)
MAX_WAITING_LOGS = 20_000   # log chunks likewise
# Every row's own keys besides ``step`` (which report(step=) sets): a metric of one of these
# names is kept as ``user_<name>``, so it can neither overwrite them nor be lost.
ROW_KEYS = ("rank", "attempt", "time")


def until_next_tick(interval_s: float) -> float:
    """Seconds to the next multiple of ``interval_s`` on the wall clock.

    Every rank of a run flushes its rows, logs and heartbeat on the same ticks, so the
    supervisor hears from all of them within a few milliseconds and one dashboard long
    poll carries every rank's rows: fewer wake-ups on cores the ranks need, and no rank's
    rows waiting a whole redraw behind another's.
    """
    left = interval_s - (time.time() % interval_s)
    # A wait that ended a hair before its tick (timeouts run on the monotonic clock, ticks on
    # the wall clock) has already served that tick: go on to the next, never flush twice.
    return left + interval_s if left < interval_s / 4 else left


@dataclasses.dataclass
class TrainContext:
    """What a rank knows about itself; returned by :func:`nbtrain.get_context`."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    device: Any
    attempt: int
    config: dict[str, Any]
    run_name: str

    @property
    def step(self) -> int:
        """The step being taken: a prepared loader's batches (a rewind moves it back), else the reports'."""
        session = _current
        return session.current_step() if session is not None and session.context is self else 0


class TrainingSession:
    """State of one rank during one attempt; created by the worker actor."""

    def __init__(self, payload: WorkerPayload, device: Any) -> None:
        self.payload = payload  # what the supervisor sent this rank: the run's options are read from it
        place = payload.place
        self.context = TrainContext(
            rank=place.rank, world_size=place.world_size, local_rank=place.local_rank,
            local_world_size=place.local_world_size, node_rank=place.node_rank, device=device,
            attempt=payload.attempt, config=dict(payload.code.config), run_name=payload.run_name)
        self.timing = StepTimes() if payload.training.step_timing else None  # data wait / compute / communication
        # the gradient noise scale, fed by prepare_model's DDP hook; None when not asked for
        self.noise = NoiseScale() if payload.training.gns else None
        self.batch_size = 0                   # the size of the last batch a prepared loader gave
        self.lr_gain = 1.0                    # AdaScale's gain applied to the prepared optimizers
        self.optimizers: list[Any] = []       # those prepare_optimizer gave back (their lr follows lr_gain)
        self.checkpoint_requested = False  # an elastic run's resize wants one (see steering's poll)
        self.grad_scaler: Any = None  # a torch GradScaler once a 16-mixed model was prepared
        # this node's push relay (see push_relay); None once it failed: to the supervisor
        self.relay = payload.report_to.relay
        self.reporter = Reporter()  # report()'s rows and the counts that number them (see reporting)
        self.resumed_step: int | None = None  # the step of the checkpoint this attempt loaded, once it did
        self.logs: collections.deque[tuple[str, float, str]] = collections.deque()
        self.epoch = 0
        self.samples = 0
        self.last_progress = time.time()
        self.seq = 0
        self._resources = Resources()
        self._rate_mark = (time.time(), 0)
        self._updates_seen = 0
        self._usage = self._resources.sample(device)  # read again with the rate, once a second
        self._stop = threading.Event()
        self._wake = threading.Event()  # the flusher's: set by close() and by the attempt's first row
        self._first_row_told = False    # the flusher was woken for this attempt's first row
        self._flushing = threading.Lock()  # the flusher's ticks and land_reported() take turns
        self._thread = threading.Thread(target=self._flush_loop, name="nbtrain-flush", daemon=True)
        self._saved_stdio: tuple[Any, Any] | None = None
        self._undo_patches: Callable[[], None] | None = None  # what their_code put in place for the user's code
        self._in_flight: Pending | None = None  # the last push until it is known to have landed or failed
        self._link: RelayLink | None = None  # the socket to this node's relay, once opened (see relay_link)
        self._link_tried = False
        # the last push's (seq, rows, logs) until it landed: sent again, same seq, if it failed
        self._unsent: tuple[int, list[dict[str, Any]], list[tuple[str, float, str]]] | None = None
        self._waiting_rows: list[dict[str, Any]] = []
        self._waiting_logs: list[tuple[str, float, str]] = []
        self._renamed: set[str] = set()
        self.phases: dict[str, float] = {}  # the launch's phases this rank ended, and when (see launch_phases)
        self.commands_due(False)
        self.steering = RankSteering(self, payload.commands)  # the notebook's commands to this live run
        self.commands_due(bool(self.steering.pending))  # a guard in force from an earlier attempt watches reports

    @property  # the options that other modules read from the session, as the payload has them
    def supervisor(self) -> Any:
        return self.payload.report_to.supervisor

    @property
    def datasets(self) -> dict[str, Any]:
        return self.payload.code.datasets

    @property
    def adaptive_batch(self) -> tuple[int, int] | None:
        return self.payload.training.adaptive_batch  # per-rank batch bounds for prepare_loader (see adaptive_batch)

    @property
    def batch_scale(self) -> float:
        return self.payload.training.batch_scale  # prepare_loader's factor (elastic runs)

    # -- lifecycle -------------------------------------------------------
    def start(self) -> None:
        self._saved_stdio = (sys.stdout, sys.stderr)
        sys.stdout = LogTee(self.logs, "stdout", sys.stdout)
        sys.stderr = LogTee(self.logs, "stderr", sys.stderr)
        self._thread.start()
        self.steering.start()
        self.steering.hook()  # every optimizer the code steps is steered (torch's global step hooks)
        self._undo_patches = their_code.install(self, lambda: active_session() is self)

    def _undo_their_code(self) -> None:
        """The user's code is over: torch and its libraries as they were (a warm worker runs other runs)."""
        undo, self._undo_patches = self._undo_patches, None
        self.steering.unhook()
        rewinding.forget_hooks()
        if undo is not None:
            undo()  # the SummaryWriter rows still being filled are reported here, before the last push

    def close(self, state: str) -> None:
        self._undo_their_code()
        self._stop.set()
        self._wake.set()
        self.steering.stop()
        self._thread.join(timeout=PUSH_ORDER_WAIT_S + 5)
        if self._saved_stdio is not None:
            sys.stdout, sys.stderr = self._saved_stdio
        took_turn = self._flushing.acquire(timeout=FINAL_PUSH_WAIT_S)
        try:
            if not took_turn:  # the flusher is stuck on a push: its link is its own, the last push goes by Ray
                self._drop_relay()
            self.flush(state=state, wait=True)
        finally:
            if took_turn:
                self._flushing.release()
            self._drop_relay()  # a warm worker lives on: its socket must not

    # -- what report() counts (kept by the reporter, read here by steering, loaders and checkpoints) --
    @property
    def step(self) -> int:
        return self.reporter.step

    @step.setter
    def step(self, value: int) -> None:
        self.reporter.step = value

    @property
    def uses_loader(self) -> bool:
        return self.reporter.uses_loader

    @uses_loader.setter
    def uses_loader(self, value: bool) -> None:
        self.reporter.uses_loader = value

    @property
    def report_calls(self) -> int:
        return self.reporter.calls

    @property
    def last_step(self) -> int:
        return self.reporter.last_step

    def resume_at(self, step: int) -> None:
        """A checkpoint loaded: steps, reports and loaders count on from its step."""
        self.resumed_step = step
        reporter = self.reporter
        reporter.step = reporter.calls = reporter.last_step = step

    def report(self, metrics: dict[str, Any]) -> None:
        self.reporter.report(metrics)

    def write_row(self, step: int | None, metrics: dict[str, Any]) -> None:
        """A row the code wrote elsewhere (a SummaryWriter's scalars, see their_code), its values numbers already.

        Unlike :meth:`report` it leaves the steps that steering counts alone: a script may write on rank 0
        only, and every rank must apply a change at the same optimizer update. ``step`` None: the rank's step.
        """
        self.reporter.rows.append((self.current_step() if step is None else step, time.time(), metrics))

    def _before_report(self, metrics: dict[str, Any]) -> None:
        if not self._first_row_told:
            self._first_row_told = True
            self._wake.set()
            self.commands_due(bool(self.steering.pending))
        if self.steering.pending:
            self.steering.at_report()
        if self.steering.guard is not None:
            step = metrics.get("step")
            self.steering.guard.saw_report(metrics, step if isinstance(step, int) else
                                           self.step if self.uses_loader else self.report_calls + 1)
        if self.noise is not None:
            noise_scale = self.noise.value
            if noise_scale is not None:
                metrics.setdefault("gns", noise_scale)
            if self.payload.training.adaptive_batch is not None and self.batch_size:
                metrics.setdefault("batch_size", self.batch_size)

    def commands_due(self, due: bool) -> None:
        """Steering has commands pending (or no more): report() looks at them only then."""
        steering = getattr(self, "steering", None)  # None while the steering is being made
        guarded = steering is not None and steering.guard is not None
        first = not self._first_row_told  # the flusher sends the first row at once
        self.reporter.hook = self._before_report if due or guarded or first or self.noise is not None else None

    def on_batch(self, batch_size: int) -> None:
        self.step += 1
        self.batch_size = batch_size
        self.samples += batch_size
        self.last_progress = time.time()

    def current_step(self) -> int:
        """The step the rank is at: while paused, the step it holds in (what the run's ``paused_at`` says, so the
        worker table and the header agree); else its loader's batches, else its last reported step, else its
        optimizer updates."""
        if (paused_at := self.steering.paused_at) is not None:
            return int(paused_at)
        if self.uses_loader:
            return int(self.step)
        return int(self.last_step) if self.report_calls else self.steering.updates

    # -- background ------------------------------------------------------
    def _flush_loop(self) -> None:
        """Flush on every tick; and the attempt's first row as it is reported, not up to a tick later (on average
        half a tick, 50 ms, of a warm re-run's half second to its first point)."""
        while True:
            woken = self._wake.wait(until_next_tick(self.payload.report_to.flush_interval_s))
            self._wake.clear()
            if self._stop.is_set():
                return
            if woken:  # report()'s hook woke this thread just before the row went in: let it go in
                self._stop.wait(FIRST_ROW_SETTLE_S)
            with self._flushing:
                try:
                    self.flush(state="running")
                    # more than one push's worth reported: send the rest as each push lands, not a tick later
                    while self._waiting_rows and not self._stop.is_set():
                        if not self._settled(PUSH_ORDER_WAIT_S) or self._unsent is not None:
                            break  # slow or failed: the next tick carries on
                        self.flush(state="running")
                except Exception:  # noqa: BLE001 - the supervisor may be restarting; retry next tick
                    pass

    def land_reported(self) -> None:
        """Send what this rank reported so far and wait until the supervisor has it (or the push in flight
        has not landed within :data:`FINAL_PUSH_WAIT_S`). Called before a checkpoint is recorded: the
        supervisor may end the attempt as soon as it has the checkpoint (an elastic resize), and a
        run resumed from it must not miss the rows reported before it."""
        with self._flushing:
            if not self._settled(FINAL_PUSH_WAIT_S):
                return  # the supervisor is slow: the flusher carries on, in order
            self._collect()
            if self._unsent is not None or self._waiting_rows or self._waiting_logs:
                self._send("running")
                self._send_the_rest("running")

    def _heartbeat(self, state: str) -> Heartbeat:
        now = time.time()
        if self.steering.updates != self._updates_seen:  # an optimizer update is progress (code that reports nothing)
            self._updates_seen = self.steering.updates
            self.last_progress = max(self.last_progress, now)
        mark_time, mark_samples = self._rate_mark
        samples_per_s, measured = None, dict(self._usage)
        if now - mark_time >= 1.0:  # /proc reads and averages: not on every tick's push
            samples_per_s = (self.samples - mark_samples) / (now - mark_time)
            self._rate_mark = (now, self.samples)
            self._usage = self._resources.sample(self.context.device)
            measured = {**(self.timing.window() if self.timing is not None else {}), **self._usage}
        return Heartbeat(time=now, step=self.current_step(), last_progress=self.last_progress,
                         state="paused" if self.steering.paused_at is not None else state,
                         steering=self.steering.beat(), samples_per_s=samples_per_s, measured=measured,
                         phases=dict(self.phases))

    def flush(self, state: str, wait: bool = False) -> None:
        """Send what was reported since the last push (and a heartbeat) to the supervisor.

        One push is in flight per rank: the supervisor runs pushes on several threads, so a
        push sent before the last one landed could be applied first and put this rank's rows
        out of order (and it keeps only a rank's last ``seq`` to spot resends). Waiting here
        (the flusher's thread, never the training step) also keeps the rows on the rank when
        the supervisor is slow, rather than its queue longer; a push carries at most
        :data:`MAX_PUSH_ROWS` rows, the rest follow as each push lands. A push that failed (the
        supervisor restarting, an error) is sent again, same ``seq``, on the next tick: the
        supervisor drops it if its first send landed after all. Memory stays bounded while
        the supervisor is away (its last push failed): the rows waiting beyond
        :data:`MAX_WAITING_ROWS` (log chunks beyond :data:`MAX_WAITING_LOGS`) are dropped oldest
        first, and the rank's log says how many; so a rank holds at most twice that (the failed
        push and the rows after it). A supervisor that answers gets every row, however many.
        ``wait``: the last push, sent even if the one before it has not answered, and waited for.
        """
        settled = self._settled(PUSH_ORDER_WAIT_S)
        self._collect()
        if not settled and not wait:
            return  # still on its way: the rows go with a later tick, in order
        self._send(state)
        if wait:
            self._send_the_rest(state)

    def _send_the_rest(self, state: str) -> None:
        """The last flush: every push still to go (rows beyond a full push, a failed push) sent and waited for.

        A supervisor that takes each push gets them all, however many are left (a rank that
        reported a burst at its end may have hundreds of thousands of rows to go): each push
        has :data:`FINAL_PUSH_WAIT_S` to land. A failed push is sent again, up to
        :data:`FINAL_PUSH_TRIES` times (straight to the supervisor when it failed on the way
        through a relay), all within :data:`FINAL_PUSH_WAIT_S` of the last push that landed.
        """
        deadline = time.monotonic() + FINAL_PUSH_WAIT_S
        failures = 0
        while self._settled(max(deadline - time.monotonic(), 0.0)):
            if self._unsent is not None:
                failures += 1
                if failures >= FINAL_PUSH_TRIES or time.monotonic() > deadline:
                    return
            elif not (self._waiting_rows or self._waiting_logs):
                return
            else:
                deadline = time.monotonic() + FINAL_PUSH_WAIT_S  # the last push landed: the next has as long
            self._send(state)

    def unsent(self) -> dict[str, float]:
        """What this rank's last flush could not send (the supervisor took no push within
        :data:`FINAL_PUSH_WAIT_S`, or refused it): told to the supervisor with the rank's outcome,
        which travels by Ray, so the loss is said rather than silent."""
        rows, logs = len(self._waiting_rows), len(self._waiting_logs)
        if self._unsent is not None and self._in_flight is None:  # a push that failed, not one still on its way
            rows, logs = rows + len(self._unsent[1]), logs + len(self._unsent[2])
        return {"rows": rows, "logs": logs, "wait_s": FINAL_PUSH_WAIT_S}

    def _collect(self) -> None:
        """Move what was reported into the rows waiting to be sent (as rows), within the bounds."""
        reported = self.reporter.rows
        rows = [reported.popleft() for _ in range(len(reported))]
        logs = [self.logs.popleft() for _ in range(len(self.logs))]
        ctx = self.context
        for step, when, metrics in rows:
            row: dict[str, Any] = {"rank": ctx.rank, "step": step, "attempt": ctx.attempt, "time": when}
            for key, value in metrics.items():
                if key in ROW_KEYS:
                    key = self._renamed_key(key, logs)
                row[key] = value
            self._waiting_rows.append(row)
        if rows and FIRST_STEP not in self.phases:  # read here, off report()'s path
            self.phases[FIRST_STEP] = rows[0][1]
        if rows:  # a report is progress: report() leaves saying so to here
            self.last_progress = max(self.last_progress, rows[-1][1])
        self._waiting_logs.extend(logs)
        if self._unsent is None:  # the supervisor took the last push: it takes everything
            return
        dropped_rows = max(len(self._waiting_rows) - MAX_WAITING_ROWS, 0)
        dropped_logs = max(len(self._waiting_logs) - MAX_WAITING_LOGS, 0)
        if dropped_rows or dropped_logs:
            del self._waiting_rows[:dropped_rows]
            del self._waiting_logs[:dropped_logs]
            self._waiting_logs.append(("stderr", time.time(), f"nbtrain: the run's supervisor did not take this "
                                                              f"rank's pushes for a while; its {dropped_rows} oldest "
                                                              f"metric rows and {dropped_logs} log chunks waiting to "
                                                              f"be sent were dropped.\n"))

    def _settled(self, timeout: float) -> bool:
        """Whether no push is in flight any more (waiting up to ``timeout``); one that failed stays unsent."""
        if self._in_flight is None:
            return True
        if not self._in_flight.wait(timeout):
            return False
        pending, self._in_flight = self._in_flight, None
        try:
            pending.result()
        except Exception:  # noqa: BLE001 - the supervisor restarting or gone: sent again next time
            self._drop_relay()  # and if it went through the relay, straight to the supervisor from now on
            return True
        self._unsent = None
        return True

    def _send(self, state: str) -> None:
        if self._unsent is None:
            self.seq += 1
            rows, self._waiting_rows = self._waiting_rows[:MAX_PUSH_ROWS], self._waiting_rows[MAX_PUSH_ROWS:]
            logs, self._waiting_logs = self._waiting_logs[:MAX_PUSH_LOGS], self._waiting_logs[MAX_PUSH_LOGS:]
            self._unsent = (self.seq, rows, logs)
        seq, rows, logs = self._unsent
        push = (self.context.rank, self.context.attempt, seq, rows, self._heartbeat(state), logs)
        if self.relay is not None and not self._link_tried:
            self._link_tried = True
            self._link = open_link(self.relay)
        if self._link is not None and self._in_flight is not None:
            self._drop_relay()  # the last flush's resend: the link's next answer is the push still in flight's
        if self._link is not None:
            try:
                self._in_flight = self._link.send(push)
                return
            except OSError:
                self._drop_relay()
        self._in_flight = RayPush((self.relay or self.payload.report_to.supervisor).push.remote(*push))

    def _drop_relay(self) -> None:
        self.relay = None
        if self._link is not None:
            self._link.close()
            self._link = None

    def _renamed_key(self, key: str, logs: list[tuple[str, float, str]]) -> str:
        """``user_<key>`` for a metric named like a row's own key; says so once in the rank's log
        (added to ``logs``, the push's log text: the last push goes after stderr is given back)."""
        if key not in self._renamed:
            self._renamed.add(key)
            logs.append(("stderr", time.time(), f"nbtrain: report({key}=...) is kept as 'user_{key}': every row's "
                                                f"{', '.join(ROW_KEYS)} are set by nbtrain. Give the metric another "
                                                f"name to silence this.\n"))
        return f"user_{key}"


_current: TrainingSession | None = None
_lock = threading.Lock()


def set_session(session: TrainingSession | None) -> None:
    global _current
    with _lock:
        _current = session
        reporting.current = session.reporter if session is not None else None


def active_session() -> TrainingSession | None:
    """The session of the run on this rank, or None between runs."""
    return _current


def current_session() -> TrainingSession:
    session = _current
    if session is None:
        raise NbtrainError(NOT_IN_A_RUN)
    return session

