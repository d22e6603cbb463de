"""The --gpus-per-worker path without GPUs: rank layout and backend choice.

There is no GPU on this machine, so the places below are *fakes* of what Ray
reports on a two-node, two-GPUs-per-node cluster; the real NCCL path is
exercised on a GPU machine when one is lent (see the issue's closing note).
"""

from __future__ import annotations

import pytest

from nbtrain._cluster.supervisor.rank_layout import layout_ranks
from nbtrain._options import RunOptions

pytestmark = pytest.mark.quick


def _place(node: str, gpus: list[str]) -> dict:
    return {"node_id": node, "node_ip": f"10.0.0.{node[-1]}", "gpu_ids": gpus, "port": 1234}


def test_two_nodes_two_gpus_each_give_local_ranks_and_visible_devices():
    places = [_place("node1", ["1"]), _place("node2", ["0"]), _place("node1", ["0"]), _place("node2", ["1"])]
    layout = layout_ranks(places, gpus_per_worker=1)
    assert [entry["local_rank"] for entry in layout] == [0, 0, 1, 1]
    assert [entry["node_rank"] for entry in layout] == [0, 1, 0, 1]
    assert [entry["cuda_visible_devices"] for entry in layout] == ["0,1"] * 4
    assert [entry["device_name"] for entry in layout] == ["cuda:1", "cuda:0", "cuda:0", "cuda:1"]


def test_cpu_workers_get_no_gpu():
    layout = layout_ranks([_place("node1", []), _place("node1", [])], gpus_per_worker=0)
    assert [entry["device_name"] for entry in layout] == ["cpu", "cpu"]
    assert all(entry["cuda_visible_devices"] is None for entry in layout)


def test_backend_is_nccl_on_gpus_and_gloo_on_cpus():
    assert RunOptions(gpus_per_worker=1).resolved_backend == "nccl"
    assert RunOptions().resolved_backend == "gloo"


# FAKE_GPU: a device descriptor of a GPU this machine lacks (torch builds one without CUDA); the
# decisions below are what a rank on GPU 3 of its node makes, checked without the GPU itself.
FAKE_GPU = "cuda:3"


def test_ddp_on_a_gpu_rank_names_its_own_device_and_keeps_user_arguments():
    import torch

    from nbtrain._cluster.rank.parallel import ddp_arguments

    assert ddp_arguments(torch.device(FAKE_GPU), {}) == {"device_ids": [3]}
    assert ddp_arguments(torch.device(FAKE_GPU), {"device_ids": [0], "bucket_cap_mb": 50}) == {
        "device_ids": [0], "bucket_cap_mb": 50}
    assert ddp_arguments(torch.device("cpu"), {"bucket_cap_mb": 50}) == {"bucket_cap_mb": 50}


def test_a_lightning_trainer_on_a_gpu_rank_uses_that_one_gpu():
    import torch

    from nbtrain.lightning import trainer_defaults

    on_gpu = trainer_defaults(torch.device(FAKE_GPU))
    assert (on_gpu["accelerator"], on_gpu["devices"], on_gpu["num_nodes"]) == ("gpu", 1, 1)
    assert trainer_defaults(torch.device("cpu"))["accelerator"] == "cpu"


def test_each_precision_choice_has_its_autocast_dtype():
    import torch

    from nbtrain._cluster.rank.parallel import AUTOCAST_DTYPES
    from nbtrain._options import PRECISION_CHOICES

    assert {name: getattr(torch, AUTOCAST_DTYPES[name]) for name in PRECISION_CHOICES} == {
        "bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}
