"""How the notebook reads one run: the :class:`SupervisorChannel` every part of a :class:`~nbtrain.Run` asks
the cluster through, and the :class:`RunReader` that keeps what was read.

A ``Run`` is made of parts (control, files, inspection, debugging); each holds the reader (and through it the
channel) and nothing of the others. Views — the dashboard, its text line, ``compare`` — read a run only
through ``run.reader``: rows, log chunks and events by index, the summary as of the last read. They never
touch a ``Run``'s private fields, so the Run can change inside without breaking what draws it.

The reader keeps cursors into the run's append-only histories and fetches only what is new, so re-attaching
from a fresh kernel replays the whole history once and then follows it live. Memory stays bounded however
long the run: it holds the most recent ``ROW_WINDOW`` metric rows and ``LOG_WINDOW`` log chunks; the whole
history is fetched from the cluster, page by page, only when asked (:meth:`RunReader.all_rows`).

While the run goes on, its supervisor answers; once it has ended and the supervisor has exited, a
short-lived task reads its files (:mod:`nbtrain._client.run.stored`), same cursors: the switch is invisible.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable
from typing import Any

from nbtrain import _registry
from nbtrain._client.connecting import connection
from nbtrain._client.run.run_history import RESERVED, RunHistory
from nbtrain._client.run.stored import READ_TIMEOUT_S, StoredRunHandle, find_stored
from nbtrain._cluster.command_kinds.table import command_kind, definition
from nbtrain._cluster.commands import Command
from nbtrain._cluster.names import find_supervisor
from nbtrain._exceptions import NbtrainError, RunNotFoundError
from nbtrain._ray_compat import note_rank_processes

POLL_TIMEOUT_S = 15.0
ROW_WINDOW = 50_000   # metric rows kept in the notebook (~25 MB); older ones are fetched when asked
LOG_WINDOW = 20_000   # log chunks kept likewise
PAGE_ROWS = 50_000    # rows per poll when fetching a long history
FRAME_PAGE_ROWS = 500_000  # rows per Arrow page of a whole history: ~150 MB of supervisor memory at most
SUPERVISOR_RESTART_GRACE_S = 60.0


class SupervisorChannel:
    """Calls to one run's supervisor, or to its files once the supervisor has exited (the switch is made here)."""

    def __init__(self, name: str, handle: Any, address: str) -> None:
        self.name = name
        self._handle = handle
        self._session = connection.session_now()  # the connection the handle was made in
        self.address = address

    @property
    def handle(self) -> Any:
        """The supervisor's handle (or the stored run's) in the connection the notebook has now. One made before the
        notebook connected again to the run's cluster (after a drop, or a new ``connect()``) is looked up again:
        the new session knows no actor by an earlier session's handle. Connected to another cluster, a run of the
        same name there is not this one: the handle is kept (and fails as the run's cluster is not reached)."""
        session = connection.session_now()
        if session is not None and session is not self._session and session.address == self.address:
            self._session = session
            self._handle = find_supervisor(self.name) or find_stored(self.name) or self._handle
        return self._handle

    @handle.setter
    def handle(self, handle: Any) -> None:
        self._handle = handle

    def call(self, method: str, *args: Any, timeout: float = POLL_TIMEOUT_S) -> Any:
        """``ray.get(handle.<method>.remote(*args))`` on the supervisor, or on the run's files once it has exited."""
        import ray

        deadline = time.monotonic() + SUPERVISOR_RESTART_GRACE_S
        while True:
            handle = self.handle  # a stored run's read is a task that may wait for a process to start
            if isinstance(handle, StoredRunHandle) and not handle.answers(method):
                raise NbtrainError(self._ended_before_answering())
            wait = max(timeout, READ_TIMEOUT_S) if isinstance(handle, StoredRunHandle) else timeout
            try:
                return ray.get(getattr(handle, method).remote(*args), timeout=wait)
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
                self._after_supervisor_error(deadline)

    def _ended_before_answering(self) -> str:
        """What to say when the run ended while the notebook waited on its supervisor for something only a live
        run has (a command's results): the run's end, and its error if it failed."""
        import ray

        summary = ray.get(self.handle.summary.remote(), timeout=READ_TIMEOUT_S)
        error = (summary.get("error") or "").strip()
        said = f"Run {self.name!r} ended ({summary.get('state')}) before it answered; only a live run can."
        return f"{said}\n{error}" if error else f"{said} Its logs say why: run.logs()."

    def steer(self, kind: str, args: dict[str, Any], verb: str) -> Command:
        """Issue a command to the run's ranks (the supervisor numbers it and picks its step); the command as issued.

        Raises:
            InvalidOptionError: the kind refuses ``args`` (nothing was sent).
            NbtrainError: the run cannot take it now (``verb`` says what was asked: ``"paused"``...).
        """
        args = command_kind(kind).check(args)
        done, answer = self.call("steer", kind, args, definition(kind), timeout=READ_TIMEOUT_S)
        if not done:
            raise NbtrainError(f"Run {self.name!r} cannot be {verb}: {answer}")
        command: Command = answer
        return command

    def poll(self, cursor: int, log_cursor: int, event_cursor: int, wait_s: float) -> dict[str, Any]:
        """One poll; while the supervisor restarts (Ray brings it back) keep asking, within limits."""
        import ray

        deadline = time.monotonic() + SUPERVISOR_RESTART_GRACE_S
        while True:
            handle = self.handle
            if isinstance(handle, StoredRunHandle):
                # a task of its own on the head, which may wait for a worker process to start: a read, not a poll
                stored: dict[str, Any] = ray.get(handle.poll.remote(cursor, log_cursor, event_cursor),
                                                 timeout=READ_TIMEOUT_S)
                return stored
            try:
                # A future, not ray.get: over Ray Client the answer then comes back on the
                # session's open data stream instead of a new gRPC call per poll, which saves
                # the Ray Client proxy about a third of its CPU per poll (on a laptop, CPU the
                # ranks need; benchmarks/README.md has the figures).
                reply = handle.poll.remote(cursor, log_cursor, event_cursor, PAGE_ROWS, wait_s).future()
                answer: dict[str, Any] = reply.result(timeout=POLL_TIMEOUT_S + wait_s)
                return answer
            except concurrent.futures.TimeoutError:
                msg = (f"Run {self.name!r}'s supervisor did not answer within {POLL_TIMEOUT_S:.0f} s; "
                       f"it may be restarting. Try again shortly.")
                raise NbtrainError(msg) from None
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
                self._after_supervisor_error(deadline)

    def _after_supervisor_error(self, deadline: float) -> None:
        """The supervisor did not answer: read the run's files if it has exited, else wait while Ray restarts it."""
        if find_supervisor(self.name) is None:
            stored = find_stored(self.name)
            if stored is None:
                msg = (f"Run {self.name!r} is gone: it has no supervisor and no files on the cluster. "
                       f"It was deleted, or its cluster's head node lost its files.")
                raise RunNotFoundError(msg) from None
            self.handle = stored
            return
        if time.monotonic() > deadline:
            msg = (f"Run {self.name!r}'s supervisor has not come back within {SUPERVISOR_RESTART_GRACE_S:.0f} s. "
                   f"Check the cluster (`ray status`), then attach again.")
            raise RunNotFoundError(msg) from None
        time.sleep(0.5)  # Ray is restarting it; nothing to wait on but time


class RunReader:
    """What the notebook has read of one run, and the way to read more: ``run.reader``.

    Views draw from it without asking the cluster (``summary``, ``rows_since``, ``logs_since``, ``events``,
    ``caught_up``) and call :meth:`refresh` to fetch what is new. Rows and log chunks have fixed indexes in
    the run's histories, so a view that remembers the index it reached misses nothing and sees nothing twice,
    whichever reader call (its own, or a cell's ``run.metrics``) fetched them, as long as it keeps up with
    the window (``row_window_start``).
    """

    def __init__(self, channel: SupervisorChannel) -> None:
        self.channel = channel
        self._lock = threading.Lock()
        self._rows: list[dict[str, Any]] = []  # rows from index _row_base on
        self._row_base = 0
        self._logs: list[dict[str, Any]] = []  # log chunks from index _log_base on
        self._log_base = 0
        self._events: list[dict[str, Any]] = []
        self._cursors = (0, 0, 0)
        self._summary: dict[str, Any] = {}
        self._has_more = False  # the last poll left rows for the next
        self._views: list[Any] = []  # the live views of this run (dashboard(), %%ray_train's), until close_views()
        self.row_listener: Callable[[], None] | None = None  # run.on_row's: told after rows were fetched
        # when this reader got its first row, if it follows the run from its launch (see launch_phases)
        self.first_row_at: float | None = None
        self.times_first_row = False

    def refresh(self, wait_s: float = 0.0) -> list[dict[str, Any]]:
        """Fetch what is new: up to one page of rows (``PAGE_ROWS``), every new log chunk and event, and the
        summary; the rows new since the last refresh (by any reader of this run). ``wait_s`` > 0: a long poll.

        The round trip runs outside the lock, so a cell's read never queues behind a dashboard's long poll;
        cursors into append-only histories keep anything from being lost or seen twice.
        """
        with self._lock:
            asked = self._cursors
        reply = self.channel.poll(*asked, wait_s)
        with self._lock:
            self._has_more = bool(reply["has_more"])
            rows = self._apply(asked, reply)
        listener = self.row_listener
        if rows and listener is not None:
            listener()  # on this thread: the dashboard's following thread, when a view follows the run
        return rows

    def catch_up(self) -> None:
        """Refresh until every row reported so far has been fetched (the window keeps the latest)."""
        self.refresh()
        while self._has_more:
            self.refresh()

    def _apply(self, asked: tuple[int, int, int], reply: dict[str, Any]) -> list[dict[str, Any]]:
        """Add the part of ``reply``, the answer to a poll from cursors ``asked``, not yet here."""
        have = self._cursors
        rows: list[dict[str, Any]] = reply["rows"][have[0] - asked[0]:]
        if rows and self.times_first_row and self.first_row_at is None:
            self.first_row_at = time.time()
        self._rows.extend(rows)
        self._logs.extend(reply["logs"][have[1] - asked[1]:])
        if len(self._rows) > ROW_WINDOW * 3 // 2:  # drop the oldest in chunks, not on every poll
            cut = len(self._rows) - ROW_WINDOW
            del self._rows[:cut]
            self._row_base += cut
        if len(self._logs) > LOG_WINDOW * 3 // 2:
            cut = len(self._logs) - LOG_WINDOW
            del self._logs[:cut]
            self._log_base += cut
        self._events.extend(reply["events"][have[2] - asked[2]:])
        self._cursors = (max(have[0], reply["cursor"]), max(have[1], reply["log_cursor"]),
                         max(have[2], reply["event_cursor"]))
        if reply["now"] >= self._summary.get("now", 0.0):  # an answer that was overtaken keeps the newer summary
            self._summary = _readable({k: v for k, v in reply.items()
                                       if k not in ("rows", "logs", "events", "cursor", "log_cursor", "event_cursor")})
            note_rank_processes(self._summary.get("workers") or [])  # Ray's notice of one's death: see there
        return rows

    @property
    def summary(self) -> dict[str, Any]:
        """The run's summary as of the last read (a copy), without asking the cluster: for redraw loops."""
        with self._lock:
            return dict(self._summary)

    def fetch_summary(self) -> dict[str, Any]:
        """Refresh, then the run's summary (a copy)."""
        self.refresh()
        return self.summary

    @property
    def caught_up(self) -> bool:
        """Whether the last refresh fetched every row reported so far (a long history comes a page at a time)."""
        return not self._has_more

    def rows_since(self, start: int = 0) -> list[dict[str, Any]]:
        """Metric rows already fetched, from index ``start`` (or :attr:`row_window_start`, if later) on."""
        with self._lock:
            return self._rows[max(start - self._row_base, 0):]

    @property
    def row_window_start(self) -> int:
        """Index of the first metric row still held in memory (older rows are on the cluster only)."""
        with self._lock:
            return self._row_base

    @property
    def rows_fetched(self) -> int:
        """How many metric rows have been fetched so far (the index the next new row will have)."""
        with self._lock:
            return self._cursors[0]

    def logs_since(self, start: int = 0) -> list[dict[str, Any]]:
        """Log chunks (rank, stream, time, text) already fetched, from index ``start`` (or the window's start) on."""
        with self._lock:
            return self._logs[max(start - self._log_base, 0):]

    @property
    def log_window_start(self) -> int:
        """Index of the first log chunk still held in memory."""
        with self._lock:
            return self._log_base

    @property
    def events(self) -> list[dict[str, Any]]:
        """The run's events already fetched (state changes, failures, restarts, checkpoints), in order."""
        with self._lock:
            return list(self._events)

    def all_rows(self) -> list[dict[str, Any]]:
        """Every row reported so far: the window, and before it the older rows fetched page by page, not kept."""
        self.catch_up()
        with self._lock:
            if self._row_base == 0:
                return list(self._rows)
            cursors, recent = self._cursors, list(self._rows)
        rows: list[dict[str, Any]] = []
        start, stop = 0, cursors[0] - len(recent)
        while start < stop:
            page = self.channel.poll(start, cursors[1], cursors[2], 0.0)["rows"][:stop - start]
            if not page:
                break
            rows.extend(page)
            start += len(page)
        return rows + recent

    def all_logs(self) -> list[dict[str, Any]]:
        """Every log chunk so far, the older ones fetched page by page like :meth:`all_rows`."""
        self.catch_up()
        with self._lock:
            recent, base, cursors = list(self._logs), self._log_base, self._cursors
        entries: list[dict[str, Any]] = []
        while len(entries) < base:
            page = self.channel.poll(cursors[0], len(entries), cursors[2], 0.0)["logs"][:base - len(entries)]
            if not page:
                break
            entries.extend(page)
        return entries + recent

    def add_view(self, view: Any) -> None:
        """Keep a live view (it has ``closed`` and ``close()``) so that ``run.close()`` ends it."""
        with self._lock:
            self._views = [kept for kept in self._views if not kept.closed] + [view]

    def await_views(self, timeout: float) -> None:
        """Wait, ``timeout`` seconds at most, for the live views following this run to draw its end: a cell
        that waited for the run then ends after its dashboards' last picture, which so lands while a cell runs
        (a thread's output goes with the kernel's latest request; nbclient keeps it only while that runs)."""
        with self._lock:
            views = list(self._views)
        deadline = time.monotonic() + timeout
        for view in views:
            thread = getattr(view, "thread", None)
            if thread is not None and thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
            settle = getattr(view, "settle", None)
            if settle is not None:
                settle()  # its last picture again, from this cell's thread

    def note_on_views(self, message: str, colour: str) -> None:
        """Say ``message`` on every live view following this run (a dashboard shows it above its controls)."""
        with self._lock:
            views = [view for view in self._views if not view.closed]
        for view in views:
            view.note_problem(message, colour)

    @property
    def followed(self) -> bool:
        """Whether a live view follows the run (its thread fetches the rows)."""
        with self._lock:
            return any(not view.closed for view in self._views)

    def history(self) -> RunHistory:
        """The run's whole history as of now, for analysis (``run.metrics_frame()``, the figures, ``compare``):
        every metric row, fetched as Arrow pages (no Python object per row: millions load in seconds), then the
        summary and events, so its rewinds cover every row read (:class:`RunHistory`)."""
        import pyarrow as pa

        tables = []
        start = 0
        while True:
            data = self.channel.call("frame_ipc", start, start + FRAME_PAGE_ROWS, timeout=READ_TIMEOUT_S)
            table = pa.ipc.open_stream(data).read_all()
            if table.num_rows:
                tables.append(table)
            if table.num_rows < FRAME_PAGE_ROWS:
                break
            start += table.num_rows
        if tables:
            whole = pa.concat_tables(tables, promote_options="permissive")
            rows = whole.to_pandas()
            integers = frozenset(field.name for field in whole.schema if pa.types.is_integer(field.type))
        else:
            rows = pa.table({name: pa.array([], pa.float64()) for name in RESERVED}).to_pandas()
            integers = frozenset()
        summary = self.fetch_summary()
        return RunHistory(summary, self.events, rows, integers)

    def close_views(self) -> None:
        """End the live views added so far (what they drew stays)."""
        with self._lock:
            views, self._views = self._views, []
        for view in views:
            view.close()


def _readable(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary with its counts as whole numbers or ``None``: a run started by an older nbtrain
    (``total_steps="100"`` was once accepted) must not break every view that reads it."""
    for key in ("total_steps", "total_epochs"):
        if key in summary and not _registry.is_whole(summary[key]):
            summary[key] = None
    if "step" in summary and not _registry.is_whole(summary["step"]):
        summary["step"] = 0
    return summary
