"""Elastic runs (``workers=(min, max)``) on the loopback cluster: start with what fits, grow at a checkpoint.

Shrinking on a lost node needs a second node: ``tests/test_multi_node.py``.
"""

from __future__ import annotations

import time

import pytest
import ray
from ray.util.placement_group import placement_group, remove_placement_group

import nbtrain

from _train_fns import elastic_train


def _wait_for(condition, timeout: float, what: str, picture=lambda: "") -> None:
    """``picture``: what the cluster and the run looked like, said when the wait times out."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{picture()}")
        time.sleep(0.2)


def _picture(run) -> str:
    """The run's state, workers and events, and the cluster's free resources: what a timed-out wait needs to be
    understood (it once timed out in a full run and passed alone)."""
    events = "\n".join(f"  {e['time']:.1f} {e['kind']}: {e['message']}" for e in run.events)
    groups = [(g["name"], g["state"], g["bundles"]) for g in ray.util.placement_group_table().values()
              if g["state"] != "REMOVED"]
    return (f"run {run.name}: {run.state.value}, workers {run.workers}\nfree: {ray.available_resources()}\n"
            f"placement groups: {groups}\nevents:\n{events}")


@ray.remote(num_cpus=0)
def _standing_request() -> list[dict]:
    from nbtrain._ray_compat import standing_request

    return standing_request()


def test_starts_with_what_fits_and_grows_at_a_checkpoint_when_resources_free_up(cluster):
    # what earlier tests' runs held must be free first: a CPU freed later would let the run grow at once
    total = int(ray.cluster_resources()["CPU"])
    _wait_for(lambda: int(ray.available_resources().get("CPU", 0)) == total, 60, "every CPU of the cluster free")
    blocker = placement_group([{"CPU": total - 1}])  # leaves 1 CPU: room for 1 of the 2 ranks
    ray.get(blocker.ready(), timeout=30)
    try:
        run = nbtrain.launch(elastic_train, config={"steps": 80, "step_time": 0.1, "every": 1000},
                             workers=(1, 2), resize_interval_s=1, name="elastic-grow")
        _wait_for(lambda: any(w["step"] >= 3 for w in run.workers) and run.state == nbtrain.RunState.RUNNING,
                  90, "the run stepping on 1 rank", lambda: _picture(run))
        assert run.summary()["world_size"] == 1
        # below max, it asks an autoscaling cluster for room for max ranks (what the autoscaler reads)
        assert ray.get(_standing_request.remote()) == [{"CPU": 1.0}] * 2
    finally:
        remove_placement_group(blocker)
    assert run.wait(timeout=180) == nbtrain.RunState.SUCCEEDED, run.error
    assert ray.get(_standing_request.remote()) == [], "the request ends with the run"

    rows = run.metrics
    keys = [(r["attempt"], r["rank"], r["step"]) for r in rows]
    assert len(keys) == len(set(keys)), "no (attempt, rank, step) row twice"
    first = [r for r in rows if r["attempt"] == 1]
    grown = [r for r in rows if r["attempt"] == 2]
    assert {r["world_size"] for r in first} == {1} and {r["rank"] for r in first} == {0}
    assert {r["world_size"] for r in grown} == {2} and {r["rank"] for r in grown} == {0, 1}
    # the global batch stays that of min=1 rank (8): each of 2 ranks takes 4
    assert {r["batch"] for r in first} == {8} and {r["batch"] for r in grown} == {4}
    resumed = {r["resumed_from"] for r in grown}
    assert len(resumed) == 1 and resumed.pop() > 0, "attempt 2 resumed from the checkpoint asked for"
    assert min(r["step"] for r in grown) == grown[0]["resumed_from"] + 1
    assert grown[0]["resumed_from"] in {r["step"] for r in first}, "no step lost before the checkpoint"
    assert max(r["step"] for r in grown if r["rank"] == 0) == 80
    said = [e["message"] for e in run.events if e["kind"] == "resize"]
    assert any("room for 2 ranks" in m for m in said) and any("1 → 2 ranks" in m for m in said), said
    assert run.summary()["world_size"] == 2
    assert not run.summary()["failures"], "growing is not a failure"



@pytest.mark.quick
@pytest.mark.parametrize("scale_lr,size,expected", [
    (None, 4, (0.5, 1.0)), (None, 2, (1.0, 1.0)), ("linear", 4, (1.0, 2.0)), ("sqrt", 8, (1.0, 2.0)),
])
def test_a_new_world_size_scales_the_batch_or_the_learning_rate(scale_lr, size, expected):
    from nbtrain._cluster.elastic.sizing import scaling
    from nbtrain._options import RunOptions

    assert scaling(RunOptions(workers=(2, 8), scale_lr=scale_lr), size) == expected
    assert scaling(RunOptions(workers=4, scale_lr=scale_lr), 4) == (1.0, 1.0), "fixed-size runs are left alone"
