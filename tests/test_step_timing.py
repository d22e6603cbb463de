"""Where each rank's step time goes (data wait, compute, gradient communication), and stragglers.

The cluster test runs 2 DDP ranks on the session's loopback cluster; rank 1's dataset sleeps in
``__getitem__``, so its steps wait for data and rank 0 waits for it in the all-reduce. Rank 1 must
be flagged a straggler (an event, and ``straggler`` in its worker row) with its time under data
wait, rank 0's under communication; a communication hook the user registers after ``prepare_model``
still runs (inside the timing hook). The quick tests drive the straggler watch and the step clock.
"""

from __future__ import annotations

import time

import pytest
import torch

import nbtrain
from nbtrain._cluster.rank.inspection.step_timing import StepTimes
from nbtrain._cluster.supervisor.stragglers import StragglerWatch

from _helpers import wait_for
from _train_fns import TinyNet


class SlowOnOneRank(torch.utils.data.Dataset):
    """Each sample takes ``delay`` seconds to load on rank ``slow_rank``, none elsewhere."""

    def __init__(self, slow_rank, delay):
        self.slow_rank = slow_rank
        self.delay = delay

    def __len__(self):
        return 100_000

    def __getitem__(self, index):
        if nbtrain.get_context().rank == self.slow_rank:
            time.sleep(self.delay)
        return torch.full((8,), float(index % 7)), torch.ones(1)


def train_with_a_slow_loader(config):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    model = nbtrain.prepare_model(TinyNet())
    calls = [0]

    def counting_hook(state, bucket):
        calls[0] += 1
        return default_hooks.allreduce_hook(state, bucket)

    model.register_comm_hook(None, counting_hook)  # the user's own hook, after prepare_model
    loader = nbtrain.prepare_loader(torch.utils.data.DataLoader(SlowOnOneRank(1, config["delay"]), batch_size=4))
    opt = torch.optim.SGD(model.parameters(), lr=0.001)
    for step, (x, y) in enumerate(loader, start=1):  # a count, not a clock: every rank stops at the same step
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        nbtrain.report(loss=loss.item(), hook_calls=calls[0])
        if step == config["steps"]:
            break


def test_a_rank_slowed_in_its_data_loader_is_flagged_with_its_time_under_data_wait(cluster):
    run = nbtrain.launch(train_with_a_slow_loader, config={"delay": 0.01, "steps": 600}, workers=2,
                         name="slow-loader", straggler_window_s=2.0)
    event = wait_for(lambda: next((e for e in run.events if e["kind"] == "straggler"), None), 120,
                     message="a straggler event", describe=lambda: run.workers)
    assert event["message"].startswith("Rank 1 is a straggler: "), event
    assert "data wait" in event["message"] and "wait for it in their gradient all-reduce" in event["message"]
    workers = {w["rank"]: w for w in run.workers}
    slow, fast = workers[1], workers[0]
    assert slow["straggler"] is True and not fast.get("straggler")
    assert slow["data_ms"] > 25 and slow["data_ms"] > 0.6 * slow["step_ms"], slow   # 4 samples x 10 ms
    assert fast["comm_ms"] > 20 and fast["data_ms"] < 10, fast                      # waits in the all-reduce
    for worker in (slow, fast):
        parts = worker["data_ms"] + worker["compute_ms"] + worker["comm_ms"]
        assert abs(parts - worker["step_ms"]) < 0.5, worker
        assert worker["cpu_percent"] is not None and worker["rss_mb"] > 0
    assert [e for e in run.events if e["kind"] == "straggler"] == [event]  # said once
    assert run.stop() == nbtrain.RunState.STOPPED  # seen: its last 20 s of steps would show nothing more
    while run.refresh():  # every row it left
        pass
    hook_calls = {rank: max(row.get("hook_calls", 0) for row in run.metrics if row["rank"] == rank) for rank in (0, 1)}
    assert all(calls > 0 for calls in hook_calls.values()), hook_calls  # the user's hook ran, inside the timing hook


@pytest.mark.quick
def test_a_straggler_is_flagged_once_after_the_window_and_cleared_after_it():
    watch = StragglerWatch(window_s=10.0)

    def workers(slow_ms):
        return [{"rank": 0, "state": "running", "step_ms": 100.0, "comm_ms": 60.0, "data_ms": 1.0, "compute_ms": 39.0},
                {"rank": 1, "state": "running", "step_ms": 100.0, "comm_ms": 100.0 - slow_ms, "data_ms": slow_ms - 40,
                 "compute_ms": 40.0},
                {"rank": 2, "state": "running", "step_ms": 100.0, "comm_ms": 60.0, "data_ms": 1.0, "compute_ms": 39.0}]

    assert watch.look(workers(100.0), attempt=1, now=0.0) == []
    assert watch.look(workers(100.0), attempt=1, now=9.0) == []
    ((rank, flagged, message),) = watch.look(workers(100.0), attempt=1, now=10.5)
    assert (rank, flagged) == (1, True)
    assert message.startswith("Rank 1 is a straggler: 100 ms (data wait 60 ms, compute 40 ms) of its own per step, "
                              "2.5× the median of the ranks (40 ms) for 10 s")
    assert watch.look(workers(100.0), attempt=1, now=30.0) == []  # once per episode
    assert watch.look(workers(41.0), attempt=1, now=31.0) == []
    ((rank, flagged, message),) = watch.look(workers(41.0), attempt=1, now=41.5)
    assert (rank, flagged) == (1, False) and message.startswith("Rank 1 is no longer a straggler")
    assert watch.look(workers(100.0), attempt=2, now=42.0) == []  # a new attempt starts afresh
    assert watch.flagged == set()


@pytest.mark.quick
def test_the_step_clock_splits_each_step_and_leaves_out_the_time_between_epochs():
    timing = StepTimes()
    for _ in range(3):
        timing.batch(0.0)
        time.sleep(0.02)
    timing.pause()
    time.sleep(0.2)  # evaluation between epochs: no step's
    timing.batch(0.01)
    time.sleep(0.02)
    timing.batch(0.01)
    time.sleep(1.0 - 0.06)
    timing.comm_s += 0.015
    window = timing.window()
    assert window.keys() == {"step_ms", "data_ms", "comm_ms", "compute_ms"}
    assert 19 < window["step_ms"] < 40, window  # 3 steps of ~20 ms, not the 0.2 s pause
    assert abs(window["data_ms"] - 10 / 3) < 0.5 and abs(window["comm_ms"] - 5) < 0.5  # the 1st wait is no step's
    assert abs(sum(window[k] for k in ("data_ms", "comm_ms", "compute_ms")) - window["step_ms"]) < 1e-6


@pytest.mark.quick
def test_the_worker_table_shows_the_split_and_the_flagged_straggler():
    from nbtrain._views.dashboard.step_time_plot import debug_hint
    from nbtrain._views.dashboard.workers_view import stragglers, worker_table

    workers = [{"rank": 0, "state": "running", "step": 50, "step_ms": 42.0, "data_ms": 1.0, "compute_ms": 2.0,
                "comm_ms": 39.0, "cpu_percent": 35.0, "rss_mb": 700.0},
               {"rank": 1, "state": "running", "step": 50, "step_ms": 42.0, "data_ms": 40.0, "compute_ms": 2.0,
                "comm_ms": 0.0, "cpu_percent": 5.0, "rss_mb": 710.0, "straggler": True}]
    assert stragglers(workers) == [1]  # flagged by the supervisor, though not behind in steps
    table = worker_table(workers, set(stragglers(workers)), {})
    assert '<td class="nbtrain-worker-split">1 · 2 · 39</td><td>35%</td>' in table
    assert 'title="straggler: its own step time stays well above the median"' in table
    failed = {"state": "failed", "failures": [
        {"rank": 0, "kind": "raised", "attempt": 1, "secondary": True},
        {"rank": 1, "kind": "raised", "attempt": 1, "secondary": False}]}
    assert "<code>%ray_debug cifar --rank 1</code>" in debug_hint("cifar", failed)
    assert debug_hint("cifar", {"state": "failed", "failures": [{"rank": 1, "kind": "died", "attempt": 1}]}) == ""


@pytest.mark.quick
def test_the_sidebar_is_served_the_live_stragglers():
    from nbtrain import _json
    from nbtrain._lab.record_checks import record_problem
    from nbtrain._lab.run_list import ClusterAnswers, served_runs
    from nbtrain._registry import record_from_summary

    address = "ray://127.0.0.1:10001"
    summary = {"name": "slow", "state": "running", "now": 100.0, "started": 1.0, "workers": [
        {"rank": 0, "state": "running"}, {"rank": 1, "state": "running", "straggler": True},
        {"rank": 2, "state": "finished", "straggler": True}]}
    record = record_from_summary(summary, address)
    assert record["stragglers"] == [1]
    answers = ClusterAnswers()
    answers.store(address, _json.dumps({"address": address, "runs": [record]}), received=100.0)
    (served,) = served_runs([], answers, now=100.0, stale_after=60.0)
    assert served["stragglers"] == [1] and not served["malformed"]
    assert record_problem({**record, "stragglers": ["1"]}) == "its 'stragglers' is not a list of ranks"
