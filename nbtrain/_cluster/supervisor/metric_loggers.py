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

Closing (the run ended) writes what was pushed before it began; rows pushed after that, and rows
still waiting when the writers have not finished within ``CLOSE_WAIT_S``, are counted and said in
one run event. The writers' thread closes them after its last batch, so a writer is never closed
while it still writes.
"""

from __future__ import annotations

import enum
import os
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nbtrain._paths import private_dir

WRITE_INTERVAL_S = 1.0
CLOSE_WAIT_S = 60.0  # how long closing waits for the writers to finish what was pushed before it
ROW_KEYS = ("rank", "step", "attempt", "time")
MLFLOW_STATUS = {"succeeded": "FINISHED", "failed": "FAILED", "stopped": "KILLED"}


class _State(enum.Enum):
    OPEN = "open"          # rows are queued for the writers
    CLOSING = "closing"    # close() waits for the writers; new rows are dropped and counted
    CLOSED = "closed"      # close() returned; new rows are dropped, counted, and said once


class MetricLoggers:
    """The writers of one run; ``write(rows)`` is cheap (a queue), the writing happens on a thread.

    Thread-safe: ``write`` may race ``close``; every row given to ``write`` ends up ``written`` or
    ``dropped`` (said as a run event through ``on_error``).
    """

    def __init__(self, kinds: tuple[str, ...] | list[str] | str, run_name: str, run_dir: Path, logger_dir: Path,
                 config: dict[str, Any], env: dict[str, str], on_error: Callable[[str], None]) -> None:
        self._on_error = on_error
        self._queue: queue.Queue[list[dict[str, Any]] | None] = queue.Queue()
        self._writers: dict[str, Any] = {}
        self.where: dict[str, str] = {}
        self._lock = threading.Lock()  # the state and the row counts below
        self._state = _State.OPEN
        self._final_state = ""   # the run's, for the writers' close (MLflow's run status)
        self._queued = 0         # rows put on the queue while open
        self._written = 0        # rows the thread handed to the writers
        self._in_flight = 0      # rows the thread is handing to the writers now
        self._late = 0           # rows pushed once closing began
        self._abandoned = 0      # rows the thread dropped because close stopped waiting for it
        self._gave_up = False    # close stopped waiting: the thread drops what it has not begun
        self._said_closed = False
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

    @property
    def closed(self) -> bool:
        """Whether ``close`` began: rows written now are dropped."""
        return self._state is not _State.OPEN

    @property
    def written(self) -> int:
        """Rows handed to the writers so far."""
        return self._written

    @property
    def dropped(self) -> int:
        """Rows dropped so far: pushed after closing began, or left waiting when close stopped waiting."""
        with self._lock:
            return self._late + self._abandoned

    def write(self, rows: list[dict[str, Any]]) -> None:
        if not rows or not self._writers:
            return
        with self._lock:
            state = self._state
            if state is _State.OPEN:
                self._queue.put(rows)
                self._queued += len(rows)
                return
            self._late += len(rows)
            say = state is _State.CLOSED and not self._said_closed
            self._said_closed = self._said_closed or say
        if say:
            self._on_error(f"{self._kinds()}: {len(rows)} rows arrived after the loggers closed with the run and "
                           f"were not written (the run's history has them); later ones are dropped too")

    def close(self, state: str) -> None:
        """Write what was pushed before this call and end the writers (MLflow: the run's final ``state``).

        Waits up to ``CLOSE_WAIT_S`` for the writers; says in one run event how many rows were not written.
        """
        with self._lock:
            if self._state is not _State.OPEN:
                return
            self._state = _State.CLOSING
            self._final_state = state
            self._queue.put(None)  # after every queued row: the thread writes them, then closes the writers
        self._thread.join(timeout=CLOSE_WAIT_S)
        with self._lock:
            self._state = _State.CLOSED
            self._gave_up = True  # a no-op once the thread finished; else it drops what it has not begun
            late, in_flight = self._late, self._in_flight
            waiting = self._queued - self._written - self._abandoned - in_flight
        if late or waiting or in_flight:
            self._on_error(self._not_written(late, waiting, in_flight))

    def _not_written(self, late: int, waiting: int, in_flight: int) -> str:
        why = []
        if late:
            why.append(f"{late} arrived after the loggers began closing with the run")
        if waiting:
            why.append(f"{waiting} were still waiting when the writers had not finished after {CLOSE_WAIT_S:g} s")
        said = f"{self._kinds()}: {late + waiting} rows were not written ({'; '.join(why)}); " if late or waiting \
            else f"{self._kinds()}: "
        if in_flight:
            said += (f"the writers, still busy after {CLOSE_WAIT_S:g} s, go on with the {in_flight} rows they hold "
                     f"and are closed when done; ")
        return said + "the run's history has every row"

    def _kinds(self) -> str:
        return ", ".join(self.where) or "loggers"

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
                self._write(batch)
        for kind, writer in list(self._writers.items()):  # here, not in close(): nothing else uses them now
            self._guard(kind, writer.close, self._final_state)

    def _write(self, batch: list[dict[str, Any]]) -> None:
        with self._lock:
            if self._gave_up:
                self._abandoned += len(batch)
                return
            self._in_flight = len(batch)
        for kind, writer in list(self._writers.items()):
            self._guard(kind, writer.write, batch)
        with self._lock:
            self._written += len(batch)
            self._in_flight = 0

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
