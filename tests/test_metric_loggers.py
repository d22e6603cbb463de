"""launch(loggers=...): a real run's metrics read back with TensorBoard's and MLflow's own readers."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import nbtrain


def test_every_rank_is_written_to_tensorboard_and_mlflow(cluster, tmp_path):
    def train(config):
        rank = nbtrain.get_context().rank
        for step in range(1, config["steps"] + 1):
            nbtrain.report(step=step, loss=1.0 / step + rank, lr=config["lr"])

    run = nbtrain.launch(train, config={"steps": 5, "lr": 0.1}, workers=2, name="loggers",
                         loggers=("tensorboard", "mlflow"), logger_dir=str(tmp_path))
    assert run.wait(timeout=120) == nbtrain.RunState.SUCCEEDED
    said = " ".join(e["message"] for e in run.events if e["kind"] == "loggers")
    assert "tensorboard" in said and "mlflow" in said, said

    for rank in (0, 1):
        events = EventAccumulator(str(tmp_path / "tensorboard" / "loggers" / f"rank-{rank}"))
        events.Reload()
        losses = events.Scalars("loss")
        assert [e.step for e in losses] == [1, 2, 3, 4, 5], f"rank {rank}"
        assert losses[-1].value == pytest.approx(0.2 + rank)

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    [found] = client.search_runs([client.get_experiment_by_name("nbtrain").experiment_id],
                                 filter_string="attributes.run_name = 'loggers'")
    assert found.info.status == "FINISHED"
    assert found.data.params == {"steps": "5", "lr": "0.1"}
    rank0 = client.get_metric_history(found.info.run_id, "loss")
    rank1 = client.get_metric_history(found.info.run_id, "rank1/loss")
    assert [m.step for m in rank0] == [m.step for m in rank1] == [1, 2, 3, 4, 5]
    assert rank1[-1].value == pytest.approx(1.2)


def test_a_failed_run_ends_its_mlflow_run_failed(cluster, tmp_path):
    def train():
        nbtrain.report(loss=1.0)
        raise ValueError("broken on purpose")

    run = nbtrain.launch(train, workers=2, name="loggers-failed", loggers=("mlflow",), logger_dir=str(tmp_path))
    with pytest.raises(nbtrain.RunFailedError):
        run.wait(timeout=120)
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    [found] = client.search_runs([client.get_experiment_by_name("nbtrain").experiment_id])
    assert found.info.status == "FAILED"
    assert [m.value for m in client.get_metric_history(found.info.run_id, "loss")] == [1.0]
