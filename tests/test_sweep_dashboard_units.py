"""The sweep dashboard's pictures and table, drawn from a sweep's table as the supervisor answers it: the trials'
chart (the charts widget's traces live, the static SVG of the same chart), the scatters, the header and table."""

from __future__ import annotations

import base64
import json
import re
from types import SimpleNamespace

import numpy as np
import pytest

from nbtrain._views.dashboard.chart import FADED_OPACITY
from nbtrain._views.dashboard.charts_widget import ChartsWidget
from nbtrain._views.dashboard.static_plot import svg_chart
from nbtrain._views.sweep_dashboard import (
    MAX_TRIALS_DRAWN,
    SweepDashboard,
    header_html,
    rungs,
    scatter_svg,
    table_html,
    trials_chart,
)

from _recorded_widget import RecordedCharts

pytestmark = pytest.mark.quick


def _trial(index, state, q, curve, **extra):
    best = min((y for _, y in curve), default=None)
    return {"index": index, "id": f"x_{index:05d}", "run": f"s-t{index}", "config": {"lr": q, "opt": "sgd"},
            "state": state, "iterations": len(curve), "last": curve[-1][1] if curve else None, "best": best,
            "curve": curve, "stop_reason": None, "error": None, "waiting_for": None, **extra}


ANSWER = {
    "name": "s", "state": "running", "error": None, "metric": "loss", "mode": "min", "time_attr": "training_iteration",
    "scheduler": "asha", "knobs": {"max_t": 8, "grace_period": 1, "reduction_factor": 2},
    "space": {"lr": "loguniform(0.0001, 0.1)", "opt": "choice ['sgd', 'adam']"},
    "trials": [
        _trial(0, "running", 0.001, [(1, 1.0), (2, 0.6), (3, 0.4)]),
        _trial(1, "stopped", 0.1, [(1, 2.0), (2, 1.8)], stop_reason="stopped by ASHA at rung 1 (training_iteration 2)"),
        _trial(2, "failed", 0.01, [(1, 1.5)], error="Rank 1 raised ValueError at step 1: boom"),
        _trial(3, "pending", 0.05, [], waiting_for="2 CPU"),
    ],
}


def test_every_trial_is_a_trace_and_stopped_or_failed_ones_are_faded():
    chart = trials_chart(ANSWER)
    looks = {trace.name: trace.look() for trace in chart.traces}
    assert list(looks) == ["trial 0", "trial 1", "trial 2"], "the pending trial has no curve yet"
    assert "opacity" not in looks["trial 0"]
    assert looks["trial 1"]["opacity"] == looks["trial 2"]["opacity"] == FADED_OPACITY
    assert looks["trial 2"].get("dash") and not looks["trial 1"].get("dash"), "a failed trial is dashed"
    assert [looks[name]["color"] for name in looks] == ["#1f77b4", "#ff7f0e", "#2ca02c"]
    assert chart.title == "loss per training_iteration, every trial" and chart.xlabel == "training_iteration"
    trial_0 = chart.traces[0]
    assert list(trial_0.xs) == [1, 2, 3] and list(trial_0.ys) == [1.0, 0.6, 0.4]


def test_the_static_picture_draws_the_same_chart():
    svg = svg_chart(trials_chart(ANSWER))
    lines = dict(re.findall(r'<path class="nbtrain-trace" data-name="trial (\d+)" fill="none" stroke="[^"]+" '
                            r'stroke-width="2" stroke-opacity="([\d.]+)"', svg))
    assert lines == {"0": "1", "1": str(FADED_OPACITY)}
    assert re.search(r'<circle class="nbtrain-lone" data-name="trial 2"[^>]*fill-opacity="0.25"', svg), \
        "a trial of one report is a dot"
    assert svg.count('<g class="nbtrain-legend">') == 3


def test_the_live_view_sends_each_trials_points_to_the_charts_widget_and_keeps_a_small_snapshot_when_it_ends():
    widget = RecordedCharts()
    widget.draw(trials_chart(ANSWER))
    [(message, buffers)] = widget.sent
    assert [part["trace"] for part in message["parts"]] == ["trial 0", "trial 1", "trial 2"]
    assert list(np.frombuffer(buffers[0])) == [1.0, 2.0, 3.0]
    assert [trace["name"] for trace in widget.spec("trials")["traces"]] == ["trial 0", "trial 1", "trial 2"]

    grown = {**ANSWER, "trials": [{**ANSWER["trials"][0], "curve": [(1, 1.0), (2, 0.6), (3, 0.4), (4, 0.3)]},
                                  *ANSWER["trials"][1:]]}
    widget.draw(trials_chart(grown))
    assert widget.sent[-1][0]["parts"] == [{"chart": "trials", "trace": "trial 0", "mode": "append"}]

    many = {**ANSWER, "trials": [_trial(i, "succeeded" if i % 3 else "stopped", 0.01,
                                        [(s, i + 1.0 / s) for s in range(1, 2001)]) for i in range(120)]}
    widget.draw(trials_chart(many))
    widget.freeze()
    assert len(widget.spec("trials")["traces"]) == MAX_TRIALS_DRAWN
    assert len(widget.snapshot) <= 48_000 and len(str(widget.charts)) < 12_000, "a finished sweep saves little"
    saved = json.dumps(widget.get_state(), default=lambda buffer: base64.b64encode(bytes(buffer)).decode())
    assert len(saved) < 100_000, "the charts widget's state in a saved notebook (its code, the charts, the snapshot)"
    assert "50 of 120 trials" in widget.spec("trials")["title"]
    assert "trial 0" in widget.trace_names("trials") and "trial 119" not in widget.trace_names("trials"), \
        "the best trials are drawn"
    assert len(svg_chart(trials_chart(many))) < 60_000, "the static picture of a big sweep stays small"


def test_the_sweep_dashboard_draws_its_trials_in_the_charts_widget():
    sweep = SimpleNamespace(name="s", trials=[], cached=ANSWER)
    dashboard = SweepDashboard(sweep)
    dashboard.draw(ANSWER)
    assert isinstance(dashboard.curves, ChartsWidget)
    assert dashboard.curves.trace_names("trials") == ["trial 0", "trial 1", "trial 2"]
    assert [mark["text"] for mark in dashboard.curves.spec("trials")["marks"]] == ["rung 0", "rung 1", "rung 2",
                                                                                   "rung 3"]
    assert "<svg" in dashboard.scatters.value and "Sweep <b>s</b>" not in dashboard.scatters.value


def test_asha_rungs_are_marks_where_the_curves_reach():
    assert [(mark.step, mark.kind, mark.label) for mark in rungs(ANSWER)] == [
        (1.0, "rung", "rung 0"), (2.0, "rung", "rung 1"), (4.0, "rung", "rung 2"), (8.0, "rung", "rung 3")]
    svg = svg_chart(trials_chart(ANSWER))
    assert svg.count('data-kind="rung"') == 2  # 1 and 2: the curves end at 3, before rung 2 at 4
    assert rungs({**ANSWER, "scheduler": "fifo"}) == []


def test_each_hyperparameter_is_drawn_against_the_best_metric():
    numeric = scatter_svg(ANSWER, "lr")
    assert numeric.count("<circle") == 3 and "(log)" in numeric  # 0.001..0.1 spans 100 times: log scale
    categorical = scatter_svg(ANSWER, "opt")
    assert categorical.count("<circle") == 3 and ">sgd<" in categorical


def test_header_and_table_say_what_each_trial_is_doing():
    header = header_html(ANSWER)
    assert "1 pending, 1 running, 1 stopped, 1 failed" in header
    assert "best loss 0.4 (trial 0)" in header  # the failed trial's values are not a result
    assert "pending trials need 2 CPU" in header
    table = table_html(ANSWER)
    assert "stopped by ASHA at rung 1 (training_iteration 2)" in table
    assert "Rank 1 raised ValueError at step 1: boom" in table
    assert "pending: needs 2 CPU" in table
    assert table.count('class="trial-row') == 4


def test_no_reports_yet_is_said_not_drawn_empty():
    empty = {**ANSWER, "trials": [_trial(0, "pending", 0.1, [])]}
    assert "no reports yet" in svg_chart(trials_chart(empty))
    assert "no results yet" in scatter_svg(empty, "lr")


def test_an_ended_sweep_leaves_its_final_picture_in_the_widget_and_the_same_chart_as_its_fallback():
    ended = {**ANSWER, "state": "succeeded", "trials": [{**t, "state": "succeeded" if t["state"] == "running"
                                                         else t["state"]} for t in ANSWER["trials"]]}
    sweep = SimpleNamespace(name="s", trials=[], cached=ended, refresh=lambda wait_s=0: ended)
    dashboard = SweepDashboard(sweep)
    left: list[str] = []
    dashboard._static = SimpleNamespace(update=lambda shown: left.append(shown.data))

    dashboard.follow()

    assert [name for _chart, name, _n in dashboard.curves.snapshot_index] == ["trial 0", "trial 1", "trial 2"]
    assert 0 < len(dashboard.curves.snapshot) <= 48_000
    [fallback] = left
    assert 'class="nbtrain-static-chart nbtrain-chart-trials"' in fallback and 'data-name="trial 1"' in fallback
