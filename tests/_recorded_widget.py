"""The chart widget and the run dashboard's widget with their custom messages kept instead of sent to a front end
(what the kernel would send), for the unit tests of the views that draw with them; and a run that records what
the dashboard's controls call."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from nbtrain._views.dashboard.charts_widget import ChartsWidget
from nbtrain._views.dashboard.dashboard_widget import DashboardWidget


class RecordedCharts(ChartsWidget):
    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[dict[str, Any], list[bytes]]] = []

    def send(self, content: Any, buffers: Any = None) -> None:
        self.sent.append((content, list(buffers or [])))


class RecordedDashboard(DashboardWidget):
    """The run dashboard's widget, its custom messages (points, logs) kept in ``sent`` instead of sent."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[dict[str, Any], list[bytes]]] = []

    def send(self, content: Any, buffers: Any = None) -> None:
        self.sent.append((content, list(buffers or [])))

    def from_page(self, message: dict[str, Any]) -> None:
        """``message`` as the page sends it: a comm message of anywidget's "custom" method, handled the way the
        kernel handles any widget message (and a blocked cell's, :mod:`nbtrain._client.kernel.widget_messages`)."""
        self._handle_msg({"content": {"data": {"method": "custom", "content": message}}, "buffers": []})


class RecordingRun:
    """A run the dashboard reads and steers, with no cluster: its reader is itself; each control's call is recorded
    in ``calls`` as (name, arguments) and answers as ``answers`` says (an exception is raised)."""

    def __init__(self, name: str = "recorded", **summary: Any) -> None:
        self.name = name
        self.reader = self
        self.rows: list[dict[str, Any]] = []
        self.row_window_start = 0
        self.caught_up = True
        self.events: list[dict[str, Any]] = []
        self.logs: list[dict[str, Any]] = []
        self.summary: dict[str, Any] = {"state": "running", "step": 10, "world_size": 2, "attempt": 1,
                                        "started": 100.0, "now": 110.0, "workers": [],
                                        "hyper": {"lr": [0.1], "momentum": [0.9]}, "restore_points": [10],
                                        **summary}
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.answers: dict[str, Any] = {"adjust": 12, "pause": 11, "checkpoint_now": 11, "rewind": 13}

    # what the dashboard reads
    def refresh(self, wait_s: float = 0.0) -> list[dict[str, Any]]:
        return []

    def rows_since(self, start: int = 0) -> list[dict[str, Any]]:
        return self.rows[max(start - self.row_window_start, 0):]

    def logs_since(self, start: int = 0) -> list[dict[str, Any]]:
        return self.logs[start:]

    # what its controls call
    def _called(self, name: str, **arguments: Any) -> Any:
        self.calls.append((name, arguments))
        answer = self.answers.get(name)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def adjust(self, **settings: Any) -> Any:
        return self._called("adjust", **settings)

    def pause(self) -> Any:
        return self._called("pause")

    def resume(self) -> Any:
        return self._called("resume")

    def checkpoint_now(self) -> Any:
        return self._called("checkpoint_now")

    def rewind(self, step: int | None = None, skip_batches: int = 0) -> Any:
        return self._called("rewind", step=step, skip_batches=skip_batches)

    def stop(self) -> Any:
        return self._called("stop")

    def stacks(self) -> Any:
        self._called("stacks")
        return SimpleNamespace(html=lambda compact: f"<pre>stacks compact={compact}</pre>")

    def profile(self, steps: int) -> Any:
        self._called("profile", steps=steps)
        return SimpleNamespace(html=lambda top: f"<table>top {top}</table>")
