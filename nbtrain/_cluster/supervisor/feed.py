"""A run's history and the cursor feed notebooks read it through.

Three append-only lists — metric rows, log chunks, events — kept in the run's
storage (:mod:`~nbtrain._cluster.storage.history_log`) as they grow and taken up from it
when Ray restarts the supervisor. A reader holds one cursor (a list index) per
list, so a reconnecting notebook asks "everything after 1 234" and gets exactly
what it missed: no loss, no duplicates. A long poll waits on a condition
instead of the caller polling in a loop.

Memory stays bounded however long the run: only the last :data:`ROW_TAIL` rows
and :data:`LOG_TAIL` log chunks are held (what live pollers ask for); a reader
further behind gets older ones from disk. Events are few and all held.

When the history cannot be written (the disk is full), rows stay in memory and
are served all the same; the user is told once by an event, and once more
when they are written again.

One lock guards the feed and the supervisor's other state (the supervisor
passes it in): nothing here blocks on a worker or the network while holding it.
"""

from __future__ import annotations

import errno
import io
import math
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from nbtrain import _json
from nbtrain._cluster.relay.relay_link import TICK_GATHER_S
from nbtrain._cluster.storage.history_log import HistoryLog, parse_lines
from nbtrain._cluster.storage.run_storage import RunStorage

LONG_POLL_LIMIT_S = 10.0
RESERVED_KEYS = ("rank", "step", "attempt", "time")  # every row's own keys, set by nbtrain (step by default)
ROW_TAIL = 20_000  # metric rows held in memory (a few seconds of 256 ranks; ~10 MB)
LOG_TAIL = 20_000  # log chunks held likewise


class _Tail:
    """A history log and its last ``keep`` records in memory; indices are the log's."""

    def __init__(self, log: HistoryLog, keep: int) -> None:
        self.log = log
        self.keep = keep
        self.base = 0  # index of items[0]
        self.items: list[dict[str, Any]] = []

    @property
    def count(self) -> int:
        return self.base + len(self.items)

    def load(self) -> None:
        total = len(self.log)
        self.base = max(total - self.keep, 0)
        self.items = self.log.read(self.base, total)

    def append(self, records: list[dict[str, Any]]) -> None:
        self.log.append(records)
        self.items.extend(records)
        if len(self.items) > self.keep * 3 // 2:  # drop the oldest in chunks, not on every push
            cut = len(self.items) - self.keep
            del self.items[:cut]
            self.base += cut

    def read(self, start: int, stop: int) -> list[dict[str, Any]]:
        start, stop = max(start, 0), min(stop, self.count)
        if start >= stop:
            return []
        if start >= self.base:
            return self.items[start - self.base:stop - self.base]
        return self.log.read(start, min(stop, self.base)) + self.items[:max(stop - self.base, 0)]


class RunFeed:
    """The run's three histories and the long poll over them; see the module docstring.

    Over :meth:`RunStorage.open_existing` it serves a stored run read-only:
    :meth:`replay`, then :meth:`read` and :meth:`frame_ipc`.
    """

    def __init__(self, storage: RunStorage, lock: threading.RLock) -> None:
        self._storage = storage
        self.lock = lock
        self.changed = threading.Condition(lock)
        self._rows = _Tail(storage.history("metrics"), ROW_TAIL)
        self._logs = _Tail(storage.history("logs"), LOG_TAIL)
        self._events = storage.history("events")
        self.events: list[dict[str, Any]] = []
        self.latest: dict[str, Any] = {}  # each metric's last reported value, for summaries
        self.latest_by_rank: dict[int, dict[str, Any]] = {}  # the same per rank, for the worker table
        self._last_seq: dict[tuple[int, int], int] = {}  # (attempt, rank) -> seq of its latest push
        # Attempts recorded by an earlier supervisor process: their workers died with it, so a push of
        # theirs arriving now is one it may have stored already (resent after the process died).
        self._closed_attempts = 0
        self._pushes: dict[tuple[int, int], int] = {}  # (attempt, rank) -> pushes received
        self.last_push: dict[int, float] = {}  # rank -> monotonic arrival of its latest push
        self._told_failure: int | None = None  # errno of the storage failure the user was told about

    @property
    def row_count(self) -> int:
        return self._rows.count

    @property
    def log_count(self) -> int:
        return self._logs.count

    @property
    def event_count(self) -> int:
        return len(self.events)

    def replay(self) -> None:
        """Take up the history a previous supervisor process recorded (its tail only: cheap at any length)."""
        with self.lock:
            self._rows.load()
            self._logs.load()
            self.events = self._events.read(0)
            for row in self._rows.items:
                self._note_latest(row, self.latest_by_rank.setdefault(row.get("rank", -1), {}))
            recorded = [*self._rows.items[-1:], *self._logs.items[-1:], *self.events]
            self._closed_attempts = max((int(record.get("attempt", 0)) for record in recorded), default=0)

    def accept(self, rank: int, attempt: int, seq: int, rows: list[dict[str, Any]],
               logs: list[tuple[str, float, str]]) -> list[dict[str, Any]] | None:
        """Append one push from a rank; ``None`` if that push was seen before, else its rows holding NaN.

        A rank's pushes arrive in order (one in flight at a time), so one seen before has a
        ``seq`` no greater than its last: a resend after an error whose first send landed.
        """
        with self.lock:
            key = (attempt, rank)
            if attempt <= self._closed_attempts or seq <= self._last_seq.get(key, 0):
                return None
            self._last_seq[key] = seq
            self._pushes[key] = self._pushes.get(key, 0) + 1
            if self._told_failure is not None:
                self._storage.flush_pending()
            with_nan = []
            if rows:
                self._rows.append(rows)
                of_rank = self.latest_by_rank.setdefault(rank, {})
                for row in rows:  # one pass per row: the latest values, and NaN
                    values = self._note_latest(row, of_rank)
                    if any(isinstance(value, float) and math.isnan(value) for value in values.values()):
                        with_nan.append(row)
            if logs:
                self._logs.append([{"rank": rank, "attempt": attempt, "stream": stream, "time": when, "text": text}
                                   for stream, when, text in logs])
            self._tell_storage_failure(attempt)
            self.last_push[rank] = time.monotonic()
            self.changed.notify_all()
            return with_nan

    def _note_latest(self, row: dict[str, Any], of_rank: dict[str, Any]) -> dict[str, Any]:
        """Take ``row``'s values (numbers, text, NaN and infinities alike) as the latest; returns them."""
        values = {key: value for key, value in row.items() if key not in RESERVED_KEYS}
        self.latest.update(values)
        of_rank.update(values)
        return values

    def wait_for_pushes(self, attempt: int, sent: dict[int, int], idle_s: float) -> dict[int, int]:
        """Wait until every rank's pushes of ``attempt`` (``sent``: rank -> count) have arrived; the pushes that
        never did, by rank (empty: all landed).

        A big backlog may take a while to land; give up only once none has arrived for ``idle_s``.
        """
        with self.lock:
            received = -1
            deadline = time.monotonic()
            while True:
                missing = {rank: count - self._pushes.get((attempt, rank), 0) for rank, count in sent.items()}
                missing = {rank: count for rank, count in missing.items() if count > 0}
                if not missing:
                    return {}
                have = sum(self._pushes.get((attempt, rank), 0) for rank in sent)
                if have != received:  # progress: wait a while longer
                    received, deadline = have, time.monotonic() + idle_s
                left = deadline - time.monotonic()
                if left <= 0:
                    return missing
                self.changed.wait(timeout=left)

    def last_log_lines(self, rank: int, attempt: int, count: int) -> list[str]:
        """The last ``count`` lines rank ``rank`` printed in ``attempt``, as far as its pushes brought them (held in
        memory: read at once, so a restart waits for nothing)."""
        with self.lock:
            chunks = [item["text"] for item in reversed(self._logs.items)
                      if item.get("rank") == rank and item.get("attempt") == attempt]
            lines: list[str] = []
            for text in chunks:  # newest first, until enough lines
                lines[:0] = text.rstrip("\n").split("\n")
                if len(lines) >= count:
                    break
        return lines[-count:]

    def event(self, kind: str, message: str, attempt: int, **fields: Any) -> None:
        """An event of the run's history: ``message`` for people, ``fields`` (JSON values) for readers, which
        never parse the message (a resize's ``from_size`` and ``to_size``, a guard trip's ``step``...)."""
        with self.lock:
            if self._told_failure is not None:
                self._storage.flush_pending()
            self._add_event(kind, message, attempt, **fields)
            self._tell_storage_failure(attempt)
            self.changed.notify_all()

    def _add_event(self, kind: str, message: str, attempt: int, **fields: Any) -> None:
        record = {**fields, "time": time.time(), "kind": kind, "message": message, "attempt": attempt}
        self.events.append(record)
        self._events.append([record])

    def _tell_storage_failure(self, attempt: int) -> None:
        """One event when the history stops being written, one when it is written again."""
        failure = self._storage.failure()
        code = None if failure is None else (failure.errno or -1)
        if code == self._told_failure:
            return
        self._told_failure = code
        where = self._storage.dir
        if failure is None:
            message = f"history storage at {where} is written again: the rows kept in memory are on disk"
        elif code == errno.ENOSPC:
            message = f"history storage is full at {where}: rows are kept in memory until space is freed"
        else:
            message = (f"history storage at {where} cannot be written ({failure.strerror or failure}): "
                       f"rows are kept in memory until it can")
        self._add_event("storage", message, attempt)

    def read(self, cursors: tuple[int, int, int], max_rows: int, wait_s: float, ended: Callable[[], bool],
             running_ranks: Callable[[], list[int]], flush_interval_s: float) -> dict[str, Any]:
        """Everything after ``cursors`` (rows, logs, events); with ``wait_s`` a long poll.

        Call with the lock held (the caller adds its summary to the same answer).
        """
        cursor, log_cursor, event_cursor = cursors

        def has_news() -> bool:
            return (cursor < self._rows.count or log_cursor < self._logs.count
                    or event_cursor < len(self.events) or ended())

        if wait_s > 0 and not has_news():
            deadline = time.monotonic() + min(wait_s, LONG_POLL_LIMIT_S)
            while not has_news() and (left := deadline - time.monotonic()) > 0:
                self.changed.wait(timeout=left)
            if cursor < self._rows.count:  # woken by a rank's rows, not by a timeout or an event
                self._gather_tick(running_ranks(), flush_interval_s)
        rows = self._rows.read(cursor, cursor + max_rows)
        logs = self._logs.read(log_cursor, log_cursor + max_rows)
        return {
            "rows": rows, "cursor": cursor + len(rows), "has_more": cursor + len(rows) < self._rows.count,
            "logs": logs, "log_cursor": log_cursor + len(logs),
            "events": self.events[event_cursor:], "event_cursor": len(self.events),
        }

    def frame_ipc(self, start: int = 0, stop: int | None = None) -> bytes:
        """Metric rows ``[start, stop)`` as an Arrow IPC stream: columns rank, step, attempt, time and
        one per metric (NaN and infinities as floats; a text metric as strings). Reads the log, not
        the lock: call it without holding the lock."""
        return _ipc_stream(self._rows.log.read_pieces(start, stop))

    def _gather_tick(self, running: list[int], flush_interval_s: float) -> None:
        """Let the other running ranks' pushes of this flush tick arrive before answering."""
        woke = time.monotonic()
        deadline = woke + TICK_GATHER_S
        recent = woke - flush_interval_s / 2  # pushed on this tick, not the last one
        while (any(self.last_push.get(rank, 0.0) < recent for rank in running)
               and (left := deadline - time.monotonic()) > 0):
            self.changed.wait(timeout=left)


def nan_keys(row: dict[str, Any]) -> list[str]:
    return [key for key, value in row.items() if isinstance(value, float) and math.isnan(value)]


# ---------------------------------------------------------------------- Arrow frames of metric rows
def _ipc_stream(pieces: Iterable[bytes | list[dict[str, Any]]]) -> bytes:
    """One Arrow IPC stream of the rows in ``pieces`` (JSON lines of a segment, or parsed rows)."""
    import pyarrow as pa

    tables = [_lines_table(piece) if isinstance(piece, bytes) else _rows_table(piece) for piece in pieces]
    table = _concat(tables)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    stream: bytes = sink.getvalue().to_pybytes()
    del table, tables, sink
    pa.default_memory_pool().release_unused()  # else the pool keeps a big frame's memory (measured: +400 MB)
    return stream


def _lines_table(data: bytes) -> Any:
    """A segment's JSON lines as a table: parsed by Arrow in C++ (no Python object per row), or, for
    lines it cannot take (a metric that is a number in one row and "NaN" in another), by Python."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pa_json

    table = None
    # in blocks, on several threads; in one block if a column's type changed from one block to the next
    for options in (pa_json.ReadOptions(), pa_json.ReadOptions(block_size=len(data) + 1)):
        try:
            table = pa_json.read_json(io.BytesIO(data), read_options=options)
            break
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue
    if table is None:
        return _rows_table(parse_lines(data))
    non_finite = pa.array(list(_json.NON_FINITE))
    for index, field in enumerate(table.schema):  # a column of nothing but "NaN"s is a float column
        column = table.column(index)
        if pa.types.is_string(field.type) and pc.all(pc.is_in(column.drop_null(), value_set=non_finite)).as_py():
            table = table.set_column(index, field.name, pc.cast(column, pa.float64()))
    return table


def _rows_table(rows: list[dict[str, Any]]) -> Any:
    import pyarrow as pa

    names = list(dict.fromkeys(key for row in rows for key in row))
    columns = {}
    for name in names:
        values = [row.get(name) for row in rows]
        try:
            columns[name] = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # text and numbers in one metric: all text
            columns[name] = pa.array([None if value is None else str(value) for value in values], pa.string())
    return pa.table(columns)


def _concat(tables: list[Any]) -> Any:
    """The tables one after another, reserved columns first; a column numeric in one and text in
    another becomes text, integers and floats become floats."""
    import pyarrow as pa

    types: dict[str, list[Any]] = {}
    for name in RESERVED_KEYS:
        types[name] = [pa.float64() if name == "time" else pa.int64()]
    for table in tables:
        for field in table.schema:
            types.setdefault(field.name, []).append(field.type)
    target = {name: _common_type(found) for name, found in types.items()}
    schema = pa.schema([(name, kind) for name, kind in target.items()])
    aligned = [pa.table({name: (table.column(name).cast(kind) if name in table.column_names
                                else pa.nulls(table.num_rows, kind)) for name, kind in target.items()},
                        schema=schema) for table in tables]
    return pa.concat_tables(aligned) if aligned else schema.empty_table()


def _common_type(found: list[Any]) -> Any:
    import pyarrow as pa

    kinds = {kind for kind in found if not pa.types.is_null(kind)}
    if len(kinds) <= 1:
        return kinds.pop() if kinds else pa.float64()
    if all(pa.types.is_integer(kind) or pa.types.is_floating(kind) for kind in kinds):
        return pa.float64()
    return pa.string()
