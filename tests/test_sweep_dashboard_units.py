"""The sweep dashboard's pictures and table, drawn from a sweep's table as the supervisor answers it."""

from __future__ import annotations

import re

import pytest

from nbtrain._views.sweep_dashboard import FADED_OPACITY, curves_svg, header_html, rungs, scatter_svg, table_html

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


def test_every_trial_has_its_curve_and_stopped_or_failed_ones_are_faded():
    svg = curves_svg(ANSWER)
    lines = dict(re.findall(r'<polyline class="trial trial-(\w+)" data-trial="(\d+)"', svg))
    assert lines == {"running": "0", "stopped": "1", "failed": "2"}
    assert re.search(r'trial-running".*?stroke-opacity="1"', svg)
    assert re.search(rf'trial-stopped".*?stroke-opacity="{FADED_OPACITY}"', svg)
    assert re.search(r'trial-failed".*?stroke-dasharray', svg)


def test_asha_rungs_are_marked_where_the_curves_reach():
    assert rungs(ANSWER) == [1.0, 2.0, 4.0, 8.0]
    assert curves_svg(ANSWER).count('class="rung"') == 2  # 1 and 2: the curves end at 3, before rung 4
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
    assert "no reports yet" in curves_svg(empty)
    assert "no results yet" in scatter_svg(empty, "lr")
