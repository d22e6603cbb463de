"""Where a launch's time goes: each phase recorded where it ends, the supervisor's record of them, the notebook's
``Run.timeline()`` and the benchmark's breakdown. Units with fakes; the times themselves are the benchmark's."""

from __future__ import annotations

import collections
import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from nbtrain._cluster.launch_phases import LaunchPhases, timeline

pytestmark = pytest.mark.quick

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks" / "run_benchmarks.py"


def _benchmarks() -> Any:
    spec = importlib.util.spec_from_file_location("run_benchmarks_under_test", BENCHMARKS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    path = list(sys.path)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = path  # it puts benchmarks/ first for its own imports
    return module


def test_a_rank_phase_ends_when_the_last_rank_is_past_it() -> None:
    phases = LaunchPhases(launch_called=100.0, supervisor_up=100.5)
    phases.ranks_assigned(attempt=1, world_size=2, warm_ranks=2, at=101.0)
    phases.rank_reached(0, 1, {"group_formed": 101.2, "function_loaded": 101.3})
    assert "group_formed" not in phases.summary()["at"]  # rank 1 has not said yet
    phases.rank_reached(1, 1, {"group_formed": 101.4, "function_loaded": 101.5, "first_step": 101.9})
    phases.rank_reached(0, 1, {"group_formed": 109.0, "function_loaded": 109.0, "first_step": 101.8})  # kept: first
    summary = phases.summary()
    assert summary == {"at": {"launch_call": 100.0, "supervisor_up": 100.5, "ranks_assigned": 101.0,
                              "group_formed": 101.4, "function_loaded": 101.5, "first_step": 101.9},
                       "world_size": 2, "warm_ranks": 2}


def test_a_later_attempt_leaves_the_first_attempts_phases_as_they_were() -> None:
    phases = LaunchPhases(launch_called=None, supervisor_up=5.0)
    phases.ranks_assigned(attempt=1, world_size=1, warm_ranks=0, at=6.0)
    phases.ranks_assigned(attempt=2, world_size=3, warm_ranks=3, at=60.0)
    phases.rank_reached(0, 2, {"first_step": 61.0})
    phases.rank_reached(0, 1, {"first_step": 7.0, "something_else": 1.0})
    assert phases.summary() == {"at": {"supervisor_up": 5.0, "ranks_assigned": 6.0, "first_step": 7.0},
                                "world_size": 1, "warm_ranks": 0}


def test_the_timeline_is_seconds_since_the_launch_call_in_the_phases_order() -> None:
    recorded = {"at": {"first_step": 12.5, "supervisor_up": 10.25, "launch_call": 10.0, "ranks_assigned": 11.0},
                "world_size": 2, "warm_ranks": 0}
    assert list(timeline(recorded, first_row=13.0).items()) == [
        ("supervisor_up", 0.25), ("ranks_assigned", 1.0), ("first_step", 2.5), ("first_row", 3.0)]
    assert timeline({"at": {"supervisor_up": 1.0}}) == {}  # no launch call known (a sweep's trial, an older run)
    assert timeline(None) == {}


def test_a_ranks_heartbeat_carries_its_first_report_time_read_off_reports_path() -> None:
    from nbtrain._cluster.rank.session import TrainingSession

    session = TrainingSession.__new__(TrainingSession)  # only what _collect reads
    session.phases = {}
    rows = collections.deque([(1, 42.0, {"loss": 1.0}), (2, 43.0, {"loss": 0.5})])
    session.reporter = type("Reporter", (), {"rows": rows})()
    session.logs = collections.deque()
    session.context = type("Context", (), {"rank": 0, "attempt": 1})()
    session._waiting_rows, session._waiting_logs, session._unsent, session.last_progress = [], [], None, 0.0
    session._collect()
    session.reporter.rows.append((3, 44.0, {"loss": 0.2}))
    session._collect()
    assert session.phases == {"first_step": 42.0}


def test_the_benchmark_logs_each_phases_share_and_when_it_ended() -> None:
    bench = _benchmarks()
    lines = bench.phase_breakdown({"supervisor_up": 0.25, "ranks_assigned": 1.0, "first_row": 3.0})
    assert lines == ["supervisor_up    + 0.250 s  (at  0.250 s)",
                     "ranks_assigned   + 0.750 s  (at  1.000 s)",
                     "first_row        + 2.000 s  (at  3.000 s)"]
    assert bench.median_phases([{"supervisor_up": 1.0, "first_row": 3.0}, {"supervisor_up": 2.0, "first_row": 5.0},
                                {"supervisor_up": 4.0}]) == {"supervisor_up": 2.0, "first_row": 4.0}


def test_the_controller_records_when_its_first_attempts_ranks_were_placed_and_how_many_were_warm(tmp_path) -> None:
    import threading

    from nbtrain._cluster.elastic import policy
    from nbtrain._cluster.spec import RunSpec
    from nbtrain._cluster.storage.run_storage import RunStorage
    from nbtrain._cluster.supervisor.attempt import AttemptStart
    from nbtrain._cluster.supervisor.controller import RunController
    from nbtrain._cluster.supervisor.failure_policy import Failed, Failure, FailurePolicy, Succeeded
    from nbtrain._cluster.supervisor.feed import RunFeed
    from nbtrain._cluster.supervisor.worker_table import WorkerTable
    from nbtrain._options import RunOptions

    outcomes = [Failed([Failure(0, "raised", "Rank 0 raised ValueError at step 3", "Traceback ...")]),
                Succeeded([b"", b""])]

    class Group:
        def __init__(self, start: AttemptStart) -> None:
            self.pushes: dict[int, int] = {}
            self.unsent: dict[int, dict[str, float]] = {}
            start.on_placed()
            start.on_assigned(2 if start.attempt == 1 else 0)  # the first attempt's ranks lent warm, the next's not

        def watch(self, table: Any, interrupt: Any) -> Any:
            return outcomes.pop(0)

        def shutdown(self, table: Any) -> None:
            pass

    lock = threading.RLock()
    storage = RunStorage(tmp_path, "unit")
    spec = RunSpec(RunOptions(name="unit", workers=2, max_failures=1), fn_bytes=b"", fn_takes_config=False,
                   launch_folder=None, launch_called=1.0)
    ended = threading.Event()
    controller = RunController(spec, None, RunFeed(storage, lock), storage, WorkerTable(lock), supervisor=None,
                               on_end=ended.set, failure_policy=FailurePolicy(1),
                               sizing=policy.for_run(spec.options, None, lambda kind, message: None),
                               start_group=Group, callbacks=())
    controller.recover()
    controller.start()
    assert ended.wait(20)
    recorded = controller.phases.summary()
    assert recorded["world_size"] == 2 and recorded["warm_ranks"] == 2  # the first attempt's, not the restart's
    at = recorded["at"]
    assert at["launch_call"] == 1.0 and at["supervisor_up"] <= at["ranks_assigned"]
