"""Every rank's metrics, also written where the team already looks: TensorBoard and MLflow.

``launch(..., loggers=["tensorboard", "mlflow"])``: the run's supervisor, which
receives every rank's rows, hands them to these writers, with the libraries' own
APIs, on a thread of their own (a slow disk or tracking server never holds up a
push). Where they write:

- **TensorBoard**: ``<logger_dir>/tensorboard/<run>/rank-<r>``, one event directory per
  rank (TensorBoard overlays them as runs), tag = metric name, step = the row's step,
  wall time = the row's time. ``tensorboard --logdir <logger_dir>/tensorboard``.
- **MLflow**: one MLflow run per nbtrain run (named after it, in the experiment
  ``MLFLOW_EXPERIMENT_NAME`` or "nbtrain"), at ``MLFLOW_TRACKING_URI`` as the run's
  workers see it (``env=``) or the supervisor does, else the SQLite store
  ``<logger_dir>/mlflow.db`` (``mlflow ui --backend-store-uri sqlite:///<logger_dir>/mlflow.db``).
  Rank 0's metrics under their own names, rank r's as ``rank<r>/<name>``; the config as
  params; the MLflow run ends FINISHED, FAILED or KILLED with the nbtrain run.
  A resumed run logs into the same MLflow run.

``logger_dir`` defaults to the run's directory on the head node; runs may share one. Rows arrive once
each; rows received in the last second before a supervisor crash may be missing
from these writers (the run's own history has them). A writer that fails is
reported once as a run event and switched off; training goes on.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nbtrain._paths import private_dir

WRITE_INTERVAL_S = 1.0
ROW_KEYS = ("rank", "step", "attempt", "time")
MLFLOW_STATUS = {"succeeded": "FINISHED", "failed": "FAILED", "stopped": "KILLED"}


class MetricLoggers:
    """The writers of one run; ``write(rows)`` is cheap (a queue), the writing happens on a thread."""

    def __init__(self, kinds: tuple[str, ...] | list[str] | str, run_name: str, run_dir: Path, logger_dir: Path,
                 config: dict[str, Any], env: dict[str, str], on_error: Callable[[str], None]) -> None:
        self._on_error = on_error
        self._queue: queue.Queue[list[dict[str, Any]] | None] = queue.Queue()
        self._writers: dict[str, Any] = {}
        self.where: dict[str, str] = {}
        for kind in [kinds] if isinstance(kinds, str) else kinds:
            try:
                writer = _TensorBoard(logger_dir, run_name) if kind == "tensorboard" else \
                    _MLflow(logger_dir, run_dir, run_name, config, env)
            except ModuleNotFoundError as exc:
                on_error(f"{kind}: not writing metrics: {exc.name} is not installed on the cluster's head node "
                         f"(pip install 'nbtrain[{kind}]' there)")
                continue
            except Exception as exc:  # noqa: BLE001 - a logger must not stop the run
                on_error(f"{kind}: not writing metrics ({type(exc).__name__}: {exc})")
                continue
            self._writers[kind] = writer
            self.where[kind] = writer.where
        self._thread = threading.Thread(target=self._loop, name="nbtrain-metric-loggers", daemon=True)
        self._thread.start()

    def write(self, rows: list[dict[str, Any]]) -> None:
        if rows and self._writers:
            self._queue.put(rows)

    def close(self, state: str) -> None:
        """Write what is queued, end the writers (MLflow: the run's final status); waits for it."""
        self._queue.put(None)
        self._thread.join(timeout=60)
        for kind, writer in list(self._writers.items()):
            self._guard(kind, writer.close, state)

    def _loop(self) -> None:
        done = False
        while not done:
            batch: list[dict[str, Any]] = []
            try:
                item = self._queue.get(timeout=WRITE_INTERVAL_S)
                while True:
                    if item is None:
                        done = True
                        break
                    batch.extend(item)
                    item = self._queue.get_nowait()
            except queue.Empty:
                pass
            if batch:
                for kind, writer in list(self._writers.items()):
                    self._guard(kind, writer.write, batch)

    def _guard(self, kind: str, action: Callable[..., None], *args: Any) -> None:
        try:
            action(*args)
        except Exception as exc:  # noqa: BLE001 - a logger must not stop the run
            self._writers.pop(kind, None)
            self._on_error(f"{kind}: stopped writing metrics ({type(exc).__name__}: {exc})")


def _numbers(row: dict[str, Any]) -> dict[str, float]:
    return {key: float(value) for key, value in row.items()
            if key not in ROW_KEYS and isinstance(value, (int, float)) and not isinstance(value, bool)}


class _TensorBoard:
    def __init__(self, directory: Path, run_name: str) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._root = private_dir(directory / "tensorboard" / run_name)
        self._writer_class = SummaryWriter
        self._writers: dict[int, Any] = {}
        self.where = str(self._root)

    def write(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            rank = int(row["rank"])
            writer = self._writers.get(rank)
            if writer is None:
                writer = self._writers[rank] = self._writer_class(str(self._root / f"rank-{rank}"))
            for key, value in _numbers(row).items():
                writer.add_scalar(key, value, global_step=int(row["step"]), walltime=float(row["time"]))
        for writer in self._writers.values():
            writer.flush()

    def close(self, state: str) -> None:
        for writer in self._writers.values():
            writer.close()


class _MLflow:
    def __init__(self, logger_dir: Path, run_dir: Path, run_name: str, config: dict[str, Any],
                 env: dict[str, str]) -> None:
        from mlflow.tracking import MlflowClient

        uri = env.get("MLFLOW_TRACKING_URI") or os.environ.get("MLFLOW_TRACKING_URI") or \
            f"sqlite:///{private_dir(logger_dir) / 'mlflow.db'}"
        self.where = uri
        self._client = MlflowClient(tracking_uri=uri)
        id_file = run_dir / "mlflow_run_id"
        if id_file.exists():  # a resumed (or restarted) run goes on in the same MLflow run
            self._run_id = id_file.read_text().strip()
            self._client.update_run(self._run_id, status="RUNNING")
            return
        experiment = env.get("MLFLOW_EXPERIMENT_NAME") or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "nbtrain"
        found = self._client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else self._client.create_experiment(experiment)
        self._run_id = self._client.create_run(experiment_id, run_name=run_name).info.run_id
        id_file.write_text(self._run_id)
        from mlflow.entities import Param

        params = [Param(str(key)[:250], str(value)[:6000]) for key, value in sorted(config.items())]
        if params:
            self._client.log_batch(self._run_id, params=params)

    def write(self, rows: list[dict[str, Any]]) -> None:
        from mlflow.entities import Metric

        metrics = [Metric(key if int(row["rank"]) == 0 else f"rank{int(row['rank'])}/{key}", value,
                          int(float(row["time"]) * 1000), int(row["step"]))
                   for row in rows for key, value in _numbers(row).items()]
        for start in range(0, len(metrics), 1000):  # MLflow's limit per batch
            self._client.log_batch(self._run_id, metrics=metrics[start:start + 1000])

    def close(self, state: str) -> None:
        self._client.set_terminated(self._run_id, status=MLFLOW_STATUS.get(state, "KILLED"))
