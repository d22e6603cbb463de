"""The dashboard's charts widget sends points as increments, and keeps a bounded picture for saved notebooks.

No browser: the widget's messages are recorded where the kernel would hand them to the comm (``send``);
``static/charts.js`` draws them in the browser tests (JupyterLab, Notebook 7, marimo).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from nbtrain._views.dashboard.chart import Chart, Trace
from nbtrain._views.dashboard.charts_widget import SNAPSHOT_BYTES, ChartsWidget
from nbtrain._views.dashboard.dashboard_widget import DashboardWidget

from _recorded_widget import RecordedCharts

pytestmark = pytest.mark.quick


def loss(n: int, start: int = 0) -> Chart:
    xs = np.arange(start, start + n, dtype=float)
    return Chart("loss", "loss", [Trace("loss mean", xs, 1.0 / (xs + 1), "#222222", 3.0)])


def test_a_growing_curve_sends_only_its_new_points():
    widget = RecordedCharts()
    widget.draw(loss(10))
    widget.draw(loss(15))
    widget.draw(loss(15))  # nothing new: nothing sent
    (first, first_buffers), (grown, grown_buffers) = widget.sent
    assert first["parts"] == [{"chart": "loss", "trace": "loss mean", "mode": "replace"}]
    assert [len(b) // 8 for b in first_buffers] == [10, 10]
    assert grown["parts"][0]["mode"] == "append"
    assert list(np.frombuffer(grown_buffers[0])) == [10.0, 11.0, 12.0, 13.0, 14.0]
    assert [spec["title"] for spec in widget.charts] == ["loss"]


def test_thinned_points_are_sent_whole_and_a_new_view_gets_everything():
    widget = RecordedCharts()
    widget.draw(loss(10))
    widget.draw(loss(8, start=4))  # downsampling moved the older points
    assert widget.sent[-1][0]["parts"][0]["mode"] == "replace"
    widget._on_view_message(widget, {"kind": "hello"}, [])
    hello, buffers = widget.sent[-1]
    assert hello["parts"][0]["mode"] == "replace" and len(buffers[0]) == 8 * 8


def test_the_saved_picture_stays_small_however_long_the_run():
    widget = RecordedCharts()
    widget.draw(Chart("loss", "loss", [Trace(f"loss rank {r}", np.arange(2000.0), np.random.rand(2000), "#1f77b4")
                                       for r in range(8)]))
    widget.freeze()
    assert len(widget.snapshot) <= SNAPSHOT_BYTES
    assert sum(n for _chart, _trace, n in widget.snapshot_index) * 8 == len(widget.snapshot)


def test_a_traces_looks_and_breaks_reach_the_front_end_with_its_chart():
    xs = np.array([*range(1, 101), *range(500, 601)], dtype=float)
    widget = RecordedCharts()
    widget.draw(Chart("loss", "loss", [Trace("loss rank 0", xs, xs, "#1f77b4", 1.0, 0.45, breaks=np.array([300.0])),
                                       Trace("epoch_loss mean", xs[::50], xs[::50], "#ff7f0e", 3.0, points=True)]))
    rank, epoch = widget.spec("loss")["traces"]
    assert rank == {"name": "loss rank 0", "color": "#1f77b4", "width": 1.0, "opacity": 0.45, "breaks": [300.0]}
    assert epoch == {"name": "epoch_loss mean", "color": "#ff7f0e", "width": 3.0, "points": True}


@pytest.mark.parametrize("widget", [ChartsWidget, DashboardWidget], ids=["charts", "dashboard"])
def test_each_front_end_is_one_small_module_that_fetches_nothing(widget):
    """A widget's ES module is stored with every saved notebook's widget state: it stays small, and it is one
    text (charts.js joined with the widget's entry), loading nothing from anywhere at run time."""
    code = widget._esm + widget._css
    assert len(code) < (30_000 if widget is ChartsWidget else 50_000), len(code)
    assert "http://" not in code.replace("http://www.w3.org/2000/svg", "") and "https://" not in code
    assert not re.search(r"^\s*import[\s({]", code, re.M) and "import(" not in code
    assert code.count("export default") == 1 and "function mountCharts(" in code
