"""Downsampling, metric grouping, progress and the static summary (no cluster needed)."""

from __future__ import annotations

import re
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from nbtrain._client.run.run_history import Mark
from nbtrain._cluster.commands import Heartbeat, SteeringBeat
from nbtrain._cluster.rank.data.counted_shard import CountedShard
from nbtrain._cluster.rank.data.loading import batch_size_of
from nbtrain._cluster.storage.history_rules import Branch
from nbtrain._cluster.supervisor.worker_table import WorkerTable
from nbtrain._views.dashboard.chart import Chart, Trace
from nbtrain._views.dashboard.dashboard import WidgetDashboard
from nbtrain._views.dashboard.downsample import downsample
from nbtrain._views.dashboard.history import MetricHistory
from nbtrain._views.dashboard.static_plot import svg_chart
from nbtrain._views.dashboard.summary_text import CONFIG_CHARS, progress_fraction, state_label

pytestmark = pytest.mark.quick


def test_downsampling_keeps_first_last_and_extremes():
    xs = np.arange(1_000_000, dtype=float)
    ys = np.sin(xs / 5000.0)
    ys[123_456] = 50.0      # a spike
    ys[654_321] = -40.0     # a dip
    dx, dy = downsample(xs, ys, max_points=2000)
    assert len(dx) <= 2000
    assert dx[0] == 0 and dx[-1] == 999_999
    assert dy.max() == 50.0 and dx[dy.argmax()] == 123_456
    assert dy.min() == -40.0 and dx[dy.argmin()] == 654_321
    assert np.all(np.diff(dx) > 0)


def test_short_series_are_untouched():
    dx, dy = downsample([1, 2, 3], [3.0, 1.0, 2.0], max_points=10)
    assert list(dx) == [1, 2, 3] and list(dy) == [3.0, 1.0, 2.0]


def test_history_groups_losses_and_accuracies_and_averages_ranks():
    history = MetricHistory()
    history.add([{"rank": r, "step": s, "attempt": 1, "time": 0.0, "loss": float(s + r), "val_loss": 1.0,
                  "accuracy": 0.5, "lr": 0.1} for s in range(1, 4) for r in (0, 1)])
    assert history.groups() == {"accuracy": ["accuracy"], "loss": ["loss", "val_loss"], "lr": ["lr"]}
    steps, mean = history.mean("loss")
    assert list(steps) == [1, 2, 3] and list(mean) == [1.5, 2.5, 3.5]


def test_a_restart_replaces_the_overlapping_tail():
    history = MetricHistory()
    history.add([{"rank": 0, "step": s, "attempt": 1, "time": 0.0, "loss": 1.0} for s in range(10)])
    history.add([{"rank": 0, "step": s, "attempt": 2, "time": 0.0, "loss": 2.0} for s in range(6, 12)])
    xs, ys = history.per_rank("loss")[0]
    assert list(xs) == list(range(12))
    assert list(ys) == [1.0] * 6 + [2.0] * 6


def test_progress_and_state_labels():
    assert progress_fraction({"total_steps": 200, "step": 50}) == 0.25
    assert progress_fraction({"total_epochs": 4, "workers": [{"epoch": 1}, {"epoch": 2}]}) == 0.25
    assert progress_fraction({}) is None
    # the quickstart's run: 3 epochs, the last one's end not counted as a fourth's start; it succeeded
    ended = {"total_epochs": 3, "workers": [{"epoch": 2}, {"epoch": 2}]}
    assert progress_fraction({**ended, "state": "running"}) == pytest.approx(2 / 3)
    assert progress_fraction({**ended, "state": "succeeded"}) == 1.0
    assert progress_fraction({"total_steps": 200, "step": 150, "state": "succeeded"}) == 1.0
    assert progress_fraction({"total_steps": 200, "step": 150, "state": "failed"}) == 0.75
    assert state_label({"state": "restarting", "attempt": 1, "max_failures": 2}) == "restarting (attempt 2/3)"
    assert state_label({"state": "running", "attempt": 1}) == "running"


def test_static_chart_is_a_small_svg_with_the_series_names():
    xs = np.arange(100_000, dtype=float)
    svg = svg_chart(Chart("loss", "loss", [Trace("loss mean", xs, 1 / (xs + 1), "#222222", 3.0)]))
    assert svg.startswith("<svg") and svg.endswith("</svg>") and "loss mean" in svg
    assert len(svg) < 20_000


def test_static_chart_marks_the_changes_inside_its_steps_and_leaves_out_the_others():
    xs = np.arange(100, dtype=float)
    svg = svg_chart(Chart("loss", "loss", [Trace("loss mean", xs, xs, "#222222")],
                          [Mark(40, "adjust", "lr 0.1 → 0.01"), Mark(500, "adjust", "later")]))
    assert svg.count('<line class="nbtrain-mark" data-kind="adjust"') == 1
    assert "lr 0.1 → 0.01" in svg and "later" not in svg


def beats(table: WorkerTable, rank: int, *beats: tuple[float, int, float | None]) -> None:
    for when, step, samples_per_s in beats:
        table.beat(rank, 1, Heartbeat(time=when, step=step, state="running", last_progress=when,
                                      steering=SteeringBeat(step=step + 1, rate=None, epoch=0),
                                      samples_per_s=samples_per_s))


def test_worker_table_shows_samples_per_s_only_when_batches_have_a_size_else_steps_per_s():
    table = WorkerTable(threading.RLock())
    table.reset(1)
    place = {"node_ip": "127.0.0.1", "node_id": "a1b2c3d4", "hostname": "h", "pid": 1, "malloc_tuned": False}
    table.add_group([place, place], ["cpu", "cpu"], 1)
    t = time.time() - 2
    beats(table, 0, (t, 0, None), (t + 1, 5, 0.0), (t + 2, 10, 0.0))        # report() only: no batch size
    beats(table, 1, (t, 0, None), (t + 1, 5, 160.0), (t + 2, 15, 320.0))   # prepare_loader batches
    dashboard = WidgetDashboard(SimpleNamespace(name="speed"))
    dashboard.history.add([{"rank": 0, "step": 10, "attempt": 1, "time": 0.0, "loss": 0.5, "phase": "warmup",
                            "done": False},
                           {"rank": 1, "step": 15, "attempt": 1, "time": 0.0, "note": "x" * 500}])

    dashboard._draw_workers({"workers": table.snapshot()})

    html = dashboard.widget.workers["table"]
    rank0, rank1 = html.split('<tr data-rank="0">')[1].split('<tr data-rank="1">')
    assert '<td class="nbtrain-worker-rate">5 steps/s</td>' in rank0
    assert '<td class="nbtrain-worker-rate">320 samples/s</td>' in rank1
    assert '<td class="nbtrain-worker-text">phase=warmup · done=False</td>' in rank0
    assert f"note={'x' * 59}…</td>" in rank1
    assert "step_mark" not in table.snapshot()[0]


def test_a_run_without_total_steps_shows_steps_elapsed_time_and_a_moving_bar():
    dashboard = WidgetDashboard(SimpleNamespace(name="open-ended"))

    dashboard._draw_header({"state": "running", "step": 42, "started": 100.0, "now": 165.0, "world_size": 2})

    assert dashboard.widget.progress["fraction"] is None, "no bar of a known length"
    assert "nbtrain-progress-indeterminate" in dashboard.widget.progress["label"]
    assert dashboard.widget.progress["label"].endswith(" step 42 · 0:01:05")
    bar = dashboard.widget.progress["label"]
    dashboard._draw_header({"state": "running", "step": 43, "started": 100.0, "now": 166.0, "world_size": 2})
    assert _stripes_at(dashboard.widget.progress["label"]) != _stripes_at(bar), "a second later the stripes moved"
    assert "animation" not in bar, "no CSS animation: the browser draws the bar when the dashboard does"

    dashboard._draw_header({"state": "failed", "step": 50, "started": 100.0, "ended": 170.0, "world_size": 2})

    assert dashboard.widget.progress == {"fraction": 1.0, "style": "danger", "label": " step 50 · 0:01:10"}


def test_the_header_lists_the_modules_sent_with_the_run():
    dashboard = WidgetDashboard(SimpleNamespace(name="with-modules"))
    dashboard._draw_header({"state": "running", "step": 1, "started": 100.0, "now": 101.0, "world_size": 2,
                            "modules": ["mymodels@1a2b3c4", "helpers@9f8e7d6"]})
    assert "modules sent: mymodels@1a2b3c4, helpers@9f8e7d6" in dashboard.widget.header
    dashboard._draw_header({"state": "running", "step": 1, "started": 100.0, "now": 101.0, "world_size": 2})
    assert "modules sent" not in dashboard.widget.header


def test_a_huge_config_is_cut_short_in_the_header_and_says_where_the_rest_is():
    dashboard = WidgetDashboard(SimpleNamespace(name="big"))
    config = {f"layer_{i}": list(range(50)) for i in range(1000)}

    dashboard._draw_header({"state": "running", "step": 1, "world_size": 2, "config": config})

    shown = dashboard.widget.header.split('<code class="nbtrain-config">')[1].split("</code>")[0]
    assert len(shown) == CONFIG_CHARS and shown.endswith("…") and shown.startswith("layer_0=[0, 1, 2")
    assert "(the whole config: <code>run.config</code>)" in dashboard.widget.header

    dashboard._draw_header({"state": "running", "step": 1, "world_size": 2, "config_summary": "lr=0.01, epochs=2"})
    assert '<code class="nbtrain-config">lr=0.01, epochs=2</code>' in dashboard.widget.header
    assert "run.config" not in dashboard.widget.header


def test_a_dataset_shards_batches_count_toward_samples_per_s():
    class Shard:  # a ray.data.DataIterator, as much of it as matters here
        stats = "shard stats"

        def iter_torch_batches(self, batch_size):
            return iter([{"x": np.zeros(batch_size)}, {"x": np.zeros(batch_size // 2)}])

    sizes = []
    shard = CountedShard(Shard(), lambda batch: sizes.append(batch_size_of(batch)))

    assert [len(batch["x"]) for batch in shard.iter_torch_batches(batch_size=16)] == [16, 8]
    assert sizes == [16, 8]
    assert shard.stats == "shard stats"


def test_each_resize_is_marked_on_the_curves_where_the_new_size_resumed():
    """The sizes come from the events' structured fields (a message is for people: it is not parsed)."""
    events = [{"kind": "resize", "attempt": 1, "message": "room for 2 ranks (now 1): growing at the next checkpoint"},
              {"kind": "resize", "attempt": 1, "message": "resources freed up", "from_size": 1, "to_size": 2},
              {"kind": "resize", "attempt": 2, "message": "node 127.0.0.1 (node 65ab12) draining", "from_size": 2,
               "to_size": 1}]
    dashboard = WidgetDashboard(SimpleNamespace(name="elastic", reader=SimpleNamespace(events=events)))
    dashboard.history.add([{"rank": 0, "step": s, "attempt": 1, "time": 0.0, "loss": 1.0} for s in range(1, 11)])
    dashboard.history.add([{"rank": r, "step": s, "attempt": 2, "time": 0.0, "loss": 1.0}
                           for s in range(9, 21) for r in (0, 1)])
    dashboard.history.add([{"rank": 0, "step": s, "attempt": 3, "time": 0.0, "loss": 1.0} for s in range(18, 30)])

    dashboard._draw_curves()

    marks = dashboard.widget.spec("loss")["marks"]
    assert [mark["x"] for mark in marks] == [9, 18]
    assert [mark["text"] for mark in marks] == ["1 → 2 ranks", "2 → 1 ranks"]


def _stripes_at(label: str) -> str:
    return re.search(r"background-position:([^;\"]+)", label).group(1)


def test_under_a_dashboard_a_failed_cell_names_the_failing_rank_once_and_points_at_its_log():
    """In a notebook the dashboard's log pane of the failing rank holds its traceback: the cell's error
    says which rank failed and how, and where the traceback is, instead of printing it a second time."""
    from nbtrain import RunFailedError
    from nbtrain._views.magics import _ends_the_cell

    message = ("Run 'r' failed.\nRank 1 raised ZeroDivisionError at step 6: boom\nTraceback (most recent call last):\n"
               '  File "Cell In[3]", line 4\n    1 / 0\nZeroDivisionError: boom')
    printed = _ends_the_cell(RunFailedError(message), tracebacks_shown=True)._render_traceback_()
    assert printed == ["RunFailedError: Run 'r' failed.", "Rank 1 raised ZeroDivisionError at step 6: boom",
                       "Each failing rank's traceback is in the dashboard above, in its log (marked failed)."]


def test_a_rewound_branch_is_drawn_faded_from_the_step_after_the_one_gone_back_to_and_the_mean_follows_the_new_one():
    """Live, as the rows and the rewind's record arrive: rank 0 goes back to step 40 (skipping 41 and 42) before rank
    1 does. Which rows the rewind superseded is the history model's decision (as run.metrics_frame() makes it): 41
    onwards, reported before each rank went back; rank 1's rows past 40 wait until its going back is recorded."""
    dashboard = WidgetDashboard(SimpleNamespace(name="rewound", reader=SimpleNamespace(events=[])))
    rows = [{"rank": r, "step": s, "attempt": 1, "time": float(s), "loss": 1.0, "val_loss": 2.0}
            for s in range(1, 51) for r in (0, 1)]
    # the same step twice for a rank (a validation row after the training row) is not a rewind
    dashboard.history.add([*rows, {"rank": 0, "step": 50, "attempt": 1, "time": 50.5, "val_loss": 2.5}])
    assert dashboard.history.left_branches("loss") == []
    under_way = Branch(to_step=40, rank_times={}, skip=2, attempt=1)
    rank_0_back = Branch(to_step=40, rank_times={0: 51.0}, skip=2, step=51, attempt=1)
    both_back = Branch(to_step=40, rank_times={0: 51.0, 1: 51.5}, skip=2, step=51, attempt=1)
    dashboard.history.add([{"rank": 1, "step": 51, "attempt": 1, "time": 51.0, "loss": 1.0}], [under_way])
    dashboard.history.add([{"rank": 0, "step": s, "attempt": 1, "time": 60.0 + s, "loss": 5.0} for s in range(43, 60)],
                          [rank_0_back])
    steps, mean = dashboard.history.mean("loss")
    assert steps.max() == 59 and set(mean[steps > 40]) == {5.0}, "rank 1's rows past 40 are drawn before it said"
    dashboard.history.add([{"rank": 1, "step": s, "attempt": 1, "time": 60.0 + s, "loss": 5.0} for s in range(43, 60)],
                          [both_back])
    dashboard._summary = {"changes": [{"kind": "rewind", "applied_step": 51, "args": {"to_step": 40, "skip": 2},
                                       "description": "rewound to step 40, 2 batches skipped, at step 51"}]}

    dashboard._draw_curves()

    names = dashboard.widget.trace_names("loss")
    assert {"loss superseded 1", "val_loss superseded 1"} <= set(names), names
    left_x, left_y = dashboard.widget.points("loss", "loss superseded 1")
    assert list(left_x) == list(range(41, 52)) and set(left_y) == {1.0}
    steps, mean = dashboard.widget.points("loss", "loss mean")
    assert list(steps) == [*range(1, 41), *range(43, 60)]
    assert set(mean[steps > 42]) == {5.0}, "the mean mixes the branch gone back from with the new one"
    dashed = [trace["name"] for trace in dashboard.widget.spec("loss")["traces"] if trace.get("dash")]
    assert dashed == ["loss superseded 1", "val_loss superseded 1"]
    marks = dashboard.widget.spec("loss")["marks"]
    assert [(mark["x"], mark["text"]) for mark in marks] == [(40, "rewound to step 40")]


def test_a_history_read_whole_after_the_end_finds_the_rewind_of_an_earlier_attempt():
    history = MetricHistory()
    first = [{"rank": 0, "step": s, "attempt": 1, "time": float(s), "loss": 1.0} for s in range(1, 53)]
    branch = [{"rank": 0, "step": s, "attempt": 1, "time": 100.0 + s, "loss": 2.0} for s in range(43, 91)]
    second = [{"rank": 0, "step": s, "attempt": 2, "time": 200.0 + s, "loss": 3.0} for s in range(81, 101)]
    rewind = Branch(to_step=40, rank_times={0: 100.0}, skip=2, step=53, attempt=1)
    history.add([*first, *branch, *second], [rewind])  # one batch, as a dashboard opened after the run's end reads it
    [(left_x, left_y, _breaks)] = history.left_branches("loss")
    assert list(left_x) == list(range(41, 53)) and set(left_y) == {1.0}
    assert history.resumed_at == {2: 81}
    steps, mean = history.mean("loss")
    assert list(steps) == [*range(1, 41), *range(43, 101)] and set(mean[steps > 80]) == {3.0}


def test_a_metric_reported_once_an_epoch_is_points_and_no_line_crosses_a_gap_live_or_static():
    """``epoch_loss`` once an epoch beside ``loss`` each step: dots, not a line joining the epochs; nothing reported
    from 1201 to 1499: every line of ``loss`` breaks there; ``epoch`` only counts (progress, not a chart)."""
    dashboard = WidgetDashboard(SimpleNamespace(name="rates", reader=SimpleNamespace(events=[])))
    dashboard.history.add([{"rank": r, "step": s, "attempt": 1, "time": float(s), "loss": 1.0 / s,
                            "epoch": (s - 1) // 500, **({"epoch_loss": 2.0 / s} if s % 500 == 0 else {})}
                           for s in range(1, 3001) if not 1200 < s < 1500 for r in (0, 1)])

    dashboard._draw_curves()

    assert dashboard.widget.titles() == ["loss"] and dashboard.history.counters == {"epoch": 5}
    looks = {trace["name"]: trace for trace in dashboard.widget.spec("loss")["traces"]}
    assert {name for name, look in looks.items() if look.get("points")} == {
        "epoch_loss rank 0", "epoch_loss rank 1", "epoch_loss mean"}
    for name in ("loss rank 0", "loss rank 1", "loss mean"):
        [middle] = looks[name]["breaks"]
        assert 1200 < middle < 1500 and not looks[name].get("points"), looks[name]
    assert looks["loss rank 0"]["width"] < looks["loss mean"]["width"] and looks["loss rank 0"]["opacity"] < 0.5

    picture = dashboard._fallback({"state": "succeeded", "world_size": 2, "attempt": 1})
    assert re.search(r'<g class="nbtrain-trace nbtrain-points" data-name="epoch_loss mean"[^>]*>(<circle [^>]*/>){6}'
                     r"</g>", picture), "the static picture draws the epochs as dots too"
    mean = re.search(r'<path class="nbtrain-trace" data-name="loss mean" [^>]*d="([^"]+)"', picture)[1]
    assert mean.count("M") == 2, "the static picture's line crosses the gap"


def test_a_long_thinned_history_is_joined_where_its_reports_were_steady():
    dashboard = WidgetDashboard(SimpleNamespace(name="long", reader=SimpleNamespace(events=[])))
    for start in range(0, 100_000, 5000):
        dashboard.history.add([{"rank": r, "step": s, "attempt": 1, "time": 0.0, "loss": 1.0 / (s + 1)}
                               for s in range(start, start + 5000) for r in (0, 1)])

    dashboard._draw_curves()

    xs, _ys = dashboard.widget.points("loss", "loss rank 0")
    assert len(xs) <= 2000 and np.diff(xs).max() > 10, "thinned: its points far apart"
    assert not any(trace.get("breaks") for trace in dashboard.widget.spec("loss")["traces"])
