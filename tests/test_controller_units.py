"""The run's controller decides alone: restarts within max_failures, an elastic run's shrink, growth and
drain, the user's stop, a long stall said once, each with no cluster.

The controller's worker group comes from a factory; here :class:`FakeWorkerGroups` stands in for
``WorkerGroup.start`` and plays each attempt's scripted outcome, and :class:`FakeCluster` stands in for
what the elastic policy asks Ray (room, lost and draining nodes, the autoscaler). The feed, storage,
worker table, state machine and both policies are the real ones. The same behaviour on a real cluster
is in test_fault_tolerance.py and test_elastic.py.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nbtrain._cluster.command_kinds.stop import LONGEST_WAIT_S, wait_for_ranks_s
from nbtrain._cluster.commands import STOP, Heartbeat, SteeringBeat
from nbtrain._cluster.elastic import policy
from nbtrain._cluster.elastic.policy import Resize, SizingPolicy
from nbtrain._cluster.spec import RunSpec
from nbtrain._cluster.storage.run_storage import RunStorage
from nbtrain._cluster.supervisor import missing_rows
from nbtrain._cluster.supervisor.attempt import AttemptStart, NotPlaced, StartGroup
from nbtrain._cluster.supervisor.controller import RunController
from nbtrain._cluster.supervisor.controller_callback import ControllerCallback, RunView
from nbtrain._cluster.supervisor.controller_parts import callbacks_for
from nbtrain._cluster.supervisor.failure_policy import Failed, Failure, FailurePolicy, Outcome, Stopped, Succeeded
from nbtrain._cluster.supervisor.feed import RunFeed
from nbtrain._cluster.supervisor.missing_rows import NO_ROWS_AFTER_S, no_rows_note_due
from nbtrain._cluster.supervisor.worker_group import StopRequested
from nbtrain._cluster.supervisor.worker_table import WorkerTable
from nbtrain._exceptions import NbtrainError
from nbtrain._options import RunOptions
from nbtrain._ray_compat import Draining
from nbtrain._states import RunState

pytestmark = pytest.mark.quick

Script = Callable[["FakeAttempt", Callable[[], "Outcome | None"]], Outcome]


class FakeAttempt:
    """Stands in for one attempt's WorkerGroup: its watch plays a script instead of watching ranks."""

    def __init__(self, number: int, size: int, script: Script) -> None:
        self.number, self.size, self._script = number, size, script
        self.pushes: dict[int, int] = {}
        self.unsent: dict[int, dict[str, float]] = {}
        self.shut_down = False

    def watch(self, table: WorkerTable, interrupt: Callable[[], Outcome | None]) -> Outcome:
        return self._script(self, interrupt)

    def shutdown(self, table: WorkerTable) -> None:
        self.shut_down = True


class FakeWorkerGroups:
    """Stands in for ``WorkerGroup.start``: rank r "starts" on node n{r+1} (in the worker table, as the real
    group records it), and attempt k plays the k-th script."""

    def __init__(self, *scripts: Script) -> None:
        self._scripts = list(scripts)
        self.attempts: list[FakeAttempt] = []
        self.running = threading.Event()

    def start(self, start: AttemptStart) -> FakeAttempt:
        if start.stop_requested():
            raise StopRequested
        start.on_placed()
        places = [{"node_id": f"n{rank + 1}", "node_ip": f"10.0.0.{rank + 1}", "hostname": f"h{rank + 1}",
                   "pid": 1000 + rank, "malloc_tuned": False} for rank in range(start.world_size)]
        start.table.add_group(places, ["cpu"] * start.world_size, start.attempt)
        group = FakeAttempt(start.attempt, start.world_size, self._scripts.pop(0))
        self.attempts.append(group)
        return group

    @property
    def sizes(self) -> list[int]:
        return [a.size for a in self.attempts]


class FakeCluster:
    """Stands in for the cluster the elastic policy reads: ``free`` bundles' room besides the run's own."""

    def __init__(self, free: int) -> None:
        self.free = free
        self.dead: set[str] = set()
        self.draining_now: set[str] = set()
        self.asked: list[int] = []        # the sizes at which the run asked for room
        self.withdrawn = 0

    def starting_size(self, options: RunOptions) -> int:
        return max(options.min_workers, min(options.max_workers, self.free))

    def room(self, options: RunOptions, held: int, leaving: set[str]) -> int:
        return held + self.free

    def room_after_shutdown(self, options: RunOptions) -> int:
        return min(options.max_workers, self.free)

    def lost_nodes(self, suspects: set[str]) -> set[str]:
        return suspects & self.dead

    def draining(self) -> Draining:
        return Draining(frozenset(self.draining_now))

    def drain(self, node_id: str, deadline_s: float) -> None:
        self.draining_now.add(node_id)

    def ask(self, options: RunOptions, size: int) -> list[dict[str, float]]:
        if size >= options.max_workers:
            return []
        self.asked.append(size)
        return [{"CPU": 1.0}] * options.max_workers

    def withdraw(self, asked: list[dict[str, float]]) -> None:
        self.withdrawn += bool(asked)


def succeed(attempt: FakeAttempt, interrupt: Callable[[], Outcome | None]) -> Outcome:
    return Succeeded([b"result"] * attempt.size)


def raise_at_step(attempt: FakeAttempt, interrupt: Callable[[], Outcome | None]) -> Outcome:
    return Failed([Failure(0, "raised", "Rank 0 raised ValueError at step 3: bad batch", "Traceback ...")])


def until_interrupted(then: Callable[[FakeAttempt], None] = lambda attempt: None) -> Script:
    """Ranks that keep running: the watch ticks until the controller ends the attempt; ``then`` runs each tick."""
    def play(attempt: FakeAttempt, interrupt: Callable[[], Outcome | None]) -> Outcome:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            then(attempt)
            outcome = interrupt()
            if outcome is not None:
                return outcome
            time.sleep(0.01)
        pytest.fail("the controller never ended the attempt")
    return play


def make_controller(tmp_path: Path, groups: FakeWorkerGroups, cluster: FakeCluster | None = None,
                    callbacks: list[ControllerCallback] | None = None, failures: FailurePolicy | None = None,
                    sizing: SizingPolicy | None = None, start_group: StartGroup | None = None,
                    **options: Any) -> tuple[RunController, threading.Event]:
    """A controller with the supervisor's callbacks (or ``callbacks``), a failure budget of ``max_failures`` (or
    ``failures``) and a sizing policy reading ``cluster`` (a fixed size reads none), or ``sizing``; its attempts
    start in ``groups`` (or through ``start_group``, which may hand them on to ``groups``)."""
    lock = threading.RLock()
    storage = RunStorage(tmp_path, "unit")
    spec = RunSpec(RunOptions(name="unit", **options), fn_bytes=b"", fn_takes_config=False, launch_folder=None)
    ended = threading.Event()
    made: list[RunController] = []
    sizing = sizing or policy.for_run(spec.options, cluster or FakeCluster(free=0),
                                      lambda kind, message: made[0].feed.event(kind, message, made[0].attempt))
    controller = RunController(spec, None, RunFeed(storage, lock), storage, WorkerTable(lock), supervisor=None,
                               on_end=ended.set, failure_policy=failures or FailurePolicy(spec.options.max_failures),
                               sizing=sizing, start_group=start_group or groups.start,
                               callbacks=callbacks_for(spec, tmp_path) if callbacks is None else callbacks)
    made.append(controller)
    controller.recover()
    return controller, ended


def run_to_end(controller: RunController, ended: threading.Event) -> RunState:
    controller.start()
    assert ended.wait(20), f"the run did not end (state {controller.state})"
    return controller.state


def events(controller: RunController, kind: str) -> list[str]:
    return [e["message"] for e in controller.feed.events if e["kind"] == kind]


def test_a_run_that_fails_once_restarts_within_max_failures(tmp_path):
    groups = FakeWorkerGroups(raise_at_step, succeed)
    controller, ended = make_controller(tmp_path, groups, workers=2, max_failures=1)
    assert run_to_end(controller, ended) == RunState.SUCCEEDED
    assert controller.attempt == 2 and groups.sizes == [2, 2]
    assert [f["attempt"] for f in controller.failures] == [1]
    assert all(attempt.shut_down for attempt in groups.attempts)
    assert any("attempt 2/2 after: Rank 0 raised ValueError" in said for said in events(controller, "state"))
    assert controller.results == [b"result", b"result"]


def test_a_run_that_fails_past_max_failures_ends_failed_with_every_attempt_said(tmp_path):
    groups = FakeWorkerGroups(raise_at_step, raise_at_step)
    controller, ended = make_controller(tmp_path, groups, workers=2, max_failures=1)
    assert run_to_end(controller, ended) == RunState.FAILED
    assert controller.error is not None
    assert "The run failed 2 time(s), more than max_failures=1." in controller.error
    assert "attempt 1: Rank 0 raised ValueError" in controller.error


def test_a_failure_that_cannot_be_retried_ends_the_run_at_once(tmp_path):
    def lose_the_env(attempt: FakeAttempt, interrupt: Callable[[], Outcome | None]) -> Outcome:
        return Failed([Failure(None, "runtime_env", "pip could not find torchh", retriable=False)])

    controller, ended = make_controller(tmp_path, FakeWorkerGroups(lose_the_env), workers=2, max_failures=3)
    assert run_to_end(controller, ended) == RunState.FAILED
    assert controller.attempt == 1


def test_a_resumed_run_has_its_failure_budget_afresh(tmp_path):
    groups = FakeWorkerGroups(raise_at_step, raise_at_step, raise_at_step, succeed)
    controller, ended = make_controller(tmp_path, groups, workers=2, max_failures=1)
    assert run_to_end(controller, ended) == RunState.FAILED
    ended.clear()
    assert controller.resume(controller.spec, None, FailurePolicy(1)) == "resumed"
    assert ended.wait(20) and controller.state == RunState.SUCCEEDED, "one failure after the resume: restarted"
    assert controller.attempt == 4 and [f["attempt"] for f in controller.failures] == [1, 2, 3]


def test_a_stop_during_an_attempt_ends_it_stopped(tmp_path):
    def tell_running(attempt: FakeAttempt) -> None:
        groups.running.set()

    groups = FakeWorkerGroups(until_interrupted(tell_running))
    controller, ended = make_controller(tmp_path, groups, workers=2)
    controller.start()
    assert groups.running.wait(10)
    assert controller.state == RunState.RUNNING
    assert controller.request_stop(timeout=10) == RunState.STOPPED
    assert ended.wait(10) and groups.attempts[0].shut_down
    assert "stopped by the user" in events(controller, "state")[-1]


def test_a_stop_has_every_rank_end_at_one_step_and_waits_for_them_then_kills_the_late(tmp_path):
    """With the ranks' rates known, the stop is a command at one step ahead of them; the attempt goes on until
    every rank's function ended there (its workers then go back to the warm pool, see worker_group), or, where a
    rank does not get there in time, ends as a kill would."""
    def beating(attempt: FakeAttempt) -> None:
        for rank in range(attempt.size):
            controller.table.beat(rank, attempt.number, Heartbeat(
                time=time.time(), step=10, state="running", last_progress=time.time(),
                steering=SteeringBeat(step=10, rate=20.0, epoch=0)))
        groups.running.set()

    def ranks_end_at_the_stop(attempt: FakeAttempt, interrupt: Callable[[], Outcome | None]) -> Outcome:
        # the ranks go on until they see the stop's command, as real ones do: the stop flag is set before the
        # command is issued, so a fake woken in between would find none
        while not (stops := [c for c in controller.steering.all() if c.kind == STOP]):
            beating(attempt)
            assert interrupt() is None
            time.sleep(0.01)
        assert len(stops) == 1 and stops[0].at_step > 10, "the stop is a command at a step ahead of the ranks"
        asked = time.monotonic()
        # the attempt goes on while the ranks have time to reach the stop's step (a fake descheduled past that
        # time on a loaded machine would be killed, rightly: then the deadline must have passed)
        assert interrupt() is None or asked >= controller._ranks_end_by, "the stop did not wait for the ranks"
        return Succeeded([b"stopped"] * attempt.size)  # each rank's function ended there

    groups = FakeWorkerGroups(ranks_end_at_the_stop)
    controller, ended = make_controller(tmp_path, groups, workers=2)
    controller.start()
    assert groups.running.wait(10)
    assert controller.request_stop(timeout=10) == RunState.STOPPED
    assert ended.wait(10) and "stopped by the user" in events(controller, "state")[-1]
    assert controller.results is None, "a stopped run has no result"
    assert controller.steering.changes() == [], "a stop is none of the run's changes"

    groups = FakeWorkerGroups(until_interrupted(beating))  # ranks that never reach it: killed once it is due
    controller, ended = make_controller(tmp_path / "late", groups, workers=2)
    controller.start()
    assert groups.running.wait(10)
    assert controller.request_stop(timeout=10) == RunState.STOPPED  # killed within its wait, not left running
    assert groups.attempts[0].shut_down


@pytest.mark.parametrize(("rates", "at_step", "paused", "waits"), [
    ((20.0, 20.0), 13, False, True),        # 3 steps at 20 steps/s: a fraction of a second, then the ending
    ((20.0, 0.5), 13, False, False),        # the slowest rank needs 6 s to get there: killed at once
    ((None, 20.0), 13, False, False),       # a rate not measured yet: no telling when
    ((20.0, 20.0), 13, True, False),        # a paused rank is held inside its step
])
def test_a_stop_waits_for_the_ranks_only_where_they_reach_its_step_soon(rates, at_step, paused, waits):
    running = {rank: SteeringBeat(step=10, rate=rate, epoch=0, paused_at=10 if paused else None)
               for rank, rate in enumerate(rates)}
    wait_s = wait_for_ranks_s(running, at_step)
    assert (wait_s is not None) is waits
    assert wait_s is None or wait_s <= LONGEST_WAIT_S


def test_an_elastic_run_shrinks_on_a_lost_node_and_grows_back(tmp_path):
    cluster = FakeCluster(free=2)

    def lose_node_2(attempt: FakeAttempt, interrupt: Callable[[], Outcome | None]) -> Outcome:
        cluster.dead, cluster.free = {"n2"}, 1  # the node and its bundle are gone; rank 0's bundle is free again
        return Failed([Failure(1, "died", "Rank 1's worker process died (pid 1001 on 10.0.0.2): node lost",
                               node="10.0.0.2", node_id="n2")])

    def node_2_back(attempt: FakeAttempt) -> None:
        cluster.free = 1
        if controller.checkpoint_wanted(attempt.number) and controller.checkpoint is None:
            controller.checkpoint = {"time": time.time() - 60}  # a rank saved one (its rows are all in)

    groups = FakeWorkerGroups(lose_node_2, until_interrupted(node_2_back), succeed)
    controller, ended = make_controller(tmp_path, groups, cluster, workers=(1, 2), max_failures=0,
                                        resize_interval_s=0.05)
    assert run_to_end(controller, ended) == RunState.SUCCEEDED, controller.error
    assert groups.sizes == [2, 1, 2]
    assert events(controller, "resize") == ["2 → 1 ranks: lost node 10.0.0.2",
                                            "room for 2 ranks (now 1): growing at the next checkpoint",
                                            "1 → 2 ranks: resources freed up"]
    resized = [(e["attempt"], e["from_size"], e["to_size"]) for e in controller.feed.events if "to_size" in e]
    assert resized == [(1, 2, 1), (2, 1, 2)], "a resize's event says its sizes: readers never parse its message"
    assert [e["state"] for e in controller.feed.events if "state" in e][-1] == "succeeded"
    assert cluster.asked == [1], "below max, the run asked the autoscaler for room"
    assert cluster.withdrawn == 1, "back at max, it withdrew the request"


def test_a_drained_node_s_ranks_leave_at_the_next_checkpoint(tmp_path):
    cluster = FakeCluster(free=2)

    def checkpoint_when_asked(attempt: FakeAttempt) -> None:
        if attempt.number == 1 and not said:
            said.append(controller.drain("n2", deadline_s=60))
            cluster.free = 0
        if controller.checkpoint_wanted(attempt.number) and controller.checkpoint is None:
            controller.checkpoint = {"time": time.time() - 60}

    said: list[str] = []
    groups = FakeWorkerGroups(until_interrupted(checkpoint_when_asked), succeed)
    controller, ended = make_controller(tmp_path, groups, cluster, workers=(1, 2))
    assert run_to_end(controller, ended) == RunState.SUCCEEDED, controller.error
    assert said == ["Node n2 is draining: ranks 1 checkpoint, then the run goes on without it."]
    assert groups.sizes == [2, 1]
    assert "node 10.0.0.2 draining: ranks 1 leave at the next checkpoint (2 → 1 ranks)" in events(controller, "resize")
    assert controller.failures == []


def test_an_elastic_run_not_placed_at_its_size_starts_with_min_in_the_same_attempt_and_grows_later(tmp_path):
    """The room a run's size was read from went to another job as it asked (or Ray's free resources were read a
    moment behind): instead of waiting out placement_timeout_s and failing, the attempt starts with min."""
    cluster = FakeCluster(free=2)

    def taken_as_it_asks(start: AttemptStart) -> FakeAttempt:
        if not refused:
            refused.append(start.world_size)
            cluster.free = 0
            raise NotPlaced(start.world_size, 5.0)
        return groups.start(start)

    def room_again(attempt: FakeAttempt) -> None:
        cluster.free = 1
        if controller.checkpoint_wanted(attempt.number) and controller.checkpoint is None:
            controller.checkpoint = {"time": time.time() - 60}

    refused: list[int] = []
    groups = FakeWorkerGroups(until_interrupted(room_again), succeed)
    controller, ended = make_controller(tmp_path, groups, cluster, start_group=taken_as_it_asks, workers=(1, 2),
                                        max_failures=0, resize_interval_s=0.05)
    assert run_to_end(controller, ended) == RunState.SUCCEEDED, controller.error
    assert refused == [2]
    assert [(a.number, a.size) for a in groups.attempts] == [(1, 1), (2, 2)], "attempt 1 ran with min, then grew"
    assert events(controller, "resize") == [
        "2 ranks were not placed within 5 s (the room counted a moment before was taken, or the placement strategy "
        "cannot use it): starting with 1, growing when more room appears",
        "room for 2 ranks (now 1): growing at the next checkpoint",
        "1 → 2 ranks: resources freed up"]
    resized = [(e["attempt"], e["from_size"], e["to_size"]) for e in controller.feed.events if "to_size" in e]
    assert resized == [(1, 2, 1), (1, 1, 2)]
    assert controller.failures == [], "starting smaller is not a failure"
    assert cluster.asked == [1], "at min, the run asked the autoscaler for room for max"


def test_a_size_not_placed_is_not_grown_to_again_while_the_room_is_what_it_was(tmp_path):
    """STRICT_SPREAD over fewer nodes than ranks: the CPUs are there, the strategy cannot use them. The run goes on
    with min instead of growing, waiting and starting smaller at every checkpoint; more room than that lets it grow."""
    cluster = FakeCluster(free=2)

    def strict_spread_on_one_node(start: AttemptStart) -> FakeAttempt:
        if start.world_size == 2 and cluster.free < 3:
            raise NotPlaced(start.world_size, 5.0)
        return groups.start(start)

    def same_room_then_more(attempt: FakeAttempt, interrupt: Callable[[], Outcome | None]) -> Outcome:
        cluster.free = 1  # the run's rank holds one of the two CPUs
        for _ in range(30):  # many looks for growth (every 0.05 s) with nothing new, a checkpoint whenever asked
            checkpoint_when_asked(attempt)
            assert interrupt() is None, "the run tried to grow with no more room than when 2 ranks were not placed"
            time.sleep(0.01)
        cluster.free = 3  # a second node joins: room the run did not have when 2 ranks were not placed
        return until_interrupted(checkpoint_when_asked)(attempt, interrupt)

    def checkpoint_when_asked(attempt: FakeAttempt) -> None:
        if controller.checkpoint_wanted(attempt.number) and controller.checkpoint is None:
            controller.checkpoint = {"time": time.time() - 60}

    groups = FakeWorkerGroups(same_room_then_more, succeed)
    controller, ended = make_controller(tmp_path, groups, cluster, start_group=strict_spread_on_one_node,
                                        workers=(1, 2), resize_interval_s=0.05)
    assert run_to_end(controller, ended) == RunState.SUCCEEDED, controller.error
    assert groups.sizes == [1, 2]
    assert [m.split(":")[0] for m in events(controller, "resize")] == [
        "2 ranks were not placed within 5 s (the room counted a moment before was taken, or the placement strategy "
        "cannot use it)", "room for 2 ranks (now 1)", "1 → 2 ranks"]


def test_only_an_elastic_run_above_its_min_starts_smaller_when_not_placed():
    def elastic(workers: tuple[int, int]) -> SizingPolicy:
        return policy.for_run(RunOptions(name="unit", workers=workers), FakeCluster(free=0), lambda *said: None)

    assert elastic((2, 4)).not_placed(4, 5.0) == Resize(2, "4 ranks were not placed within 5 s (the room counted a "
                                                           "moment before was taken, or the placement strategy cannot "
                                                           "use it): starting with 2, growing when more room appears")
    assert elastic((2, 4)).not_placed(2, 5.0) is None, "at min there is nothing smaller to start with"
    assert policy.for_run(RunOptions(name="unit", workers=2), FakeCluster(free=0), lambda *said: None).not_placed(
        2, 5.0) is None, "a fixed size waits for its ranks (placement_timeout_s)"


def test_a_lost_node_with_too_little_room_left_counts_as_a_failure(tmp_path):
    cluster = FakeCluster(free=2)

    def lose_both(attempt: FakeAttempt, interrupt: Callable[[], Outcome | None]) -> Outcome:
        cluster.dead, cluster.free = {"n1", "n2"}, 0
        return Failed([Failure(rank, "died", f"Rank {rank} died", node=f"10.0.0.{rank + 1}", node_id=f"n{rank + 1}")
                       for rank in (0, 1)])

    controller, ended = make_controller(tmp_path, FakeWorkerGroups(lose_both), cluster, workers=(1, 2))
    assert run_to_end(controller, ended) == RunState.FAILED
    assert events(controller, "resize") == []


def test_a_fixed_size_run_refuses_drain_and_never_resizes(tmp_path):
    controller, _ = make_controller(tmp_path, FakeWorkerGroups(), workers=2)
    with pytest.raises(NbtrainError, match=r"run.drain\(\) needs an elastic run"):
        controller.drain("n1", deadline_s=60)
    assert controller.sizing.attempt_size(1) == 2
    assert not controller.checkpoint_wanted(1)
    with pytest.raises(NbtrainError):
        controller.sizing.resize(Resize(1, "no"))


def test_the_no_rows_note_is_said_only_of_code_that_had_time_to_report():
    """A run stopped 3 s in (its kernel shut down) was told its code reports nothing, though its cell reports."""
    assert no_rows_note_due(Stopped(), 3.0, rows=0, said_before=False) is False
    assert no_rows_note_due(Failed([Failure(0, "raised", "boom")]), 3.0, rows=0, said_before=False) is False
    assert no_rows_note_due(Succeeded([]), 0.5, rows=0, said_before=False) is True  # it returned without reporting
    assert no_rows_note_due(Stopped(), NO_ROWS_AFTER_S, rows=0, said_before=False) is True
    assert no_rows_note_due(Succeeded([]), 100.0, rows=1, said_before=False) is False
    assert no_rows_note_due(Succeeded([]), 100.0, rows=0, said_before=True) is False  # said once per run


def test_a_dead_ranks_last_printed_lines_are_in_the_runs_error(tmp_path):
    """A rank whose process died leaves no traceback: the error names it and shows what it printed last."""
    def prints_then_dies(attempt: FakeAttempt, interrupt: Callable[[], Outcome | None]) -> Outcome:
        feed.accept(1, attempt.number, 1, [], [("stdout", time.time(), "epoch 3\nloading shard 7\n")])
        feed.accept(0, attempt.number, 1, [], [("stdout", time.time(), "rank 0 is fine\n")])
        return Failed([Failure(1, "died", "Rank 1's worker process died (pid 1001 on 10.0.0.2): SIGKILL")])

    controller, ended = make_controller(tmp_path, FakeWorkerGroups(prints_then_dies), workers=2)
    feed = controller.feed
    assert run_to_end(controller, ended) == RunState.FAILED
    assert controller.error.startswith("Rank 1's worker process died (pid 1001 on 10.0.0.2): SIGKILL")
    assert controller.error.endswith("--- rank 1's last lines before its process died (attempt 1) ---\n"
                                     "epoch 3\nloading shard 7")


def test_pushes_a_rank_sent_that_never_landed_are_said(tmp_path, monkeypatch):
    """A rank that ends with pushes in flight that never arrive: the run says so, naming the rank and the count."""
    monkeypatch.setattr(missing_rows, "FINAL_PUSHES_IDLE_S", 0.2)  # the wait for them, shortened

    def three_sent_one_landed(attempt: FakeAttempt, interrupt: Callable[[], Outcome | None]) -> Outcome:
        feed.accept(0, attempt.number, 1, [{"rank": 0, "step": 1, "attempt": 1, "time": 0.0, "loss": 1.0}], [])
        attempt.pushes = {0: 3, 1: 0}
        return Succeeded([b"result"] * attempt.size)

    controller, ended = make_controller(tmp_path, FakeWorkerGroups(three_sent_one_landed), workers=2)
    feed = controller.feed
    assert run_to_end(controller, ended) == RunState.SUCCEEDED
    assert events(controller, "note") == [missing_rows.lost_pushes_note(0, 2)]
    assert "Rank 0's last 2 pushes of metric rows and log lines were sent but never reached" in events(
        controller, "note")[0]


def test_a_long_stall_is_said_once_and_its_end_once_however_many_heartbeats_come_meanwhile(tmp_path, monkeypatch):
    """A rank quiet for 12 s (stall_timeout 2 s) gets one stall event, and one when it moves again; its heartbeats
    every 0.1 s meanwhile (over a hundred) do not end the stall (they used to, and it was said 10 times a second).
    The worker table's clock is the test's: 12 s pass in a few milliseconds."""
    from types import SimpleNamespace

    from nbtrain._cluster.commands import Heartbeat, SteeringBeat
    from nbtrain._cluster.supervisor import worker_table

    clock = [1_000.0]
    monkeypatch.setattr(worker_table, "time", SimpleNamespace(time=lambda: clock[0]))
    held: dict[str, WorkerTable] = {}

    def beat(progress: float) -> Heartbeat:
        return Heartbeat(time=clock[0], step=1, state="running", last_progress=progress,
                         steering=SteeringBeat(step=1, rate=0.0, epoch=0))

    def stuck_12_s_then_moves(attempt: FakeAttempt, interrupt: Callable[[], Outcome | None]) -> Outcome:
        table, progress = held["table"], clock[0]
        table.beat(0, attempt.number, beat(progress))
        for _ in range(120):  # heartbeats every 0.1 s, no progress
            clock[0] += 0.1
            table.beat(0, attempt.number, beat(progress))
            assert interrupt() is None
        clock[0] += 0.1
        table.beat(0, attempt.number, beat(clock[0]))  # it moves again
        assert interrupt() is None
        return succeed(attempt, interrupt)

    controller, ended = make_controller(tmp_path, FakeWorkerGroups(stuck_12_s_then_moves), workers=1,
                                        stall_timeout_s=2)
    held["table"] = controller.table
    assert run_to_end(controller, ended) == RunState.SUCCEEDED
    stalls = events(controller, "stall")
    assert len(stalls) == 2, stalls
    assert stalls[0].startswith("Rank 0 made no progress for 2 s (stall_timeout=2 s)"), stalls[0]
    again = re.match(r"Rank 0 made progress again after (\d+) s", stalls[1])
    assert again is not None and int(again[1]) >= 12, stalls[1]


def test_a_stalled_rank_under_on_stall_fail_ends_the_run_saying_why(tmp_path, monkeypatch):
    """``on_stall="fail"``: the attempt ends at the stall (after asking the ranks where they are, here no answer in
    the test's short wait) and the run fails, its error naming the rank and the timeout."""
    from types import SimpleNamespace

    from nbtrain._cluster.commands import Heartbeat, SteeringBeat
    from nbtrain._cluster.supervisor import stall_stacks, worker_table

    clock = [1_000.0]
    monkeypatch.setattr(worker_table, "time", SimpleNamespace(time=lambda: clock[0]))
    monkeypatch.setattr(stall_stacks, "WAIT_S", 0.05)
    held: dict[str, WorkerTable] = {}

    def silent(attempt: FakeAttempt, interrupt: Callable[[], Outcome | None]) -> Outcome:
        progress = clock[0]
        for _ in range(100):
            held["table"].beat(0, attempt.number, Heartbeat(time=clock[0], step=1, state="running",
                                                            last_progress=progress,
                                                            steering=SteeringBeat(step=1, rate=0.0, epoch=0)))
            outcome = interrupt()
            if outcome is not None:
                return outcome
            clock[0] += 0.5
        pytest.fail("the controller never ended the stalled attempt")

    controller, ended = make_controller(tmp_path, FakeWorkerGroups(silent), workers=1, stall_timeout_s=2,
                                        on_stall="fail")
    held["table"] = controller.table
    assert run_to_end(controller, ended) == RunState.FAILED
    assert controller.error is not None
    assert "Rank 0 made no progress for" in controller.error and "stall_timeout=2 s" in controller.error
    assert len(events(controller, "stall")) == 1


def test_a_stop_recorded_before_the_supervisor_died_is_kept_by_the_next_one(tmp_path, monkeypatch):
    """``stop()`` records the request in the run's storage before acting on it; a supervisor that dies right then
    comes back (Ray restarts it) as stopped, with no new worker group. The real restart of a killed supervisor is
    in test_fault_tolerance.py; here the next supervisor's controller reads what the first one saved."""
    from nbtrain._cluster.supervisor import controller as controller_module

    left: list[int] = []
    monkeypatch.setattr(controller_module, "remove_leftover_group", lambda spec, attempt: left.append(attempt))
    groups = FakeWorkerGroups(until_interrupted(lambda attempt: groups.running.set()))
    first, _ = make_controller(tmp_path, groups, workers=2)
    first.start()
    assert groups.running.wait(10)
    try:
        first._storage.save_state({**first._storage.load_state(), "stop_requested": True})  # stop()'s first step
        after = FakeWorkerGroups()
        second, _ = make_controller(tmp_path, after)  # the restarted supervisor takes up the run's files
        assert second.state == RunState.STOPPED and second.attempt == 1
        assert after.attempts == [], "the restarted supervisor started a new worker group despite the stop"
        assert left == [1], "the group the dead supervisor left was not removed"
        assert any("restarted while stopping" in message for message in events(second, "state"))
    finally:
        first.request_stop(timeout=10)


class Witness(ControllerCallback):
    """A callback of the test's own: writes down each hook it is told of, in order."""

    def __init__(self, end_after_ticks: int | None = None) -> None:
        self.seen: list[str] = []
        self._end_after = end_after_ticks

    def on_run_start(self, run: RunView) -> None:
        self.seen.append("run start")

    def on_attempt_start(self, run: RunView) -> None:
        self.seen.append(f"attempt {run.attempt} start")

    def on_report_batch(self, run: RunView, rows: list[dict[str, Any]], nan_rows: list[dict[str, Any]]) -> None:
        self.seen.append(f"report {len(rows)} rows, {len(nan_rows)} NaN")

    def on_watch_tick(self, run: RunView) -> Outcome | None:
        if not self.seen[-1].startswith("tick"):
            self.seen.append("tick")
        if self._end_after is not None:
            self._end_after -= 1
            if self._end_after == 0:
                return Stopped()
        return None

    def on_attempt_end(self, run: RunView, outcome: Outcome, group: Any, ran_s: float) -> None:
        self.seen.append(f"attempt {run.attempt} end: {type(outcome).__name__}")

    def on_run_end(self, run: RunView, state: RunState) -> None:
        assert run.state != state, "told before the final state is recorded"
        self.seen.append(f"run end: {state.value}")


def test_a_callback_is_told_each_hook_in_order(tmp_path):
    """Two attempts (a failure, then a success): the run's start, each attempt's start, its reports and watch ticks
    and end, the run's end, once each and in that order."""
    def reports_then_fails(attempt: FakeAttempt, interrupt: Callable[[], Outcome | None]) -> Outcome:
        controller.report_batch([{"rank": 0, "step": 1, "loss": 1.0}], [])
        assert interrupt() is None
        return raise_at_step(attempt, interrupt)

    def ticks_then_succeeds(attempt: FakeAttempt, interrupt: Callable[[], Outcome | None]) -> Outcome:
        assert interrupt() is None and interrupt() is None
        return succeed(attempt, interrupt)

    witness = Witness()
    controller, ended = make_controller(tmp_path, FakeWorkerGroups(reports_then_fails, ticks_then_succeeds),
                                        callbacks=[witness], workers=1, max_failures=1)
    assert run_to_end(controller, ended) == RunState.SUCCEEDED
    assert witness.seen == ["run start", "attempt 1 start", "report 1 rows, 0 NaN", "tick", "attempt 1 end: Failed",
                            "attempt 2 start", "tick", "attempt 2 end: Succeeded", "run end: succeeded"]


def test_a_callbacks_outcome_ends_the_attempt_at_its_tick(tmp_path):
    """A watch tick's answer is the attempt's outcome: here a stop on the third tick ends the run stopped."""
    witness = Witness(end_after_ticks=3)
    groups = FakeWorkerGroups(until_interrupted())
    controller, ended = make_controller(tmp_path, groups, callbacks=[witness], workers=1)
    assert run_to_end(controller, ended) == RunState.STOPPED
    assert witness.seen[-2:] == ["attempt 1 end: Stopped", "run end: stopped"]
    assert groups.attempts[0].shut_down


def test_the_failure_policy_handed_in_is_the_one_asked(tmp_path):
    """The controller builds no policy: a budget of two failures handed to a run launched with max_failures=0
    restarts it twice (the count it keeps is the policy's)."""
    handed = FailurePolicy(max_failures=2)
    groups = FakeWorkerGroups(raise_at_step, raise_at_step, succeed)
    controller, ended = make_controller(tmp_path, groups, failures=handed, workers=1, max_failures=0)
    assert run_to_end(controller, ended) == RunState.SUCCEEDED
    assert controller.failure_policy is handed and handed.failed_attempts == 2


def test_the_sizing_policy_handed_in_sizes_each_attempt(tmp_path):
    """The attempts' sizes are the handed policy's, whatever the run's options say (a fixed size of 2 here)."""
    class ThreeThenOne:
        def __init__(self) -> None:
            self.ended = False

        def attempt_size(self, attempt: int) -> int:
            return 3 if attempt == 1 else 1

        def tick(self, checkpoint: dict[str, Any] | None, ranks: Any) -> Resize | None:
            return None

        def after_failure(self, died_on: dict[str, str]) -> Resize | None:
            return None

        def not_placed(self, size: int, waited_s: float) -> Resize | None:
            return None

        def resize(self, resize: Resize) -> None:
            pass

        def drain(self, node_id: str, deadline_s: float, ranks: Any) -> str:
            return "drained"

        def checkpoint_wanted(self, attempt: int) -> bool:
            return False

        def end(self) -> None:
            self.ended = True

    sizing = ThreeThenOne()
    groups = FakeWorkerGroups(raise_at_step, succeed)
    controller, ended = make_controller(tmp_path, groups, sizing=sizing, workers=2, max_failures=1)
    assert run_to_end(controller, ended) == RunState.SUCCEEDED
    assert groups.sizes == [3, 1]
    assert sizing.ended, "the run's end was told to the sizing policy (the resizes callback)"


def test_a_nan_under_stop_on_nan_fails_the_run_once_said(tmp_path):
    """The NaN concern as a callback: a report batch holding NaN is said once, and the next watch tick ends the
    attempt with a failure that is not retried."""
    def reports_nan(attempt: FakeAttempt, interrupt: Callable[[], Outcome | None]) -> Outcome:
        row = {"rank": 0, "step": 7, "loss": float("nan")}
        controller.report_batch([row], [row])
        controller.report_batch([row], [row])
        return until_interrupted()(attempt, interrupt)

    controller, ended = make_controller(tmp_path, FakeWorkerGroups(reports_nan), workers=1, max_failures=3,
                                        stop_on_nan=True)
    assert run_to_end(controller, ended) == RunState.FAILED
    assert events(controller, "nan") == ["Rank 0 reported NaN for loss at step 7; stopping the run (stop_on_nan)."]
    assert controller.attempt == 1
