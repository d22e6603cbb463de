"""launch(datasets=...) gives each rank its own shard of a Ray Dataset, in-memory ones included."""

from __future__ import annotations

import numpy as np
import pytest

import nbtrain

pytestmark = pytest.mark.cluster


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
