"""launch(datasets=...) gives each rank its own shard of a Ray Dataset, in-memory ones included."""

from __future__ import annotations

import numpy as np
import pytest

import nbtrain


def count_my_rows(config):
    seen = []
    for batch in nbtrain.get_dataset_shard("train").iter_torch_batches(batch_size=16):
        seen += batch["x"].tolist()
    return sorted(seen)


def test_each_rank_iterates_a_disjoint_shard_of_an_in_memory_dataset(cluster):
    import ray

    dataset = ray.data.from_numpy(np.arange(64)).map_batches(lambda b: {"x": b["data"] * 10})
    run = nbtrain.launch(count_my_rows, workers=2, datasets={"train": dataset}, name="datasets-shards")
    assert run.wait(timeout=240) == nbtrain.RunState.SUCCEEDED
    rank0, rank1 = run.result
    assert len(rank0) == len(rank1) == 32
    assert sorted(rank0 + rank1) == [10 * i for i in range(64)]


def test_asking_for_a_missing_dataset_names_the_ones_there(cluster):
    def wrong_name(config):
        nbtrain.get_dataset_shard("valid")

    run = nbtrain.launch(wrong_name, workers=1, name="datasets-missing")
    run.wait(timeout=120, raise_on_failure=False)
    assert "No dataset named 'valid' was passed to launch(datasets=...); this run has: none." in run.error


def test_ranks_that_would_take_every_cpu_leave_ray_data_one(cluster):
    """Two ranks of 2 CPUs on the 4-CPU session cluster would leave Ray Data's map task no CPU (it waited
    for ever): the ranks reserve 1.5 CPU each instead, the run says so, and it ends."""
    import ray

    dataset = ray.data.from_numpy(np.arange(64)).map_batches(lambda b: {"x": b["data"] * 10})
    cpus = sum(node["Resources"].get("CPU", 0) for node in ray.nodes() if node["Alive"])
    run = nbtrain.launch(count_my_rows, workers=2, cpus_per_worker=cpus / 2, datasets={"train": dataset},
                         name="datasets-room")
    assert run.wait(timeout=240) == nbtrain.RunState.SUCCEEDED, run.error
    assert sorted(run.result[0] + run.result[1]) == [10 * i for i in range(64)]
    notes = [event["message"] for event in run.events if event["kind"] == "note" and "Ray Data" in event["message"]]
    assert notes == [f"Ray Data needs a CPU for its tasks beside the ranks: each of the 2 ranks reserves "
                     f"{(cpus - 1) / 2:g} CPU instead of {cpus / 2:g} on this {cpus:g}-CPU cluster (a reservation, "
                     "not a limit: the ranks still use every core)"]


@pytest.mark.quick
def test_a_cluster_with_no_cpu_to_spare_refuses_a_run_with_datasets():
    from nbtrain._client.launching.room import leave_room_for_data
    from nbtrain._exceptions import ResourcesUnavailableError
    from nbtrain._options import RunOptions

    options = RunOptions(workers=2)  # of a run with datasets=
    shrunk, note = leave_room_for_data(options, 3.0)
    assert shrunk.cpus_per_worker == 1.0 and note is None  # 2 ranks + 1 CPU for Data fit in 3
    shrunk, note = leave_room_for_data(options, 2.0)
    assert shrunk.cpus_per_worker == 0.5 and "reserves 0.5 CPU instead of 1" in (note or "")
    with pytest.raises(ResourcesUnavailableError, match="Ray Data's read and map tasks need 1 CPU beside the 2 "
                                                        "ranks, and this cluster has 1 CPU in all"):
        leave_room_for_data(options, 1.0)
