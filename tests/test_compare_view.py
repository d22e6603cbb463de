"""``compare()``'s live view and its static picture, from fake runs (no cluster): the runs become the charts
widget's traces (a thick line each, points for a run reported far more rarely, breaks across a gap in a run's
reports), the fallback is the static SVG of the same chart, and a comparison of ended runs keeps a small snapshot."""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from nbtrain._client.run.run_history import RunHistory
from nbtrain._views.compare import Comparison
from nbtrain._views.dashboard.chart import MEAN_WIDTH
from nbtrain._views.dashboard.charts_widget import SNAPSHOT_BYTES

pytestmark = pytest.mark.quick


def fake_run(name: str, steps: Any, state: str = "succeeded") -> Any:
    rows = [{"rank": r, "step": int(s), "attempt": 1, "time": float(s), "loss": 1.0 / (s + 1)} for s in steps
            for r in (0, 1)]
    summary = {"state": state, "changes": []}
    history = RunHistory.of_rows(summary, [], rows)
    return SimpleNamespace(name=name, config={"lr": 0.1 if name == "a" else 0.01},
                           reader=SimpleNamespace(history=lambda: history), summary=lambda: summary)


def comparison() -> Comparison:
    return Comparison([fake_run("a", range(1, 301)), fake_run("b", [*range(1, 101), *range(200, 301)]),
                       fake_run("c", range(50, 301, 50))], "loss", "step")


def test_each_run_is_a_trace_of_the_charts_widget_a_rare_one_points_a_gap_a_break():
    shown = comparison()
    shown._build()
    spec = shown._charts.spec("compare")
    looks = {trace["name"]: trace for trace in spec["traces"]}
    assert list(looks) == ["a", "b", "c"] and spec["title"] == "loss by step" and spec["xlabel"] == "step"
    assert {look["width"] for look in looks.values()} == {MEAN_WIDTH}
    assert len({look["color"] for look in looks.values()}) == 3
    assert looks["c"].get("points") and not looks["a"].get("points") and not looks["b"].get("points")
    assert looks["b"]["breaks"] == [150.0] and "breaks" not in looks["a"]
    xs, _ys = shown._charts.points("compare", "b")
    assert list(xs) == [*range(1, 101), *range(200, 301)]
    assert "<table" in shown._table.value


def test_the_static_picture_is_the_same_chart_and_ended_runs_leave_a_small_snapshot():
    shown = comparison()
    picture = shown._picture()
    assert picture.startswith('<div class="nbtrain-compare-summary"><svg')
    line_b = re.search(r'<path class="nbtrain-trace" data-name="b" [^>]*d="([^"]+)"', picture)[1]
    assert line_b.count("M") == 2, "a line crossed run b's gap"
    assert re.search(r'<g class="nbtrain-trace nbtrain-points" data-name="c"', picture)
    assert len(picture) < 40_000

    shown._build()
    shown._charts.freeze()
    assert 0 < len(shown._charts.snapshot) <= SNAPSHOT_BYTES
    assert [name for _chart, name, _n in shown._charts.snapshot_index] == ["a", "b", "c"]


def test_runs_without_the_metric_yet_draw_nothing_and_say_so():
    empty = SimpleNamespace(name="new", config={}, summary=lambda: {"state": "running", "changes": []},
                            reader=SimpleNamespace(history=lambda: RunHistory.of_rows({"changes": []}, [], [])))
    shown = Comparison([empty], "loss", "time")
    assert "no reports yet" in shown._picture()
    shown._build()
    assert shown._charts.spec("compare")["xlabel"] == "seconds"
    assert np.size(shown._charts.points("compare", "new")[0]) == 0


def test_a_comparison_of_ended_runs_shown_in_a_notebook_is_one_output_with_its_final_picture_kept(monkeypatch):
    import IPython.display

    shown_outputs: list[Any] = []
    monkeypatch.setattr(IPython.display, "display", lambda output, **_kwargs: shown_outputs.append(output))
    shown = comparison()

    shown._ipython_display_()

    [output] = shown_outputs
    bundle = output._repr_mimebundle_()
    assert set(bundle) == {"application/vnd.jupyter.widget-view+json", "text/html", "text/plain"}
    assert 'data-name="b"' in bundle["text/html"]
    assert [name for _chart, name, _n in shown._charts.snapshot_index] == ["a", "b", "c"], "no snapshot kept"
