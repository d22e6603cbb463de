"""``run.figure()``, ``compare(...).figure()``, ``sweep.figure()``: plotly figures of recorded histories, no cluster.

What is drawn (ranks against the mean, counters left out, rarer metrics as points, no line across a gap, the
downsampling bound, branches and marks), what bad input says, and what a saved notebook holds of two figures.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

from nbtrain._client.run.run_history import RunHistory
from nbtrain._exceptions import InvalidOptionError
from nbtrain._views.compare import Comparison, sweep_figure
from nbtrain._views.figures import MAX_POINTS, display_bundle, history_figure

from _recorded_runs import SUMMARY, recorded_run, rewound_rows

pytestmark = pytest.mark.quick


def long_run(steps: int, ranks: int = 2, epoch_every: int = 1000, spike_at: int | None = None) -> RunHistory:
    """``ranks`` ranks of ``steps`` steps: ``loss`` each step, ``epoch`` beside it, ``epoch_loss`` once an epoch."""
    step = np.repeat(np.arange(1, steps + 1), ranks)
    rank = np.tile(np.arange(ranks), steps)
    loss = 1.0 / np.sqrt(step) + 0.01 * rank + 0.01 * np.sin(step * 12.9898)  # noise: every trace fills its bound
    if spike_at is not None:
        loss[(step == spike_at) & (rank == 0)] = 50.0
    frame = pd.DataFrame({"rank": rank, "step": step, "attempt": 1, "time": step * 0.01, "loss": loss,
                          "epoch": (step - 1) // epoch_every,
                          "epoch_loss": np.where(step % epoch_every == 0, loss, np.nan)})
    summary = {"state": "succeeded", "changes": [
        {"kind": "adjust", "applied_step": steps // 2, "args": {"lr": 0.01},
         "description": f"lr 0.1 → 0.01 at step {steps // 2}"},
        {"kind": "patch", "applied_step": steps // 3, "args": {"names": ["scale"]},
         "description": f"patched scale at step {steps // 3}"}]}
    return RunHistory(summary, [], frame, frozenset({"rank", "step", "attempt", "epoch"}))


def traces(figure: Any, metric_row: int) -> dict[str, Any]:
    axis = "y" if metric_row == 1 else f"y{metric_row}"
    return {trace.name: trace for trace in figure.data if trace.yaxis == axis}


def test_a_rank_is_a_thin_translucent_line_and_the_mean_a_thick_dark_one_counters_said_in_the_title():
    figure = history_figure("lr-run", long_run(5000))
    assert isinstance(figure, go.Figure)
    assert [annotation.text for annotation in figure.layout.annotations][:2] == ["epoch_loss", "loss"]
    loss = traces(figure, 2)
    assert set(loss) == {"rank 0", "rank 1", "mean of ranks"}
    assert loss["rank 0"].line.width == 1.0 and loss["rank 0"].opacity < 0.5 and loss["rank 0"].mode == "lines"
    assert loss["mean of ranks"].line.width == 3.0 and loss["mean of ranks"].opacity == 1.0
    assert loss["mean of ranks"].line.color == "#222222" != loss["rank 0"].line.color
    assert "epoch 4" in figure.layout.title.text and "epoch" not in [a.text for a in figure.layout.annotations]
    assert [trace.name for trace in figure.data if trace.showlegend] == ["rank 0", "rank 1", "mean of ranks"]
    assert figure.layout.legend.x > 1, "the legend sits right of the plots, never over a curve"


def test_a_metric_reported_once_an_epoch_is_points_and_no_line_crosses_a_gap_in_the_steps():
    figure = history_figure("rates", long_run(5000))
    epoch_loss = traces(figure, 1)
    assert {trace.mode for trace in epoch_loss.values()} == {"markers"}
    assert len(epoch_loss["mean of ranks"].x) == 5

    rows = [{"rank": 0, "step": s, "attempt": 1, "time": float(s), "loss": 1.0 / s}
            for s in [*range(1, 101), *range(500, 601)]]  # nothing reported from 101 to 499
    [(x, y)] = [(np.asarray(t.x), np.asarray(t.y)) for t in history_figure(
        "gap", RunHistory.of_rows({"changes": []}, [], rows)).data if t.name == "rank 0"]
    gap = np.flatnonzero(np.isnan(y))
    assert len(gap) == 1 and x[gap[0] - 1] == 100 and x[gap[0] + 1] == 500, "a straight line crossed the gap"


def test_every_trace_is_downsampled_to_a_bound_keeping_its_extremes():
    figure = history_figure("long", long_run(500_000, spike_at=123_457), "loss")
    for trace in figure.data:
        assert len(trace.x) <= MAX_POINTS + 10, (trace.name, len(trace.x))
    rank_0 = next(trace for trace in figure.data if trace.name == "rank 0")
    assert np.nanmax(rank_0.y) == 50.0 and rank_0.x[np.nanargmax(rank_0.y)] == 123_457
    assert rank_0.x[0] == 1 and rank_0.x[-1] == 500_000


def test_a_wide_run_is_drawn_as_its_mean_and_band():
    figure = history_figure("wide", long_run(200, ranks=16), "loss")
    assert {trace.name for trace in figure.data} == {"min across ranks", "min–max across ranks", "mean of ranks"}
    assert "16 ranks: mean and min–max band" in figure.layout.title.text


def test_the_branches_a_rewind_left_are_faded_and_the_marks_are_labelled_lines(monkeypatch):
    run = recorded_run(monkeypatch, rewound_rows(), SUMMARY)
    figure = run.figure()
    left = next(trace for trace in figure.data if trace.name == "left by the rewind to step 40")
    assert list(left.x) == list(range(41, 48)) and left.line.dash == "dash" and left.opacity < 1
    mean = next(trace for trace in figure.data if trace.name == "mean of ranks")
    assert list(mean.x) == [*range(1, 41), *range(43, 61)]
    [shape] = figure.layout.shapes
    assert shape.x0 == 40 and shape.yref == "paper"
    assert "rewound to step 40" in [annotation.text for annotation in figure.layout.annotations]

    patched = history_figure("patched", long_run(3000))
    assert sorted(annotation.text for annotation in patched.layout.annotations if "step" not in (
        annotation.text or "")) == ["epoch_loss", "loss", "lr 0.1 → 0.01", "patched scale"]


def test_an_unknown_metric_names_the_ones_the_run_has_and_an_empty_run_says_it_has_no_rows(monkeypatch):
    with pytest.raises(ValueError, match=r"run 'lr-run' has no metric 'acc': it has 'epoch_loss', 'loss' \(and "
                                         r"'epoch', which only count\)"):
        history_figure("lr-run", long_run(100), ["loss", "acc"])
    with pytest.raises(InvalidOptionError, match="a metric's name or a list of them"):
        history_figure("lr-run", long_run(100), [3])
    assert list(traces(history_figure("lr-run", long_run(100), "epoch"), 1)) == ["rank 0", "rank 1",
                                                                                 "mean of ranks"], "named: drawn"

    empty = recorded_run(monkeypatch, [], {"state": "running", "changes": []}).figure("loss")
    assert empty.data == () and empty.layout.title.text == "recorded (running): no rows yet"


def test_a_finished_run_and_a_live_one_read_the_same_history(monkeypatch):
    rows = rewound_rows()
    live = recorded_run(monkeypatch, rows, {**SUMMARY, "state": "running"}).figure()
    ended = recorded_run(monkeypatch, rows, SUMMARY).figure()
    assert [(t.name, list(t.x)) for t in live.data] == [(t.name, list(t.x)) for t in ended.data]
    assert "(running)" in live.layout.title.text and "(succeeded)" in ended.layout.title.text


def test_two_figures_of_a_long_run_saved_in_a_notebook_stay_under_a_megabyte_without_plotly_js():
    history = long_run(50_000)  # 10^5 rows
    bundles = [display_bundle(history_figure("saved", history)), display_bundle(history_figure("saved", history,
                                                                                              "loss"))]
    saved = sum(len(json.dumps(bundle)) for bundle in bundles)
    assert saved < 1_000_000, saved
    for bundle in bundles:
        assert set(bundle) == {"application/vnd.plotly.v1+json", "text/html", "text/plain"}
        html = bundle["text/html"]
        assert 'src="https://cdn.plot.ly/plotly-' in html and len(html) < 400_000, "plotly.js (4 MB) embedded"
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.display import display
    from IPython.utils.capture import capture_output

    InteractiveShell.instance()
    with capture_output() as shown:  # as a cell's value is shown: plotly's own would use its renderers
        display(history_figure("saved", history))
    [output] = shown.outputs
    assert set(output.data) == set(bundles[0]), "a figure shown as a cell's value carries the same bundle"


def fake_run(name: str, rows: list[dict[str, Any]], summary: dict[str, Any]) -> Any:
    history = RunHistory.of_rows(summary, [], rows)
    return SimpleNamespace(name=name, config={}, reader=SimpleNamespace(history=lambda: history),
                           summary=lambda: summary)


def test_a_comparison_is_one_trace_per_run_of_its_current_rows():
    parent = fake_run("parent", rewound_rows(), SUMMARY)
    child = fake_run("child", [{"rank": 0, "step": s, "attempt": 1, "time": float(s), "loss": 0.5}
                               for s in range(1, 11)], {"state": "running", "parent": {"run": "parent", "step": 30}})
    comparison = Comparison([parent, child], "loss", "step")
    curves = comparison.curves()
    assert curves["parent"][0] == [*range(1, 41), *range(43, 61)], "the branch a rewind left is not compared"
    assert curves["child"][0] == list(range(31, 41)), "a fork continues its parent's steps"
    figure = comparison.figure()
    assert [trace.name for trace in figure.data] == ["parent", "child"] and figure.layout.legend.x > 1


def test_the_sweeps_best_trials_are_one_figure():
    def trial(index: int, best: float | None, state: str = "succeeded") -> Any:
        rows = [{"rank": 0, "step": s, "attempt": 1, "time": float(s), "loss": best + 1.0 / s} for s in range(1, 6)] \
            if best is not None else []
        return SimpleNamespace(index=index, best=best, state=state, config={"lr": 0.1 / (index + 1)},
                               run_name=f"sw-t{index}", run=fake_run(f"sw-t{index}", rows, {"changes": []}))

    trials = [trial(0, 0.5), trial(1, 0.1), trial(2, 0.01, "failed"), trial(3, 0.3), trial(4, None, "pending")]
    sweep = SimpleNamespace(name="sw", trials=trials, cached={"metric": "loss", "mode": "min"})
    figure = sweep_figure(sweep, best=2)
    assert [trace.name for trace in figure.data] == ["trial 1: lr=0.05", "trial 3: lr=0.025"]
    assert figure.layout.title.text == "sweep sw: best 2 of 5 trials by loss (min)"
    with pytest.raises(InvalidOptionError, match=r"sweep.figure\(best=...\) is how many trials"):
        sweep_figure(sweep, best=0)
