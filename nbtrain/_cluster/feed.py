"""A run's history and the cursor feed notebooks read it through.

Three append-only lists — metric rows, log chunks, events — written to the
run's storage as they grow and replayed from it when Ray restarts the
supervisor. A reader holds one cursor (a list index) per list, so a reconnecting
notebook asks "everything after 1 234" and gets exactly what it missed: no
loss, no duplicates. A long poll waits on a condition instead of the caller
polling in a loop.

One lock guards the feed and the supervisor's other state (the supervisor
passes it in): nothing here blocks on a worker or the network while holding it.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

from nbtrain._cluster.storage import RunStorage

LONG_POLL_LIMIT_S = 10.0
# Ranks flush on the same wall-clock ticks (see session.until_next_tick); a long poll woken
# by the first rank's push waits this long at most for the others of that tick.
TICK_GATHER_S = 0.05
RESERVED_KEYS = ("rank", "step", "attempt", "time")  # every row's own keys, set by nbtrain (step by default)


class RunFeed:
    def __init__(self, storage: RunStorage, lock: threading.RLock) -> None:
        self._storage = storage
        self.lock = lock
        self.changed = threading.Condition(lock)
        self.rows: list[dict[str, Any]] = []
        self.logs: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.latest: dict[str, Any] = {}  # each metric's last reported value, for summaries
        self.latest_by_rank: dict[int, dict[str, Any]] = {}  # the same per rank, for the worker table
        self._seen: set[tuple[int, int, int]] = set()
        self._pushes: dict[tuple[int, int], int] = {}  # (attempt, rank) -> pushes received
        self.last_push: dict[int, float] = {}  # rank -> monotonic arrival of its latest push

    def replay(self) -> None:
        """Load the history a previous supervisor process recorded."""
        with self.lock:
            self.rows = self._storage.load("metrics")
            self.logs = self._storage.load("logs")
            self.events = self._storage.load("events")
            for row in self.rows:
                self._note_latest(row, self.latest_by_rank.setdefault(row.get("rank", -1), {}))

    def accept(self, rank: int, attempt: int, seq: int, rows: list[dict[str, Any]],
               logs: list[tuple[str, float, str]]) -> list[dict[str, Any]] | None:
        """Append one push from a rank; ``None`` if that push was seen before, else its rows holding NaN."""
        with self.lock:
            key = (attempt, rank, seq)
            if key in self._seen:
                return None
            self._seen.add(key)
            self._pushes[attempt, rank] = self._pushes.get((attempt, rank), 0) + 1
            with_nan = []
            if rows:
                self.rows.extend(rows)
                self._storage.append("metrics", rows)
                of_rank = self.latest_by_rank.setdefault(rank, {})
                for row in rows:  # one pass per row: the latest values, and NaN
                    values = self._note_latest(row, of_rank)
                    if any(isinstance(value, float) and math.isnan(value) for value in values.values()):
                        with_nan.append(row)
            if logs:
                records = [{"rank": rank, "attempt": attempt, "stream": stream, "time": when, "text": text}
                           for stream, when, text in logs]
                self.logs.extend(records)
                self._storage.append("logs", records)
            self.last_push[rank] = time.monotonic()
            self.changed.notify_all()
            return with_nan

    def _note_latest(self, row: dict[str, Any], of_rank: dict[str, Any]) -> dict[str, Any]:
        """Take ``row``'s values (numbers, text, NaN and infinities alike) as the latest; returns them."""
        values = {key: value for key, value in row.items() if key not in RESERVED_KEYS}
        self.latest.update(values)
        of_rank.update(values)
        return values

    def wait_for_pushes(self, attempt: int, sent: dict[int, int], idle_s: float) -> bool:
        """Wait until every rank's pushes of ``attempt`` (``sent``: rank -> count) have arrived.

        A big backlog may take a while to land; give up only once none has arrived for ``idle_s``.
        """
        with self.lock:
            received = -1
            deadline = time.monotonic()
            while True:
                counts = [self._pushes.get((attempt, rank), 0) for rank in sent]
                if all(have >= count for have, count in zip(counts, sent.values())):
                    return True
                if sum(counts) != received:  # progress: wait a while longer
                    received, deadline = sum(counts), time.monotonic() + idle_s
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(timeout=left)

    def event(self, kind: str, message: str, attempt: int) -> None:
        record = {"time": time.time(), "kind": kind, "message": message, "attempt": attempt}
        with self.lock:
            self.events.append(record)
            self._storage.append("events", [record])
            self.changed.notify_all()

    def notify(self) -> None:
        """Wake long polls: something a reader sees besides the lists changed (the run's state)."""
        with self.lock:
            self.changed.notify_all()

    def read(self, cursors: tuple[int, int, int], max_rows: int, wait_s: float, ended: Callable[[], bool],
             running_ranks: Callable[[], list[int]], flush_interval_s: float) -> dict[str, Any]:
        """Everything after ``cursors`` (rows, logs, events); with ``wait_s`` a long poll.

        Call with the lock held (the caller adds its summary to the same answer).
        """
        cursor, log_cursor, event_cursor = cursors

        def has_news() -> bool:
            return (cursor < len(self.rows) or log_cursor < len(self.logs)
                    or event_cursor < len(self.events) or ended())

        if wait_s > 0 and not has_news():
            deadline = time.monotonic() + min(wait_s, LONG_POLL_LIMIT_S)
            while not has_news() and (left := deadline - time.monotonic()) > 0:
                self.changed.wait(timeout=left)
            if cursor < len(self.rows):  # woken by a rank's rows, not by a timeout or an event
                self._gather_tick(running_ranks(), flush_interval_s)
        rows = self.rows[cursor:cursor + max_rows]
        logs = self.logs[log_cursor:log_cursor + max_rows]
        return {
            "rows": rows, "cursor": cursor + len(rows), "has_more": cursor + len(rows) < len(self.rows),
            "logs": logs, "log_cursor": log_cursor + len(logs),
            "events": self.events[event_cursor:], "event_cursor": len(self.events),
        }

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
