"""The chart widget with its custom messages kept instead of sent to a front end: what the kernel would send,
for the unit tests of the views that draw with it."""

from __future__ import annotations

from typing import Any

from nbtrain._views.dashboard.charts_widget import ChartsWidget


class RecordedCharts(ChartsWidget):
    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[dict[str, Any], list[bytes]]] = []

    def send(self, content: Any, buffers: Any = None) -> None:
        self.sent.append((content, list(buffers or [])))
