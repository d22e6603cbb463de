"""``run.on_row(callback)``: a notebook function called with each metric row as it arrives — a policy written
in the notebook (lower the learning rate on a plateau, an automated tuner) that may call ``run.adjust``,
``pause``, ``rewind``, ``send`` or ``stop``.

Rows are handed over, in order, by whichever thread fetches them for this run: the dashboard's
following thread when a view follows it, else a thread of the rule's own that long-polls as a
dashboard would (and does nothing while a view follows). A row the run's history already knows a rewind
superseded (a rank's row from before it went back, arriving late) is not handed over: a rule acts on the branch
the run goes on with (:mod:`.run_history` decides, as for ``run.metrics_frame()``). A callback that raises is
shown once, with its traceback, and detached; the run is never touched by it. ``run.on_row(None)`` detaches.
"""

from __future__ import annotations

import math
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

from nbtrain._client.run.following import LONG_POLL_S
from nbtrain._client.run.reader import RunReader
from nbtrain._cluster.storage.history_rules import branches_of
from nbtrain._exceptions import InvalidOptionError
from nbtrain._states import RunState

LOST_CONTACT_TRIES = 120


class RowRule:
    """The ``on_row`` callback of one :class:`~nbtrain.Run`, and the thread that follows for it when no view does."""

    def __init__(self, reader: RunReader) -> None:
        self.reader = reader
        self.callback: Callable[[dict[str, Any]], Any] | None = None
        self.error: str | None = None       # what the last callback raised, as shown
        self._cursor = 0
        self._lock = threading.RLock()      # one delivery at a time; a callback's own reads do not deliver
        self._delivering = False
        self._thread: threading.Thread | None = None
        reader.row_listener = self.deliver

    def set(self, callback: Callable[[dict[str, Any]], Any] | None) -> None:
        if callback is not None and not callable(callback):
            raise InvalidOptionError(f"run.on_row(callback): give a function of one row (a dict), or None to detach; "
                                     f"got {callback!r}.")
        with self._lock:
            self.callback, self.error = callback, None
            self._cursor = self.reader.rows_fetched  # rows from now on
        if callback is not None and (self._thread is None or not self._thread.is_alive()):
            self._thread = threading.Thread(target=self._follow, name=f"nbtrain-on-row-{self.reader.channel.name}",
                                            daemon=True)
            self._thread.start()

    def deliver(self) -> None:
        """New rows were fetched (on the fetching thread): each row not yet handed over goes to the callback."""
        with self._lock:
            if self.callback is None or self._delivering:
                return
            self._delivering = True
            try:
                rows = self.reader.rows_since(self._cursor)
                self._cursor = max(self._cursor, self.reader.row_window_start) + len(rows)
                branches = branches_of(self.reader.summary)
                for row in rows:
                    if any(branch.holds(row["rank"], row["step"], row.get("time", math.inf)) for branch in branches):
                        continue
                    callback = self._callback()
                    if callback is None:  # the callback detached itself
                        return
                    try:
                        callback(dict(row))
                    except Exception as exc:  # noqa: BLE001 - the user's rule: shown once, detached, the run untouched
                        self._detach_after(callback, exc)
                        return
            finally:
                self._delivering = False

    def _callback(self) -> Callable[[dict[str, Any]], Any] | None:
        return self.callback

    def _detach_after(self, callback: Callable[..., Any], exc: BaseException) -> None:
        self.callback = None
        name = getattr(callback, "__qualname__", repr(callback))
        self.error = (f"run.on_row: {name} raised {type(exc).__name__}: {exc}. It was detached; the run goes on. "
                      f"Fix it and call run.on_row({name}) again.")
        print("".join(traceback.format_exception(exc)) + self.error, file=sys.stderr, flush=True)

    def _follow(self) -> None:
        """Fetch rows while the callback is set and no view follows the run; end with the run or the callback."""
        failures = 0
        while self.callback is not None:
            try:
                if self.reader.followed:
                    threading.Event().wait(LONG_POLL_S)  # the view's thread fetches (and delivers)
                else:
                    self.reader.refresh(wait_s=LONG_POLL_S)
                failures = 0
            except Exception:  # noqa: BLE001 - lost contact: try again, as a dashboard does
                failures += 1
                if failures > LOST_CONTACT_TRIES:
                    return
                threading.Event().wait(1.0)
                continue
            self.deliver()
            if RunState(self.reader.summary.get("state", RunState.PENDING)).is_terminal and self.reader.caught_up:
                return
