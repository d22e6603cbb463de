"""PyTorch Lightning on 2 real nbtrain ranks: nbtrain.lightning.trainer(), and Ray's own Lightning helpers."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch

import nbtrain


class Regressor(pl.LightningModule):
    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(8, 1)

    def forward(self, x):
        return self.layer(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x).float(), y)
        self.log("train_loss", loss)
        self.log("autocast", float(torch.is_autocast_enabled("cpu")))
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def loader(batch_size: int = 16) -> torch.utils.data.DataLoader:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(128, 8, generator=gen)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True)),
                                       batch_size=batch_size)


def checksum(model: torch.nn.Module) -> float:
    return float(sum(p.detach().double().sum() for p in model.parameters()))


def test_nbtrain_trainer_streams_self_log_from_every_rank_and_saves_checkpoints(cluster):
    def train():
        trainer = nbtrain.lightning.trainer(max_epochs=2)
        model = Regressor()
        trainer.fit(model, loader())
        return {"checksum": checksum(model), "precision": str(trainer.precision), "world": trainer.world_size,
                "batches": trainer.num_training_batches, "strategy": type(trainer.strategy).__name__}

    run = nbtrain.launch(train, workers=2, precision="bf16-mixed", name="lightning-fit")
    assert run.wait(timeout=240) == nbtrain.RunState.SUCCEEDED
    rank0, rank1 = run.result
    assert rank0["checksum"] == pytest.approx(rank1["checksum"], abs=1e-9), "DDP ranks diverged under Lightning"
    assert rank0["precision"] == "bf16-mixed" and rank0["world"] == 2 and rank0["strategy"] == "NbtrainDDPStrategy"
    assert rank0["batches"] == 4, "each rank should train on half of the 8 batches (a distributed sampler)"
    rows = run.metrics
    for rank in (0, 1):
        mine = [r for r in rows if r["rank"] == rank and "train_loss" in r]
        assert [r["step"] for r in mine] == list(range(8)), "one row per optimizer step on every rank"
        assert all(r["autocast"] == 1.0 for r in mine), "bf16-mixed: training_step runs under autocast"
    assert mine[-1]["train_loss"] < mine[0]["train_loss"]
    restored = Regressor.load_from_checkpoint(run.checkpoint_dir() / "checkpoint.ckpt")
    assert checksum(restored) == pytest.approx(rank0["checksum"], abs=1e-6)


def test_ray_train_lightning_helpers_work_unchanged(cluster):
    def train():
        from ray.train.lightning import (
            RayDDPStrategy,
            RayLightningEnvironment,
            RayTrainReportCallback,
            prepare_trainer,
        )

        trainer = pl.Trainer(max_epochs=2, devices="auto", accelerator="auto", strategy=RayDDPStrategy(),
                             plugins=[RayLightningEnvironment()], callbacks=[RayTrainReportCallback()],
                             enable_progress_bar=False, enable_checkpointing=False, logger=False)
        trainer = prepare_trainer(trainer)
        model = Regressor()
        trainer.fit(model, loader())
        return checksum(model)

    run = nbtrain.launch(train, workers=2, name="lightning-ray-helpers")
    assert run.wait(timeout=240) == nbtrain.RunState.SUCCEEDED
    assert run.result[0] == pytest.approx(run.result[1], abs=1e-9)
    epochs = sorted((r["rank"], r["epoch"]) for r in run.metrics)
    assert epochs == [(0, 0), (0, 1), (1, 0), (1, 1)], "RayTrainReportCallback reports each epoch on every rank"
    checkpoint = run.load_checkpoint()
    restored = Regressor.load_from_checkpoint(f"{checkpoint.path}/checkpoint.ckpt")
    assert checksum(restored) == pytest.approx(run.result[0], abs=1e-6)


def test_lightning_fsdp_strategy_trains_and_checkpoints_a_full_model(cluster):
    def train():
        trainer = nbtrain.lightning.trainer(max_epochs=1, strategy="fsdp")
        model = Regressor()
        trainer.fit(model, loader())
        return {"strategy": type(trainer.strategy).__name__, "world": trainer.world_size}

    run = nbtrain.launch(train, workers=2, name="lightning-fsdp")
    assert run.wait(timeout=240) == nbtrain.RunState.SUCCEEDED
    assert run.result == [{"strategy": "NbtrainFSDPStrategy", "world": 2}] * 2
    assert {r["rank"] for r in run.metrics if "train_loss" in r} == {0, 1}
    restored = Regressor.load_from_checkpoint(run.checkpoint_dir() / "checkpoint.ckpt")
    assert restored.layer.weight.shape == (1, 8)  # the full (unsharded) parameters


class SteeredRegressor(Regressor):
    """Logs its optimizer's learning rate and the sum of its parameters every step, slowly enough to be steered."""

    def training_step(self, batch, batch_idx):
        import time

        loss = super().training_step(batch, batch_idx)
        self.log("lr", self.trainer.optimizers[0].param_groups[0]["lr"])
        self.log("params", float(sum(p.detach().double().sum() for p in self.parameters())))
        time.sleep(0.05)
        return loss


def test_a_lightning_run_is_steered_and_stopped_after_its_epoch(cluster):
    from _helpers import wait_for

    def train():
        trainer = nbtrain.lightning.trainer(max_epochs=1000)
        trainer.fit(SteeredRegressor(), loader())
        return trainer.current_epoch  # fit() returns once the epoch run.stop(after="epoch") named has ended

    run = nbtrain.launch(train, workers=2, name="lightning-steered")
    try:
        wait_for(lambda: run.refresh() is not None and len(run.metrics) >= 10, timeout=180,
                 message="the Lightning run to take steps")
        applied = run.adjust(lr=0.01, wait=True)
        run.stop(after="epoch")
        assert run.wait(timeout=180, raise_on_failure=False) == nbtrain.RunState.STOPPED
    finally:
        if not run.state.is_terminal:
            run.stop()
    by_step: dict[int, dict[int, dict]] = {}
    for row in run.metrics:
        if "lr" in row:
            by_step.setdefault(row["step"], {})[row["rank"]] = row
    assert {step for step, ranks in by_step.items() if len(ranks) == 2} == set(by_step)
    for step, ranks in by_step.items():
        assert ranks[0]["params"] == ranks[1]["params"], f"replicas differ at step {step}"
        assert ranks[0]["lr"] == ranks[1]["lr"]
    assert {round(ranks[0]["lr"], 6) for ranks in by_step.values()} == {0.05, 0.01}  # logged as float32
    assert max(by_step) % 4 == 3, "stopped at the end of an epoch (4 steps per rank)"
    assert run.result is not None and run.result[0] == run.result[1] == (max(by_step) + 1) // 4, run.result
    assert run.changes[0]["step"] == applied
