"""DDP on a real loopback cluster really synchronises ranks, and results come back."""

from __future__ import annotations

import time

import pytest

import nbtrain

from _train_fns import TinyNet, train_regression


def test_ranks_end_with_identical_parameters(cluster):
    run = nbtrain.launch(train_regression, config={"epochs": 2, "init_seed": 0}, workers=2, name="ddp-sync")
    assert run.wait(timeout=180) == nbtrain.RunState.SUCCEEDED
    rank0, rank1 = run.result
    assert rank0 == pytest.approx(rank1, abs=1e-9), "DDP ranks diverged: gradients were not all-reduced"

    solo = nbtrain.launch(train_regression, config={"epochs": 2, "init_seed": 0, "data_seed": 1},
                          workers=1, name="ddp-solo")
    assert solo.wait(timeout=180) == nbtrain.RunState.SUCCEEDED
    assert solo.result[0] != pytest.approx(rank0, abs=1e-6), "a single worker on other data ended identical"


def test_every_rank_reports_and_the_loader_is_sharded(cluster):
    run = nbtrain.launch(train_regression, config={"epochs": 1}, workers=2, name="ddp-shards")
    run.wait(timeout=180)
    rows = run.metrics
    per_rank = {rank: sorted(r["step"] for r in rows if r["rank"] == rank) for rank in (0, 1)}
    # 256 samples, batch 16, 2 ranks → 8 steps each (a DistributedSampler shard), not 16
    assert per_rank[0] == list(range(1, 9))
    assert per_rank[1] == list(range(1, 9))
    assert all({"rank", "step", "attempt", "time", "loss"} <= set(r) for r in rows)


def test_checkpoint_saved_by_rank0_loads_in_the_notebook(cluster):
    def train(config):
        model = nbtrain.prepare_model(TinyNet())
        nbtrain.save_checkpoint({"model": model.state_dict(), "epoch": 3})
        return nbtrain.get_context().world_size

    run = nbtrain.launch(train, workers=2, name="ckpt-roundtrip")
    run.wait(timeout=120)
    checkpoint = run.load_checkpoint()
    assert checkpoint["epoch"] == 3
    restored = TinyNet()
    restored.load_state_dict(checkpoint["model"])  # plain (unwrapped) keys: no "module." prefix
    assert run.result == [2, 2]


def test_function_without_config_and_worker_context(cluster):
    def train():
        ctx = nbtrain.get_context()
        print(f"hello from rank {ctx.rank} of {ctx.world_size} on {ctx.device}")
        return (ctx.rank, ctx.local_rank, ctx.world_size, str(ctx.device))

    run = nbtrain.launch(train, workers=2, name="no-config")
    run.wait(timeout=120)
    assert run.result == [(0, 0, 2, "cpu"), (1, 1, 2, "cpu")]
    assert "hello from rank 1 of 2 on cpu" in run.logs(rank=1)


def test_stop_frees_the_placement_group(cluster):
    import ray

    total = ray.cluster_resources()["CPU"]
    run = nbtrain.launch(train_regression, config={"epochs": 50, "sleep": 0.05}, workers=2, name="stop-me")
    deadline = time.monotonic() + 120
    while not run.metrics and time.monotonic() < deadline:
        time.sleep(0.2)
    assert run.state == nbtrain.RunState.RUNNING
    began = time.monotonic()
    assert run.stop() == nbtrain.RunState.STOPPED
    stopped_in = time.monotonic() - began
    assert stopped_in < 10, f"stop() took {stopped_in:.1f} s"
    deadline = time.monotonic() + 10
    while ray.available_resources().get("CPU", 0) < total and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0) == total, "the run's CPUs were not given back"
    assert [w["state"] for w in run.workers] == ["stopped", "stopped"]
