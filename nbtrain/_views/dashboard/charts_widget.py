"""The live renderer of every chart nbtrain draws, as a widget of our own (anywidget): a run's curves and step
times (the dashboard), every trial of a sweep (the sweep dashboard), the runs of a comparison (``compare()``).
Each is a :class:`~nbtrain._views.dashboard.chart.Chart`, the description the static SVG
(:mod:`~nbtrain._views.dashboard.static_plot`) draws too.

Why not plotly's FigureWidget: its saved widget state carries all of plotly.js (5 MB per figure), so every
notebook saved with widget state (nbclient, papermill, VS Code) grew by megabytes per dashboard. This
widget's front end is ``static/charts.js`` (~15 KB, hand-written SVG, nothing fetched at run time), joined with
its entry ``static/charts_view.js`` into one ES module (:func:`front_end`); the run dashboard's widget
(:mod:`.dashboard_widget`) joins the same ``charts.js`` with its own entry, so every live chart has one renderer.

What crosses to the browser: each chart's description (names, looks, where lines break, marks) as a synced list,
and the points as increments in binary buffers (custom messages): a trace whose drawn points only grew sends the
new tail, one whose older points were thinned (a long history's downsampling) is sent whole, at most
``MAX_POINTS`` points. A view that opens later (a page reload, the same output drawn again) says "hello" and
is sent everything. When what it shows has ended, :meth:`ChartsWidget.freeze` keeps the final picture in the
model's ``snapshot`` (float32, at most ``SNAPSHOT_BYTES`` for up to ``SNAPSHOT_BYTES / 8 / SNAPSHOT_FEWEST``
traces), the only points a saved notebook stores.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anywidget
import numpy as np
import traitlets

from nbtrain._views.dashboard.chart import Chart
from nbtrain._views.dashboard.downsample import downsample
from nbtrain._views.dashboard.mark_styles import widget_marks

STATIC = Path(__file__).parent / "static"
SNAPSHOT_BYTES = 48_000    # the final picture's points in a saved notebook, all traces together (float32 x, y)
SNAPSHOT_FEWEST = 16       # per trace, however many traces share the budget (a sweep draws at most 50)


def front_end(*pieces: str) -> str:
    """The files ``pieces`` of ``static/`` joined into one text: an anywidget's ES module (or its CSS) is one
    text, and cannot import a sibling file at run time. Joined here, at import, rather than by a Node build: the
    wheel needs no build step, and the files under test (``tests/js``) are the ones shipped."""
    return "\n".join((STATIC / piece).read_text(encoding="utf-8") for piece in pieces)


class ChartsWidget(anywidget.AnyWidget):
    """Charts drawn in the browser by ``static/charts.js``; :meth:`draw` sends what changed."""

    _esm = front_end("charts.js", "charts_view.js")
    _css = front_end("charts.css")
    # [{id, title, kind, traces: [{name, color, ...}], marks}]
    charts: traitlets.List[Any] = traitlets.List().tag(sync=True)
    snapshot = traitlets.Bytes(b"").tag(sync=True)  # the final points, float32 x then y per trace
    # [[chart id, trace name, points], ...], in the order of `snapshot`
    snapshot_index: traitlets.List[Any] = traitlets.List().tag(sync=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._specs: dict[str, dict[str, Any]] = {}
        self._points: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}  # what the views hold
        self.on_msg(self._on_view_message)

    # ------------------------------------------------------------------ what the kernel draws
    def draw(self, chart: Chart) -> None:
        """Line chart ``chart``: its traces' points (each as thinned as its caller made it), looks and marks."""
        spec = {"id": chart.id, "title": chart.title, "kind": "lines", "marks": widget_marks(chart.marks),
                "xlabel": chart.xlabel, "traces": [trace.look() for trace in chart.traces]}
        held = self._points.setdefault(chart.id, {})
        wanted = {trace.name for trace in chart.traces}
        for name in [name for name in held if name not in wanted]:
            del held[name]
        self._set_spec(chart.id, spec)
        parts, buffers = [], []
        for trace in chart.traces:
            x, y = np.asarray(trace.xs, dtype=np.float64), np.asarray(trace.ys, dtype=np.float64)
            old = held.get(trace.name)
            if old is not None and len(old[0]) == len(x) and np.array_equal(old[0], x) \
                    and np.array_equal(old[1], y, equal_nan=True):
                continue
            grew = old is not None and len(old[0]) < len(x) and np.array_equal(old[0], x[:len(old[0])]) \
                and np.array_equal(old[1], y[:len(old[1])], equal_nan=True)
            start = len(old[0]) if grew and old is not None else 0
            parts.append({"chart": chart.id, "trace": trace.name, "mode": "append" if grew else "replace"})
            buffers += [x[start:].tobytes(), y[start:].tobytes()]
            held[trace.name] = (x.copy(), y.copy())
        if parts:
            self.send({"kind": "points", "parts": parts}, buffers=buffers)

    def bars(self, chart: str, title: str, categories: list[str], parts: list[tuple[str, str, list[float]]]) -> None:
        """Stacked bar chart ``chart``: one bar per category, ``parts`` (name, colour, values) stacked."""
        self._set_spec(chart, {"id": chart, "title": title, "kind": "bars", "categories": categories,
                               "traces": [{"name": name, "color": colour, "values": values}
                                          for name, colour, values in parts]})

    def freeze(self) -> None:
        """Keep the picture as it stands in the model itself, thinned to ``SNAPSHOT_BYTES``: what a notebook
        saved with widget state draws with no kernel behind it (where each line breaks is in the charts'
        descriptions, so a thinned snapshot still breaks where the reports had a gap)."""
        traces = [(chart, name, xs, ys) for chart, held in self._points.items() for name, (xs, ys) in held.items()]
        each = max(SNAPSHOT_FEWEST, SNAPSHOT_BYTES // (8 * max(1, len(traces))))
        index, arrays = [], []
        for chart, name, xs, ys in traces:
            x, y = downsample(xs, ys, each)
            index.append([chart, name, len(x)])
            arrays += [np.asarray(x, dtype=np.float32), np.asarray(y, dtype=np.float32)]
        self.snapshot = np.concatenate(arrays).tobytes() if arrays else b""
        self.snapshot_index = index

    # ------------------------------------------------------------------ what tests and the benchmark read
    def titles(self) -> list[str]:
        return [spec["title"] for spec in self.charts]

    def trace_names(self, chart: str) -> list[str]:
        return [trace["name"] for trace in self._specs.get(chart, {}).get("traces", [])]

    def points(self, chart: str, trace: str) -> tuple[np.ndarray, np.ndarray]:
        """The points the views of ``chart``'s ``trace`` hold now."""
        return self._points[chart][trace]

    def spec(self, chart: str) -> dict[str, Any]:
        return self._specs[chart]

    # ------------------------------------------------------------------ internals
    def _set_spec(self, chart: str, spec: dict[str, Any]) -> None:
        if self._specs.get(chart) == spec:
            return
        self._specs[chart] = spec
        self.charts = list(self._specs.values())

    def _on_view_message(self, _widget: Any, content: Any, _buffers: Any) -> None:
        if isinstance(content, dict) and content.get("kind") == "hello":
            self.hello()

    def hello(self) -> None:
        """A view that opened late (a page reload, the same output drawn again): every trace, whole."""
        parts, buffers = [], []
        for chart, held in self._points.items():
            for name, (xs, ys) in held.items():
                parts.append({"chart": chart, "trace": name, "mode": "replace"})
                buffers += [xs.tobytes(), ys.tobytes()]
        if parts:
            self.send({"kind": "points", "parts": parts}, buffers=buffers)
