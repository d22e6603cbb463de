"""A sweep trial's curve as the sweep's table gives it (``nbtrain/_cluster/sweep/trial_curve.py``): Tune's points
of the metric, left out where the trial's run went back over them (a restart resumed from a checkpoint, a rewind
in place), by the run history's own rules. End to end (a real trial restarting): ``test_tune_sweeps.py``."""

from __future__ import annotations

import re

import pytest

from nbtrain._cluster.sweep.trial_curve import TrialCurve
from nbtrain._views.dashboard.static_plot import svg_chart
from nbtrain._views.sweep_dashboard import trials_chart

pytestmark = pytest.mark.quick


def row(step: int, attempt: int = 1, run: str = "s-t0", time: float | None = None) -> dict:
    return {"run": run, "attempt": attempt, "step": step, "time": float(step) if time is None else time}


def rewind(to_step: int, rank_0_went_back_at: float | None) -> dict:
    """As the run's summary lists it (JSON: a rank's time keyed by text); None: under way, rank 0 not back yet."""
    times = {} if rank_0_went_back_at is None else {"0": rank_0_went_back_at}
    return {"kind": "rewind", "applied_step": 9, "args": {"to_step": to_step, "skip": 0, "attempt": 1},
            "rank_times": times, "description": f"rewound to step {to_step}"}


def test_the_rows_a_restart_replaced_leave_the_curve_and_its_best_and_last():
    curve = TrialCurve()
    for step in range(8):  # attempt 1: steps 0..7, Tune's iterations 1..8; its steps 4..7 were lucky
        curve.add(step + 1, 0.01 if step >= 4 else 1.0 / (step + 1), row(step))
    for step in range(4, 8):  # attempt 2 resumed from the step-3 checkpoint: Tune's iterations 9..12
        curve.add(step + 5, 1.0 / (step + 1), row(step, attempt=2, time=100.0 + step))
    assert [x for x, _y in curve.points()] == [1, 2, 3, 4, 9, 10, 11, 12], "Tune's iterations stay the x axis"
    assert curve.best("min") == pytest.approx(1 / 8), "the replaced rows' 0.01 no longer counts"
    assert curve.last() == pytest.approx(1 / 8)


def test_the_rows_a_rewind_in_place_superseded_leave_the_curve_once_its_record_says_when_rank_0_went_back():
    curve = TrialCurve()
    for step in range(10):
        curve.add(step + 1, float(step), row(step))
    curve.note_rewinds("s-t0", [rewind(4, None)])
    assert len(curve.points()) == 10, "under way: rank 0 has not gone back, nothing is superseded yet"
    curve.note_rewinds("s-t0", [rewind(4, 9.5)])
    curve.add(11, 5.0, row(5, time=10.0))
    assert curve.points() == [(1, 0.0), (2, 1.0), (3, 2.0), (4, 3.0), (5, 4.0), (11, 5.0)]
    assert curve.best("max") == 5.0


def test_each_run_of_a_trial_is_judged_alone_and_a_result_without_its_row_counts():
    curve = TrialCurve()
    for step in range(5):
        curve.add(step + 1, float(step), row(step))
    # PBT's exploit: a new run from another trial's step-2 checkpoint; its rows replace nothing of the first run
    for step in range(3, 5):
        curve.add(step + 3, float(step), row(step, run="s-t0-i5", time=50.0 + step))
    curve.add(8, 4.0, None)  # a trial restored at the end of training repeats its last result: no row of its own
    assert [x for x, _y in curve.points()] == [1, 2, 3, 4, 5, 6, 7, 8]


def test_the_sweep_chart_breaks_a_trials_line_where_a_restart_left_iterations_out():
    curve = TrialCurve()
    for step in range(8):
        curve.add(step + 1, 1.0 / (step + 1), row(step))
    for step in range(4, 8):
        curve.add(step + 5, 1.0 / (step + 1), row(step, attempt=2, time=100.0 + step))
    answer = {"metric": "loss", "mode": "min", "time_attr": "training_iteration", "trials": [
        {"index": 0, "state": "running", "best": curve.best("min"), "curve": curve.points(),
         "breaks": curve.breaks()}]}
    [trace] = trials_chart(answer).traces
    assert list(trace.xs) == [1, 2, 3, 4, 9, 10, 11, 12]
    assert list(trace.breaks) == [6.5], "no line drawn across the replaced iterations"
    [path] = re.findall(r'class="nbtrain-trace" data-name="trial 0"[^>]* d="([^"]+)"', svg_chart(trials_chart(answer)))
    assert path.count("M") == 2, f"the saved picture leaves the line open there too: {path}"
