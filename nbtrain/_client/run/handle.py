"""The :class:`Run` handle the notebook holds: a reader of one run's supervisor.

A ``Run`` keeps cursors into the run's append-only histories and fetches only
what is new, so re-attaching from a fresh kernel replays the whole history once
and then follows it live. Reading never writes: not the registry, not a file.

Memory stays bounded however long the run: the Run holds the most recent
``ROW_WINDOW`` metric rows and ``LOG_WINDOW`` log chunks (what views draw from);
``run.metrics``, ``run.metrics_frame()`` and ``run.logs()`` fetch older ones from
the cluster, page by page, only when asked.

While the run goes on, its supervisor answers; once it has ended and the supervisor has exited, a
short-lived task reads its files (:mod:`nbtrain._client.run.stored`), same cursors: the switch is invisible.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Any

import cloudpickle

from nbtrain import _registry
from nbtrain._client.run.control import RunControl
from nbtrain._client.run.debugging import RunDebugging
from nbtrain._client.run.files import RunFiles
from nbtrain._client.run.inspection import RunInspection
from nbtrain._client.run.stored import StoredRunHandle, find_stored
from nbtrain._cluster.names import find_supervisor, wait_until_name_free
from nbtrain._exceptions import NbtrainError, RunFailedError, RunNotFoundError
from nbtrain._states import RunState

POLL_TIMEOUT_S = 15.0
ROW_WINDOW = 50_000   # metric rows kept in the notebook (~25 MB); older ones are fetched when asked
LOG_WINDOW = 20_000   # log chunks kept likewise
PAGE_ROWS = 50_000    # rows per poll when fetching a long history
SUPERVISOR_RESTART_GRACE_S = 60.0

_made_here: list[Run] = []  # the newest Run this process made: launch(), fork(), attach(), the magics all make one


def last_run_here() -> Run | None:
    """The run this kernel last started, forked or attached, from Python or a magic: what ``%ray_debug`` and
    ``%ray_stop`` take when no name is given."""
    return _made_here[0] if _made_here else None


class Run(RunControl, RunFiles, RunDebugging, RunInspection):
    """A training run on the cluster. Get one from :func:`launch` or :func:`attach`.

    Reading ``state``, ``metrics``, ``workers`` or ``logs()`` fetches what is new
    from the run's supervisor (a few milliseconds), so they are always current; once
    the run has ended and its supervisor exited, the run's files answer instead.
    Whatever asks the cluster raises :class:`RunNotFoundError` if the run is gone
    (deleted, or its files lost); these reads raise :class:`NbtrainError` if its
    supervisor does not answer within 15 s. ``name`` is the run's name on the cluster.

    Example::

        run = nbtrain.launch(train, workers=2)
        run.dashboard()
        run.wait()
    """

    def __init__(self, name: str, handle: Any, address: str) -> None:
        self.name = name
        self._handle = handle
        self._address = address
        self._lock = threading.Lock()
        self._rows: list[dict[str, Any]] = []  # rows from index _row_base on
        self._row_base = 0
        self._logs: list[dict[str, Any]] = []  # log chunks from index _log_base on
        self._log_base = 0
        self._events: list[dict[str, Any]] = []
        self._cursors = (0, 0, 0)
        self._summary: dict[str, Any] = {}
        self._result: list[Any] | None = None
        self._has_more = False  # the last poll left rows for the next
        self._followers: list[Any] = []  # the live views of this Run (dashboard(), %%ray_train's), until close()
        _made_here[:] = [self]

    # ------------------------------------------------------------------ reading
    def refresh(self, wait_s: float = 0.0) -> list[dict[str, Any]]:
        """Fetch what is new: up to one page of metric rows (``PAGE_ROWS``), every new log chunk and event,
        and the current summary. One page, so the notebook's memory stays bounded however far behind it is.

        The round trip runs outside the Run's lock, so reading ``run.metrics`` in a cell never queues
        behind a dashboard's long poll on the same Run; cursors into append-only histories make sure
        nothing is lost or seen twice whichever answer lands first.

        Args:
            wait_s: when > 0, a long poll: wait up to this long for something new to arrive.

        Returns:
            The metric rows new since the last refresh (by any reader of this Run).

        Example::

            new_rows = run.refresh(wait_s=5)
        """
        with self._lock:
            asked = self._cursors
        reply = self._poll(*asked, wait_s)
        with self._lock:
            self._has_more = bool(reply["has_more"])
            return self._apply(asked, reply)

    def _catch_up(self) -> None:
        """Refresh until every row reported so far has been fetched (the window keeps the latest)."""
        self.refresh()
        while self._has_more:
            self.refresh()

    def _apply(self, asked: tuple[int, int, int], reply: dict[str, Any]) -> list[dict[str, Any]]:
        """Add the part of ``reply``, the answer to a poll from cursors ``asked``, not yet here."""
        have = self._cursors
        rows: list[dict[str, Any]] = reply["rows"][have[0] - asked[0]:]
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
        return rows

    def _poll(self, cursor: int, log_cursor: int, event_cursor: int, wait_s: float) -> dict[str, Any]:
        """One poll; while the supervisor restarts (Ray brings it back) keep asking, within limits."""
        import ray

        deadline = time.monotonic() + SUPERVISOR_RESTART_GRACE_S
        while True:
            handle = self._handle
            if isinstance(handle, StoredRunHandle):
                stored: dict[str, Any] = ray.get(handle.poll.remote(cursor, log_cursor, event_cursor),
                                                 timeout=POLL_TIMEOUT_S)
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

    def _call(self, method: str, *args: Any, timeout: float = POLL_TIMEOUT_S) -> Any:
        """``ray.get(handle.<method>.remote(*args))`` on the supervisor, or on the run's files once it has exited."""
        import ray

        deadline = time.monotonic() + SUPERVISOR_RESTART_GRACE_S
        while True:
            try:
                return ray.get(getattr(self._handle, method).remote(*args), timeout=timeout)
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
            self._handle = stored
            return
        if time.monotonic() > deadline:
            msg = (f"Run {self.name!r}'s supervisor has not come back within {SUPERVISOR_RESTART_GRACE_S:.0f} s. "
                   f"Check the cluster (`ray status`), then attach again.")
            raise RunNotFoundError(msg) from None
        time.sleep(0.5)  # Ray is restarting it; nothing to wait on but time

    @property
    def _caught_up(self) -> bool:
        """Whether the last refresh fetched every row reported so far (a long history comes a page at a time)."""
        return not self._has_more

    @property
    def _cached_summary(self) -> dict[str, Any]:
        """The run's summary as of the last read, without asking the cluster (for redraw loops)."""
        with self._lock:
            return dict(self._summary)

    def _cached_rows(self, start: int = 0) -> list[dict[str, Any]]:
        """Metric rows already fetched, from index ``start`` (or :attr:`_row_window_start`, if later) on.

        A view that reads by index misses nothing, whichever ``refresh()`` (its own or a
        cell's ``run.metrics``) fetched them, as long as it keeps up with the window.
        """
        with self._lock:
            return self._rows[max(start - self._row_base, 0):]

    @property
    def _row_window_start(self) -> int:
        """Index of the first metric row still held in memory (older rows are on the cluster only)."""
        with self._lock:
            return self._row_base

    def _cached_log_entries(self, start: int = 0) -> list[dict[str, Any]]:
        """Log chunks (rank, stream, time, text) already fetched, from index ``start`` (or the window's start) on."""
        with self._lock:
            return self._logs[max(start - self._log_base, 0):]

    @property
    def _log_window_start(self) -> int:
        with self._lock:
            return self._log_base

    def _cached_events(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._events)

    def _fresh_summary(self) -> dict[str, Any]:
        self.refresh()
        return self._summary

    @property
    def state(self) -> RunState:
        """The run's :class:`RunState` now: ``pending``, ``starting``, ``running``, ``restarting``, ``succeeded``,
        ``failed`` or ``stopped`` (the last three are terminal: ``run.state.is_terminal``)."""
        return RunState(self._fresh_summary()["state"])

    @property
    def metrics(self) -> list[dict[str, Any]]:
        """Every row reported so far, in order, as dicts: ``rank``, ``step``, ``attempt``, ``time`` and the values.

        A long run's older rows are fetched from the cluster page by page (the Run keeps only
        the latest); for millions of rows :meth:`metrics_frame` is faster and far smaller.

        Example::

            losses = [row["loss"] for row in run.metrics if row["rank"] == 0 and "loss" in row]
        """
        self._catch_up()
        with self._lock:
            if self._row_base == 0:
                return list(self._rows)
            cursors, recent = self._cursors, list(self._rows)
        return self._fetch_rows(0, cursors[0] - len(recent), cursors) + recent

    def _fetch_rows(self, start: int, stop: int, cursors: tuple[int, int, int]) -> list[dict[str, Any]]:
        """Metric rows ``[start, stop)`` from the cluster, without keeping them."""
        rows: list[dict[str, Any]] = []
        while start < stop:
            reply = self._poll(start, cursors[1], cursors[2], 0.0)
            page = reply["rows"][:stop - start]
            if not page:
                break
            rows.extend(page)
            start += len(page)
        return rows

    @property
    def workers(self) -> list[dict[str, Any]]:
        """One dict per rank: node, pid, device, state, step, samples/s, memory, heartbeat age, and
        ``malloc_tuned`` (whether the rank keeps freed memory for its next step; see the performance guide)."""
        return list(self._fresh_summary()["workers"])

    @property
    def error(self) -> str | None:
        """Every failing rank with its traceback, as text, or ``None``."""
        error: str | None = self._fresh_summary()["error"]
        return error

    @property
    def config(self) -> dict[str, Any]:
        """The whole ``config`` dict the run was launched (or last resumed) with; ``{}`` without one.

        Summaries and the dashboard carry only a short ``config_summary``; this asks the run for the dict.
        Changes made with :meth:`adjust` are not in it: :meth:`config_at` has them.
        """
        data = self._call("config")
        return dict(cloudpickle.loads(data) or {}) if data is not None else {}

    @property
    def attempt(self) -> int:
        """Which attempt the run is on: 1 for the first (0 before it starts), one more each time it starts again
        from a checkpoint (after a failure, an elastic resize, or ``resume=True``)."""
        return int(self._fresh_summary()["attempt"])

    @property
    def events(self) -> list[dict[str, Any]]:
        """State changes, failures, restarts, stalls and checkpoints, in order, one dict each."""
        self.refresh()
        with self._lock:
            return list(self._events)

    def summary(self) -> dict[str, Any]:
        """The run's summary now, as the dashboard and the sidebar read it (a copy).

        Returns:
            A dict with, among others, ``state``, ``attempt``, ``step`` (the slowest rank's), ``world_size``,
            ``workers``, ``error``, ``parent`` (a forked run's ``{"run", "step"}``), ``latest`` (the last
            values reported), ``started`` and ``ended``.
        """
        return dict(self._fresh_summary())

    # ------------------------------------------------------------------ control
    def wait(self, timeout: float | None = None, *, raise_on_failure: bool = True) -> RunState:
        """Block until the run ends (or ``timeout`` seconds pass) and return its state.

        Whatever happens here, Ctrl-C included, the run keeps going: only the call that launched
        a run stops it when interrupted; :meth:`stop` stops it from anywhere.

        Args:
            timeout: seconds to wait at most; ``None`` waits for the end.
            raise_on_failure: raise if the run failed; ``False`` just returns the state.

        Returns:
            The terminal :class:`RunState` (succeeded, failed or stopped).

        Raises:
            RunFailedError: the run failed (the message has every failing rank's traceback).
            TimeoutError: ``timeout`` passed first.

        Example::

            if run.wait(raise_on_failure=False) == nbtrain.RunState.FAILED:
                run.debug()
        """
        from nbtrain._client.run.following import block_until_done

        state = block_until_done(self, launched=False, timeout=timeout)
        if raise_on_failure:
            self.raise_if_failed()
        return state

    def raise_if_failed(self) -> None:
        """Raise if the run has ended failed, as of the last read (it asks nothing of the cluster).

        Raises:
            RunFailedError: the run failed (the message has every failing rank's traceback).
        """
        summary = self._cached_summary
        if summary.get("state") == RunState.FAILED:
            raise RunFailedError(f"Run {self.name!r} failed.\n{summary.get('error')}")

    def delete(self, timeout: float = 30.0) -> None:
        """Delete an ended run: its stored history, checkpoints and state, its supervisor, its registry record.

        Deleting is not undoable, so it never stops a run on the way. Afterwards the name is free,
        and launching it again starts a new run from step 0.

        Args:
            timeout: seconds to wait for the supervisor to delete the files.

        Raises:
            NbtrainError: the run is still going (nothing was deleted): :meth:`stop` it first.

        Example::

            run.stop(); run.delete()
        """
        import ray

        outcome = self._call("delete", timeout=timeout)
        if outcome == "retired":  # the run had just ended and its supervisor is exiting: delete its files
            wait_until_name_free(self.name)
            outcome = self._call("delete", timeout=timeout)
        if outcome != "deleted":
            msg = (f"Run {self.name!r} is still {outcome}, so nothing was deleted. Stop it first with "
                   f"run.stop() (or `nbtrain stop {self.name}`), then delete it.")
            raise NbtrainError(msg)
        _registry.forget_run(self.name, self._address)
        if isinstance(self._handle, StoredRunHandle):  # no process to end: the files were the run
            return
        ray.kill(self._handle, no_restart=True)
        wait_until_name_free(self.name)  # a launch of the name may follow

    def dashboard(self, **options: Any) -> Any:
        """Show the live dashboard: widgets in a notebook, a text progress line elsewhere.

        Showing it again from the same cell closes the one that cell showed before; :meth:`close` ends them all.

        Args:
            **options: ``follow="background"`` (a thread redraws; the default) or ``"none"``, and ``ranks``:
                in a wide run, the ranks drawn as lines of their own (``ranks=[0, 17]``).

        Returns:
            The view shown.

        Example::

            run.dashboard(ranks=[0, 3])
        """
        from nbtrain._views.dashboard.dashboard import show_dashboard

        return show_dashboard(self, **options)

    def close(self) -> None:
        """End this Run's live views (its dashboards) within a second; what they drew stays, and the run goes on."""
        followers, self._followers = self._followers, []
        for follower in followers:
            follower.close()

    def __repr__(self) -> str:
        summary = self._summary
        state = summary.get("state", "?")
        return f"<nbtrain.Run {self.name!r} {state}, attempt {summary.get('attempt', '?')}, {len(self._rows)} rows>"


def _readable(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary with its counts as whole numbers or ``None``: a run started by an older nbtrain
    (``total_steps="100"`` was once accepted) must not break every view that reads it."""
    for key in ("total_steps", "total_epochs"):
        if key in summary and not _registry.is_whole(summary[key]):
            summary[key] = None
    if "step" in summary and not _registry.is_whole(summary["step"]):
        summary["step"] = 0
    return summary
