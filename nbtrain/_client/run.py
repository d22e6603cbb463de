"""The :class:`Run` handle the notebook holds: a reader of one run's supervisor.

A ``Run`` keeps cursors into the run's append-only histories and fetches only
what is new, so re-attaching from a fresh kernel replays the whole history once
and then follows it live. Reading never writes: not the registry, not a file.

Memory stays bounded however long the run: the Run holds the most recent
``ROW_WINDOW`` metric rows and ``LOG_WINDOW`` log chunks (what views draw from);
``run.metrics``, ``run.metrics_frame()`` and ``run.logs()`` fetch older ones from
the cluster, page by page, only when asked.

While the run goes on, its supervisor answers; once it has ended and the supervisor has exited, a
short-lived task reads its files (:mod:`nbtrain._client.stored`), same cursors: the switch is invisible.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from pathlib import Path
from typing import Any

import cloudpickle

from nbtrain import _registry
from nbtrain._client.checkpoint_files import load_in_notebook, local_checkpoint_dir
from nbtrain._client.run_control import RunControl
from nbtrain._client.run_debugging import RunDebugging
from nbtrain._client.stored import READ_TIMEOUT_S, StoredRunHandle, find_stored
from nbtrain._cluster.names import find_supervisor, wait_until_name_free
from nbtrain._exceptions import NbtrainError, RunFailedError, RunNotFoundError
from nbtrain._states import RunState

POLL_TIMEOUT_S = 15.0
ROW_WINDOW = 50_000   # metric rows kept in the notebook (~25 MB); older ones are fetched when asked
LOG_WINDOW = 20_000   # log chunks kept likewise
PAGE_ROWS = 50_000    # rows per poll when fetching a long history
FRAME_PAGE_ROWS = 500_000  # rows per Arrow page of metrics_frame(): ~150 MB of supervisor memory at most
SUPERVISOR_RESTART_GRACE_S = 60.0


class Run(RunControl, RunDebugging):
    """A training run on the cluster. Get one from :func:`launch` or :func:`attach`.

    Reading ``state``, ``metrics``, ``workers`` or ``logs()`` fetches what is new
    from the run's supervisor (a few milliseconds), so they are always current.
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

    # ------------------------------------------------------------------ reading
    def refresh(self, wait_s: float = 0.0) -> list[dict[str, Any]]:
        """Fetch what is new, up to one page of rows (:data:`PAGE_ROWS`); returns the new metric rows.

        One page, so the notebook's memory stays bounded however far behind it is: a view
        that follows the run draws every page (``_cached_rows``) before the next is fetched.
        Logs and events come whole, and the summary (state, workers) is current either way.

        ``wait_s`` > 0 waits up to that long for something new to arrive (a long
        poll: one round trip, answered as soon as a worker's batch lands).

        The round trip runs outside the Run's lock, so reading ``run.metrics`` in a
        cell never queues behind a dashboard's long poll on the same Run. Cursors
        are positions in append-only histories: whichever answer lands second adds
        only what the first did not, so nothing is lost and nothing is seen twice.
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
        """``pending``, ``starting``, ``running``, ``restarting``, ``succeeded``, ``failed`` or ``stopped``."""
        return RunState(self._fresh_summary()["state"])

    @property
    def metrics(self) -> list[dict[str, Any]]:
        """Every reported row so far: ``rank``, ``step``, ``attempt``, ``time`` and the values.

        A long run's older rows are fetched from the cluster page by page (the Run keeps only
        the latest); for millions of rows :meth:`metrics_frame` is faster and far smaller.
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

    def metrics_frame(self) -> Any:
        """Every reported row so far as a pandas DataFrame (columns ``rank``, ``step``, ``attempt``, ``time``
        and one per metric), built from Arrow pages sent by the cluster: no Python object per row, so
        millions of rows load in seconds."""
        import pyarrow as pa

        tables = []
        start = 0
        while True:
            data = self._call("frame_ipc", start, start + FRAME_PAGE_ROWS, timeout=READ_TIMEOUT_S)
            table = pa.ipc.open_stream(data).read_all()
            if table.num_rows:
                tables.append(table)
            if table.num_rows < FRAME_PAGE_ROWS:
                break
            start += table.num_rows
        if not tables:
            return pa.table({"rank": [], "step": [], "attempt": [], "time": []}).to_pandas()
        return pa.concat_tables(tables, promote_options="permissive").to_pandas()

    @property
    def workers(self) -> list[dict[str, Any]]:
        """One dict per rank: node, pid, device, state, step, samples/s, memory, heartbeat age, and
        ``malloc_tuned`` (whether the rank keeps freed memory for its next step; see the performance guide)."""
        return list(self._fresh_summary()["workers"])

    @property
    def error(self) -> str | None:
        """Every failing rank with its traceback, or ``None``."""
        error: str | None = self._fresh_summary()["error"]
        return error

    @property
    def config(self) -> dict[str, Any]:
        """The whole ``config`` the run was launched (or last resumed) with.

        Summaries and the dashboard carry only a short ``config_summary``; this asks the run for the dict.
        """
        data = self._call("config")
        return dict(cloudpickle.loads(data) or {}) if data is not None else {}

    @property
    def attempt(self) -> int:
        return int(self._fresh_summary()["attempt"])

    @property
    def events(self) -> list[dict[str, Any]]:
        """State changes, failures, restarts, stalls and checkpoints, in order."""
        self.refresh()
        with self._lock:
            return list(self._events)

    def logs(self, rank: int | None = None) -> str:
        """What the workers printed (stdout and stderr), for one rank or all of them."""
        self._catch_up()
        with self._lock:
            entries, base, cursors = list(self._logs), self._log_base, self._cursors
        if base:  # a long run's older chunks are on the cluster only
            entries = self._fetch_logs(base, cursors) + entries
        chunks = [entry for entry in entries if rank is None or entry["rank"] == rank]
        if rank is not None:
            return "".join(entry["text"] for entry in chunks)
        return "".join(f"[rank {entry['rank']}] {line}\n" for entry in chunks
                       for line in entry["text"].splitlines() if line.strip())

    def _fetch_logs(self, stop: int, cursors: tuple[int, int, int]) -> list[dict[str, Any]]:
        """Log chunks ``[0, stop)`` from the cluster, without keeping them."""
        entries: list[dict[str, Any]] = []
        while len(entries) < stop:
            reply = self._poll(cursors[0], len(entries), cursors[2], 0.0)
            page = reply["logs"][:stop - len(entries)]
            if not page:
                break
            entries.extend(page)
        return entries

    @property
    def result(self) -> list[Any] | None:
        """What the training function returned on each rank (a list indexed by rank), once succeeded."""
        if self._result is None:
            raw = self._call("result")
            if raw is not None:
                self._result = [cloudpickle.loads(item) for item in raw]
        return self._result

    def summary(self) -> dict[str, Any]:
        return dict(self._fresh_summary())

    # ------------------------------------------------------------------ control
    def wait(self, timeout: float | None = None, *, raise_on_failure: bool = True) -> RunState:
        """Block until the run ends (or ``timeout`` seconds pass) and return its state.

        Raises :class:`RunFailedError` with every failing rank's traceback when the
        run failed (pass ``raise_on_failure=False`` to just get the state), and
        ``TimeoutError`` if ``timeout`` passes first. Either way, and on Ctrl-C,
        the run keeps going: only the call that launched a run stops it when
        interrupted; ``run.stop()`` stops it from anywhere.
        """
        from nbtrain._client.following import block_until_done

        state = block_until_done(self, launched=False, timeout=timeout)
        if raise_on_failure:
            self.raise_if_failed()
        return state

    def raise_if_failed(self) -> None:
        """Raise :class:`RunFailedError` (every failing rank, with tracebacks) if the run ended failed."""
        summary = self._cached_summary
        if summary.get("state") == RunState.FAILED:
            raise RunFailedError(f"Run {self.name!r} failed.\n{summary.get('error')}")

    def load_checkpoint(self, *, weights_only: bool = True) -> Any | None:
        """The run's latest checkpoint in the notebook (``None`` if none was saved).

        What ``nbtrain.save_checkpoint`` saved is loaded with ``torch.load(weights_only=True)``:
        only tensors and plain containers. Pass ``weights_only=False`` only for checkpoints
        you trust. A checkpoint reported by Ray Train code (``ray.train.report(checkpoint=)``)
        comes back as a ``ray.train.Checkpoint`` of a local directory with its files.
        """
        found = self._call("latest_checkpoint", timeout=READ_TIMEOUT_S)
        return None if found is None else load_in_notebook(self.name, *found, weights_only=weights_only)

    def checkpoint_dir(self) -> Path | None:
        """The latest checkpoint's files in a local directory (``None`` if none was saved).

        A Ray Train checkpoint's directory as the function wrote it; what
        ``nbtrain.save_checkpoint`` saved, as ``checkpoint.pt`` (``torch.save``'s file).
        """
        found = self._call("latest_checkpoint", timeout=READ_TIMEOUT_S)
        return None if found is None else local_checkpoint_dir(self.name, *found)

    def delete(self, timeout: float = 30.0) -> None:
        """Delete an ended run: its stored history, checkpoints and state, its supervisor, its registry record.

        A run still going is refused, and nothing is deleted: ``run.stop()`` it first
        (deleting is not undoable, so it never stops a run on the way). Afterwards the
        name is free, and launching it again starts a new run from step 0.
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
        """The live dashboard (widgets in a notebook, a text line elsewhere). Showing it again from the same
        cell closes the one that cell showed before; :meth:`close` ends them all."""
        from nbtrain._views.dashboard import show_dashboard

        return show_dashboard(self, **options)

    def close(self) -> None:
        """End this Run's live views within a second (what they drew stays); the run goes on."""
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
