"""Ray Train v2 code runs unchanged on nbtrain's ranks, and nbtrain.TorchTrainer is a drop-in for Ray's.

The first test is the training function of Ray Train's PyTorch user guide
("Get started with PyTorch"), as it is written there, with one change: the data set
is torchvision's FakeData of FashionMNIST's shape (nothing downloads at test time)
and it is small. Each other test pins one of the Ray Train APIs nbtrain answers
through Ray Train's internal seam (nbtrain/_cluster/rank/ray_train/seam.py), so a Ray
release that changes the seam fails here by name.
"""

from __future__ import annotations

import os
import tempfile

import pytest
import ray.data
import ray.train
import ray.train.torch
import torch
from ray.train import ScalingConfig
from torch.nn import CrossEntropyLoss
from torch.optim import Adam
from torch.utils.data import DataLoader
from torchvision.datasets import FakeData
from torchvision.models import resnet18
from torchvision.transforms import Compose, Normalize, ToTensor

import nbtrain


# --- Ray Train's user guide example (data set: FakeData instead of FashionMNIST; epochs and size from config) ---
def train_func(config):
    # Model, Loss, Optimizer
    model = resnet18(num_classes=10)
    model.conv1 = torch.nn.Conv2d(1, 64, kernel_size=(7, 7), stride=(2, 2), padding=(3, 3), bias=False)
    # [1] Prepare model.
    model = ray.train.torch.prepare_model(model)
    # model.to("cuda")  # This is done by `prepare_model`
    criterion = CrossEntropyLoss()
    optimizer = Adam(model.parameters(), lr=0.001)

    # Data
    transform = Compose([ToTensor(), Normalize((0.28604,), (0.32025,))])
    train_data = FakeData(size=config["size"], image_size=(1, 28, 28), num_classes=10, transform=transform)
    train_loader = DataLoader(train_data, batch_size=16, shuffle=True)
    # [2] Prepare dataloader.
    train_loader = ray.train.torch.prepare_data_loader(train_loader)

    # Training
    for epoch in range(config["epochs"]):
        if ray.train.get_context().get_world_size() > 1:
            train_loader.sampler.set_epoch(epoch)

        for images, labels in train_loader:
            # This is done by `prepare_data_loader`!
            # images, labels = images.to("cuda"), labels.to("cuda")
            outputs = model(images)
            loss = criterion(outputs, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        # [3] Report metrics and checkpoint.
        metrics = {"loss": loss.item(), "epoch": epoch}
        with tempfile.TemporaryDirectory() as temp_checkpoint_dir:
            torch.save(model.module.state_dict(), os.path.join(temp_checkpoint_dir, "model.pt"))
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(temp_checkpoint_dir))
        if ray.train.get_context().get_world_rank() == 0:
            print(metrics)


def test_the_user_guide_example_runs_unchanged_under_the_drop_in_trainer(cluster):
    # [4] Configure scaling and resource requirements. (use_gpu=False: this machine has no GPU)
    scaling_config = ScalingConfig(num_workers=2, use_gpu=False)
    # [5] Launch distributed training job: the one changed line is the import of TorchTrainer.
    trainer = nbtrain.TorchTrainer(train_func, train_loop_config={"size": 64, "epochs": 2},
                                   scaling_config=scaling_config,
                                   run_config=ray.train.RunConfig(name="raytrain-guide"))
    result = trainer.fit()

    assert isinstance(result, ray.train.Result)
    assert result.error is None
    assert result.metrics["epoch"] == 1 and result.metrics["loss"] > 0
    # every rank's every report streamed, not only rank 0's
    rows = trainer.run.metrics
    assert sorted((r["rank"], r["epoch"]) for r in rows) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert "{'loss':" in trainer.run.logs(rank=0) and "'epoch': 1}" in trainer.run.logs(rank=0)
    # [6] Load the trained model.
    with result.checkpoint.as_directory() as checkpoint_dir:
        model_state_dict = torch.load(os.path.join(checkpoint_dir, "model.pt"))
        model = resnet18(num_classes=10)
        model.conv1 = torch.nn.Conv2d(1, 64, kernel_size=(7, 7), stride=(2, 2), padding=(3, 3), bias=False)
        model.load_state_dict(model_state_dict)
    # the same checkpoint through the run handle, as Ray Train's Checkpoint type
    loaded = nbtrain.attach("raytrain-guide").load_checkpoint()
    assert isinstance(loaded, ray.train.Checkpoint)
    assert os.listdir(loaded.path) == ["model.pt"]


def test_context_device_loader_and_collectives_answer_for_each_rank(cluster):
    def train(config):
        import ray.train.collective

        ctx = ray.train.get_context()
        loader = ray.train.torch.prepare_data_loader(
            DataLoader(torch.utils.data.TensorDataset(torch.arange(8.0)), batch_size=2))
        seen = [float(x) for (batch,) in loader for x in batch]
        ray.train.collective.barrier()
        token = ray.train.collective.broadcast_from_rank_zero(f"from rank {ctx.get_world_rank()}")
        return {"world_size": ctx.get_world_size(), "rank": ctx.get_world_rank(), "local_rank": ctx.get_local_rank(),
                "local_world_size": ctx.get_local_world_size(), "node_rank": ctx.get_node_rank(),
                "experiment": ctx.get_experiment_name(), "device": str(ray.train.torch.get_device()),
                "seen": seen, "token": token, "config": config}

    run = nbtrain.launch(train, config={"lr": 0.1}, workers=2, name="raytrain-context")
    assert run.wait(timeout=120) == nbtrain.RunState.SUCCEEDED
    rank0, rank1 = run.result
    for rank, answer in enumerate((rank0, rank1)):
        assert answer["world_size"] == 2 and answer["rank"] == rank and answer["local_rank"] == rank
        assert answer["local_world_size"] == 2 and answer["node_rank"] == 0
        assert answer["experiment"] == "raytrain-context" and answer["device"] == "cpu"
        assert answer["token"] == "from rank 0" and answer["config"] == {"lr": 0.1}
    # prepare_data_loader gave each rank half of the data (a DistributedSampler), together all of it
    assert len(rank0["seen"]) == len(rank1["seen"]) == 4
    assert sorted(rank0["seen"] + rank1["seen"]) == [float(i) for i in range(8)]


def test_reports_stream_from_every_rank_without_a_barrier(cluster):
    def train():
        rank = ray.train.get_context().get_world_rank()
        for i in range(3 if rank == 0 else 5):  # unequal counts: Ray Train's report would wait for the other rank
            ray.train.report({"i": i, "who": f"rank{rank}"})

    run = nbtrain.launch(train, workers=2, name="raytrain-streams")
    assert run.wait(timeout=120) == nbtrain.RunState.SUCCEEDED
    rows = run.metrics
    assert [r["i"] for r in rows if r["rank"] == 0] == [0, 1, 2]
    assert [r["i"] for r in rows if r["rank"] == 1] == [0, 1, 2, 3, 4]
    assert {r["who"] for r in rows if r["rank"] == 1} == {"rank1"}


def test_only_a_run_that_imports_ray_train_pays_for_it(cluster):
    """Ray Train's seam costs a rank process 1.8 s of CPU and ~107 MB: it comes with ``import ray.train``."""
    def train():
        import sys

        imported_before = "ray.train" in sys.modules
        import ray.train

        return imported_before, ray.train.get_context().get_world_size()

    run = nbtrain.launch(train, workers=2, warm=False, name="raytrain-on-import")  # fresh processes
    assert run.wait(timeout=120) == nbtrain.RunState.SUCCEEDED, run.error
    assert run.result == [(False, 2), (False, 2)]


def test_get_checkpoint_after_a_restart_has_the_files_of_the_last_report(cluster):
    def train():
        checkpoint = ray.train.get_checkpoint()
        if checkpoint is None:
            with tempfile.TemporaryDirectory() as directory:
                with open(os.path.join(directory, "state.txt"), "w") as handle:
                    handle.write("epoch=4")
                ray.train.report({"epoch": 4}, checkpoint=ray.train.Checkpoint.from_directory(directory))
            raise RuntimeError("the node went away")
        with checkpoint.as_directory() as directory:
            return open(os.path.join(directory, "state.txt")).read()

    run = nbtrain.launch(train, workers=2, max_failures=1, name="raytrain-restart")
    assert run.wait(timeout=180) == nbtrain.RunState.SUCCEEDED
    assert run.attempt == 2  # the second attempt read the first one's checkpoint
    assert run.result == ["epoch=4", "epoch=4"]


def test_get_dataset_shard_gives_each_rank_its_part_of_a_ray_dataset(cluster):
    def train():
        shard = ray.train.get_dataset_shard("train")
        return sorted(int(row["id"]) for batch in shard.iter_batches(batch_size=4) for row in
                      [dict(zip(batch, values)) for values in zip(*batch.values())])

    dataset = ray.data.range(16)
    run = nbtrain.launch(train, workers=2, datasets={"train": dataset}, name="raytrain-shards")
    assert run.wait(timeout=180) == nbtrain.RunState.SUCCEEDED
    rank0, rank1 = run.result
    assert len(rank0) == len(rank1) == 8 and sorted(rank0 + rank1) == list(range(16))


def test_a_failing_rank_raises_ray_trains_error_naming_the_rank(cluster):
    def train():
        ray.train.report({"loss": 1.0})
        if ray.train.get_context().get_world_rank() == 1:
            raise ValueError("bad batch on purpose")

    trainer = nbtrain.TorchTrainer(train, scaling_config=ScalingConfig(num_workers=2),
                                   run_config=ray.train.RunConfig(name="raytrain-fails"))
    with pytest.raises(ray.train.WorkerGroupError) as raised:
        trainer.fit()
    assert "rank 1" in str(raised.value) and "bad batch on purpose" in str(raised.value)
    assert set(raised.value.worker_failures) == {1}
    assert raised.value.result.error is raised.value
    assert raised.value.result.metrics["loss"] == 1.0
