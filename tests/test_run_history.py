"""A run's history model (nbtrain/_client/run/run_history.py): each decision made once and read by every reader.

Recorded dicts and fakes, no cluster: which rows a rewind superseded (the same for ``run.metrics_frame()``, the
dashboard's drawing buffer, ``run.rewinds`` and ``run.on_row``), the rows a later attempt replaced, the typed
marks from a summary's changes and the events' structured fields, and the metrics that only count.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from nbtrain._client.run.row_rules import RowRule
from nbtrain._client.run.run_history import (
    GUARD_TRIP,
    RESIZE,
    RESTART,
    CountWatch,
    Mark,
    RunHistory,
    marks_of,
)
from nbtrain._cluster.commands import GUARD, SteeringBeat
from nbtrain._cluster.storage.history_rules import Branch, branches_of
from nbtrain._cluster.supervisor.run_steering import RunSteering
from nbtrain._guards import checked_guard
from nbtrain._views.dashboard.history import MetricHistory

from _recorded_runs import GONE_BACK, LEFT, SUMMARY, recorded_run, rewind_change, rewound_rows

pytestmark = pytest.mark.quick

def test_the_rows_a_rewind_superseded_are_the_same_for_the_frame_the_dashboard_and_on_row(monkeypatch):
    rows = rewound_rows()
    run = recorded_run(monkeypatch, rows, SUMMARY)

    frame = run.metrics_frame()
    left = set(zip(frame["rank"][frame["superseded"]], frame["step"][frame["superseded"]]))
    assert left == LEFT

    drawn = MetricHistory()  # live: a batch at a time, the rewind's record as it came with each
    drawn.add(rows[:94], [])
    drawn.add(rows[94:100], branches_of({"changes": [rewind_change({0: GONE_BACK[0]})]}))
    drawn.add(rows[100:], branches_of(SUMMARY))
    [(left_steps, left_mean, _breaks)] = drawn.left_branches("loss")
    assert list(left_steps) == sorted({s for _, s in LEFT}) and set(left_mean) == {1.0}
    steps, mean = drawn.mean("loss")
    assert list(steps) == [*range(1, 41), *range(43, 61)] and set(mean[steps > 40]) == {2.0}

    handed: list[tuple[int, int, float]] = []
    reader = SimpleNamespace(rows_since=lambda start: rows[start:], row_window_start=0, rows_fetched=0,
                             summary=SUMMARY, row_listener=None, channel=SimpleNamespace(name="recorded"))
    rule = RowRule(reader)  # type: ignore[arg-type]
    rule.callback = lambda row: handed.append((row["rank"], row["step"], row["time"]))
    rule.deliver()
    assert {(rank, step) for rank, step, when in handed if when < 100} == {(r, s) for r in (0, 1) for s in range(1, 41)}
    assert len(handed) == len(rows) - len(LEFT), "on_row handed a row the run left"

    [rewind] = run.rewinds
    assert (rewind["to_step"], rewind["skip"], rewind["step"], rewind["rank_times"]) == (40, 2, 47, GONE_BACK)


def test_a_rank_that_has_not_gone_back_yet_has_its_rows_past_the_step_held_until_it_has():
    branch = Branch(to_step=40, rank_times={0: 47.5}, attempt=1)
    assert branch.holds(0, 45, 45.0) and not branch.holds(0, 40, 40.0) and not branch.holds(0, 45, 145.0)
    assert not branch.holds(1, 45, 45.0) and branch.waits_for(1) and not branch.waits_for(0)
    assert not Branch(to_step=40, rank_times={}, dropped=True).waits_for(1), "a dropped rewind takes nothing"


def test_rows_an_attempt_resumed_over_are_replaced_not_superseded():
    rows = [{"rank": 0, "step": s, "attempt": 1, "time": float(s), "loss": 1.0} for s in range(1, 91)]
    rows += [{"rank": 0, "step": s, "attempt": 2, "time": 200.0 + s, "loss": 3.0} for s in range(81, 101)]
    history = RunHistory.of_rows({"changes": []}, [], rows)
    assert history.starts == {2: 81} and not history.superseded.any()
    steps, mean = history.mean("loss")
    assert list(steps) == list(range(1, 101)) and set(mean[steps > 80]) == {3.0}
    assert history.marks == [Mark(81, RESTART, "attempt 2")]


def test_marks_are_typed_from_the_changes_and_the_events_structured_fields_never_their_messages():
    changes = [
        {"kind": "adjust", "applied_step": 12, "args": {"lr": 0.01}, "description": "lr 0.1 → 0.01 at step 12"},
        rewind_change(),
        {"kind": "patch", "applied_step": 50, "args": {"names": ["scale"]}, "description": "patched scale at step 50"},
        {"kind": "adjust", "applied_step": None, "args": {"lr": 0.5}, "description": "lr → 0.5 at step 99"},
        {"kind": "stop_after_epoch", "applied_step": 55, "args": {}, "description": "stop after epoch 1"},
    ]
    events = [
        {"kind": "guard", "attempt": 1, "message": "guard tripped, rank 0: its loss was nan at step 46: rewind",
         "tripped": "nan", "step": 46, "action": "rewind"},
        {"kind": "guard", "attempt": 1, "message": "non-finite loss or gradients → rewind"},  # settings: no mark
        {"kind": "resize", "attempt": 1, "message": "room for 2 ranks (now 1): growing at the next checkpoint"},
        {"kind": "resize", "attempt": 1, "message": "resources freed up", "from_size": 1, "to_size": 2},
        # a message that reads like a resize is not one: attempt 3 is a restart
        {"kind": "resize", "attempt": 2, "message": "2 → 1 ranks: node n1 draining"},
    ]
    marks = marks_of({"changes": changes}, events, {2: 70, 3: 90})
    assert marks == [Mark(12, "adjust", "lr 0.1 → 0.01"), Mark(40, "rewind", "rewound to step 40"),
                     Mark(46, GUARD_TRIP, "guard: nan at step 46"), Mark(50, "patch", "patched scale"),
                     Mark(70, RESIZE, "1 → 2 ranks"), Mark(90, RESTART, "attempt 3")]


def test_a_guard_trip_and_its_action_are_recorded_with_structured_fields():
    events: list[tuple[str, str, dict[str, Any]]] = []
    steering = RunSteering(record=lambda kind, message, **fields: events.append((kind, message, fields)),
                           persist=lambda: None)
    steering.issue(GUARD, checked_guard({"nan": "rewind"}), {}, live=True)
    running = {rank: SteeringBeat(step=65, rate=10.0, epoch=0, restore_points=(20, 40)) for rank in (0, 1)}
    steering.guards.tripped(1, 0, 60, "nan", "rank 0: its loss was nan at step 60", running, live=True)
    [(_kind, message, fields)] = [event for event in events if event[2]]
    assert fields == {"tripped": "nan", "step": 60, "action": "rewind"} and message.startswith("guard tripped")


def test_a_metric_that_only_counts_is_progress_not_a_curve():
    rows = [{"rank": r, "step": s, "attempt": 1, "time": float(s), "loss": 1.0 / s, "epoch": s // 10,
             "samples": 32 * s, "accuracy": 1.0} for s in range(1, 41) for r in (0, 1)]
    rows += [{"rank": 0, "step": 40, "attempt": 1, "time": 40.5, "val_loss": 0.5}]  # no epoch on this row
    history = RunHistory.of_rows({"changes": []}, [], rows)
    assert history.counters == {"epoch": 4, "samples": 1280}
    assert history.metrics == ["accuracy", "loss", "val_loss"], "a whole float (accuracy 1.0) is a measurement"

    drawn = MetricHistory()
    drawn.add(rows)
    assert drawn.counters == {"epoch": 4, "samples": 1280} and list(drawn.groups()) == ["accuracy", "loss"]

    watch = CountWatch()
    assert watch.take(np.array([0, 0, 1]), np.array([3.0, 4.0, 1.0]), integers=True)
    assert not CountWatch().take(np.array([0, 0]), np.array([3.0, 2.0]), integers=True), "went down"
    watch.new_attempt()
    assert watch.take(np.array([0]), np.array([2.0]), integers=True), "a new attempt may count again from earlier"


def test_the_history_read_from_arrow_pages_knows_integer_metrics_with_gaps(monkeypatch):
    rows = [{"rank": 0, "step": s, "attempt": 1, "time": float(s), "loss": 1.0 / s, **({"epoch": s // 5}
            if s % 2 else {})} for s in range(1, 21)]
    run = recorded_run(monkeypatch, rows, {"state": "running", "changes": []})
    history = run.reader.history()
    assert history.counters == {"epoch": 3} and history.metrics == ["loss"] and len(history) == 20
