"""Following a run from the notebook: one long poll per flush tick, from a daemon thread or the caller's.

Rows reach the kernel one tick after they were reported (``FOLLOW_POLL_S``, the
default ``flush_interval_s``); what a view draws with them is coalesced apart
from that (``REDRAW_INTERVAL_S``). :class:`TextProgress` is the view outside a
notebook: one line every couple of seconds, and a summary at the end.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from typing import Any

from nbtrain._client.run.following import LONG_POLL_S
from nbtrain._options import default_of
from nbtrain._states import RunState
from nbtrain._views.dashboard.history import MetricHistory, take_new_rows
from nbtrain._views.dashboard.summary_text import elapsed, fmt_duration, progress_fraction, state_label
from nbtrain._views.dashboard.workers_view import stragglers

REDRAW_INTERVAL_S = 0.25
FOLLOW_POLL_S: float = default_of("flush_interval_s")  # one long poll per default flush tick
STRAGGLERS_LISTED = 8        # in the header; the rest are counted


class Follower:
    """Runs ``update`` until the run ends or :meth:`close` is called, from the caller's thread or a daemon
    thread."""

    run: Any
    thread: threading.Thread
    _closed: threading.Event | None = None

    def close(self) -> None:
        """Stop following: the thread ends within one long poll (``LONG_POLL_S``); what is drawn stays."""
        if self._closed is None:
            self._closed = threading.Event()
        self._closed.set()

    @property
    def closed(self) -> bool:
        return self._closed is not None and self._closed.is_set()

    def update(self, wait_s: float = 0.0, coalesce: bool = False) -> bool:
        """Fetch and draw; True once the run is terminal and drawn. ``coalesce``: a draw may wait
        for the next call if one was made less than ``REDRAW_INTERVAL_S`` ago."""
        raise NotImplementedError

    def draw_due_in(self) -> float | None:
        """Seconds until a redraw held back by the throttle is due; None when nothing waits to be drawn."""
        return None

    def _tick(self) -> bool:
        """One long-poll update (shorter when a held-back redraw falls due sooner), then a pause so
        polls stay at one per flush tick."""
        began = time.monotonic()
        due = self.draw_due_in()
        done = self.update(wait_s=LONG_POLL_S if due is None else max(due, 0.0), coalesce=True)
        if not done and self._closed is not None:
            self._closed.wait(max(0.0, FOLLOW_POLL_S - (time.monotonic() - began)))
        elif not done:
            time.sleep(max(0.0, FOLLOW_POLL_S - (time.monotonic() - began)))
        return done

    def follow_in_background(self) -> threading.Thread:
        from nbtrain._views.dashboard.front_end import background_thread

        self.thread = background_thread(self._follow_quietly, f"nbtrain-dashboard-{self.run.name}")
        self.thread.start()
        return self.thread

    def _follow_quietly(self) -> None:
        failures = 0
        while not self.closed:
            try:
                if self._tick():
                    return
                failures = 0
            except Exception as exc:  # noqa: BLE001 - a lost connection must not kill the view
                failures += 1
                self.note_problem(f"Lost contact with the run ({exc}); retrying…")
                if failures > 120:
                    return
                time.sleep(1.0)

    def note_problem(self, message: str, colour: str = "#d62728") -> None:
        pass


class TextProgress(Follower):
    """Outside a notebook: one line every couple of seconds (in a terminal, the same line rewritten), and a
    summary at the end."""

    def __init__(self, run: Any, stream: Any = None, interval: float = 2.0) -> None:
        self.run = run
        self.stream = stream or sys.stdout
        self.interval = interval
        self.history = MetricHistory()
        self._last_print = 0.0
        self._width = 0  # of the line shown in a terminal, to blank its rest when a shorter one replaces it

    def display(self) -> None:
        pass

    def line(self, summary: dict[str, Any]) -> str:
        fraction = progress_fraction(summary)
        share = f" {fraction:4.0%}" if fraction is not None else ""
        metrics = " ".join(f"{k}={v:.4g}" for k, v in sorted(self.history.latest.items())[:4])
        late = stragglers(summary.get("workers") or [])
        behind = (" stragglers " + ",".join(map(str, late[:STRAGGLERS_LISTED]))
                  + ("…" if len(late) > STRAGGLERS_LISTED else "")) if late else ""
        return (f"[nbtrain] {self.run.name} {state_label(summary)}{share} step {summary.get('step', 0)} "
                f"{len(summary.get('workers') or [])} workers{behind} "
                f"{fmt_duration(elapsed(summary))} {metrics}").rstrip()

    def _say(self, line: str, last: bool) -> None:
        """In a terminal, one line rewritten in place (the last one stays); in a log or a pipe, a line each time."""
        if not getattr(self.stream, "isatty", lambda: False)():
            print(line, file=self.stream, flush=True)
            return
        width = shutil.get_terminal_size().columns - 1
        shown = line if len(line) <= width else line[:width - 1] + "…"
        print("\r" + shown.ljust(self._width), end="\n" if last else "", file=self.stream, flush=True)
        self._width = len(shown)

    def update(self, wait_s: float = 0.0, coalesce: bool = False) -> bool:  # prints every `interval` anyway
        self.run.reader.refresh(wait_s=wait_s)
        take_new_rows(self.run, self.history)
        summary = self.run.reader.summary
        # the final line has the last rows
        terminal = RunState(summary["state"]).is_terminal and self.run.reader.caught_up
        now = time.monotonic()
        if terminal or now - self._last_print >= self.interval:
            self._last_print = now
            self._say(self.line(summary), terminal)
        if terminal and summary.get("error"):
            print(summary["error"], file=self.stream, flush=True)
        return terminal
