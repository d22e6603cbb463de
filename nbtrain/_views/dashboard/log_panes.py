"""The dashboard's per-rank log panes: each rank's output in a collapsed pane of its own (never the cell's
output), a failing rank's traceback added to its pane even when the rank printed none, and the first failing
rank's pane opened once. The text travels as increments (:meth:`DashboardWidget.add_logs`), each pane capped at
its last ``LOG_PANE_CHARS``."""

from __future__ import annotations

from typing import Any

from nbtrain._views.dashboard.dashboard_widget import DashboardWidget


class LogPanes:
    """Reads the run's new log entries and failures at each redraw and hands the widget what is new."""

    def __init__(self, widget: DashboardWidget) -> None:
        self.widget = widget
        self._cursor = 0
        self._tracebacks_shown: set[tuple[int, str]] = set()  # (rank, traceback) already in its pane
        self.failing: set[int] = set()

    def draw(self, reader: Any, summary: dict[str, Any]) -> None:
        entries = reader.logs_since(self._cursor)
        self._cursor += len(entries)
        new: dict[int, str] = {}
        for entry in entries:
            new[entry["rank"]] = new.get(entry["rank"], "") + entry["text"]
        failures = summary.get("failures") or []
        self.failing = {f["rank"] for f in failures if f.get("rank") is not None
                        and f.get("attempt") == summary.get("attempt") and not f.get("secondary")}
        for failure in failures:
            rank, traceback = failure.get("rank"), failure.get("traceback")
            if rank is None or not traceback or (rank, traceback) in self._tracebacks_shown:
                continue
            self._tracebacks_shown.add((rank, traceback))
            if traceback not in self.widget.log_text(rank) + new.get(rank, ""):
                new[rank] = new.get(rank, "") + "\n" + traceback
        self.widget.add_logs({**{rank: "" for rank in self.failing}, **new})
        first = min(self.failing, default=None)
        self.widget.log_panes = [{"rank": rank, "title": f"rank {rank} log" + (" — failed" if rank in self.failing
                                                                                 else ""),
                                  "failed": rank in self.failing, "open": rank == first}
                                 for rank in sorted(self.widget.logged_ranks())]
