"""``nbtrain.TorchTrainer``: Ray Train's ``TorchTrainer``, run by nbtrain. Switching is one import.

Ray Train's configs map onto run options: ``ScalingConfig`` to ``workers``,
``cpus_per_worker``, ``gpus_per_worker`` and ``placement_strategy``; ``RunConfig``
to ``name``, ``storage`` (a shared directory, or a pyarrow.fs URI such as ``s3://bucket/runs``),
``max_failures`` and the workers' environment variables. Anything else nbtrain cannot honour is refused
by name rather than quietly dropped. Every run option may be given as well
(``nbtrain.TorchTrainer(..., total_steps=1000, warm=False)``).

``fit()`` shows the live dashboard in a notebook, blocks until the run ends
(Ctrl-C stops it) and returns a ``ray.train.Result``; on failure it raises
``ray.train.WorkerGroupError``, as Ray Train does, with each failing rank's
traceback (the ``Result`` is on the error as ``.result``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nbtrain._client.entry.launch import launch
from nbtrain._client.run.handle import Run
from nbtrain._cluster.rank.session import ROW_KEYS
from nbtrain._exceptions import InvalidOptionError
from nbtrain._ray_compat import train_result
from nbtrain._states import RunState

# Ray Train's FailureConfig(max_failures=-1) means "retry forever"; nbtrain's budget is a whole number.
UNLIMITED_FAILURES = 1_000_000


class TorchTrainer:
    """Run a Ray Train training function (``ray.train.report``, ``ray.train.torch.prepare_model``...) on nbtrain.

    Example::

        from nbtrain import TorchTrainer          # was: from ray.train.torch import TorchTrainer
        trainer = TorchTrainer(train_func, train_loop_config={"lr": 1e-3},
                               scaling_config=ray.train.ScalingConfig(num_workers=2))
        result = trainer.fit()
        result.metrics, result.checkpoint
    """

    def __init__(self, train_loop_per_worker: Callable[..., Any], *, train_loop_config: dict[str, Any] | None = None,
                 scaling_config: Any = None, run_config: Any = None, datasets: dict[str, Any] | None = None,
                 **run_options: Any) -> None:
        self.train_loop_per_worker = train_loop_per_worker
        self.options: dict[str, Any] = {
            **_from_scaling_config(scaling_config), **_from_run_config(run_config),
            "config": train_loop_config, "datasets": datasets, **run_options,
        }
        self.run: Run | None = None

    def fit(self) -> Any:
        """Launch the run, show its dashboard, and block until it ends (Ctrl-C stops it), as Ray Train's
        ``fit()`` does; the run is then ``trainer.run``.

        Returns:
            A ``ray.train.Result`` with rank 0's last metrics, every report of rank 0 as ``metrics_dataframe``,
            the latest checkpoint (a local directory) and rank 0's return value.

        Raises:
            ray.train.WorkerGroupError: the run failed or was stopped, with each failing rank's traceback
                (the ``Result`` is on the error as ``.result``).
            InvalidOptionError: a run option is wrong (nothing was started); :func:`launch` lists the
                other errors.

        Example::

            result = TorchTrainer(train_func, scaling_config=ray.train.ScalingConfig(num_workers=2)).fit()
            result.metrics["loss"]
        """
        from nbtrain._client.run.following import block_until_done

        run = self.run = launch(self.train_loop_per_worker, **{**self.options, "wait": False})
        view = run.dashboard(follow="background")
        state = block_until_done(run, launched=True, view_thread=getattr(view, "thread", None))
        result = _result_of(run, state)
        if result.error is not None:
            result.error.result = result
            raise result.error
        return result


def _from_scaling_config(scaling: Any) -> dict[str, Any]:
    if scaling is None:
        return {"workers": 1}
    resources = dict(scaling.resources_per_worker or {})
    cpus = resources.pop("CPU", 1.0)
    gpus = resources.pop("GPU", 1.0 if scaling.use_gpu else 0.0)
    if resources:
        msg = (f"ScalingConfig(resources_per_worker=...) asks for {sorted(resources)}: nbtrain reserves CPU and GPU "
               f"per worker only. Remove them, or schedule with labels on a plain Ray Train TorchTrainer.")
        raise InvalidOptionError(msg)
    for field in ("accelerator_type", "topology"):
        if getattr(scaling, field, None):
            msg = f"ScalingConfig({field}=...) is not supported by nbtrain yet; remove it (GPUs are asked by count)."
            raise InvalidOptionError(msg)
    return {"workers": int(scaling.num_workers or 1), "cpus_per_worker": float(cpus), "gpus_per_worker": float(gpus),
            "placement_strategy": scaling.placement_strategy}


def _from_run_config(run_config: Any) -> dict[str, Any]:
    if run_config is None:
        return {}
    options: dict[str, Any] = {}
    if run_config.name:
        options["name"] = run_config.name
    storage = run_config.storage_path
    if storage and storage != type(run_config)().storage_path:  # not Ray's default (~/ray_results)
        options["storage"] = str(storage)  # a path or a pyarrow.fs URI; RunOptions checks it
    if getattr(run_config, "storage_filesystem", None) is not None:
        msg = ("RunConfig(storage_filesystem=...) cannot be sent to nbtrain's ranks as an object: give the storage "
               "as a URI in storage_path instead (e.g. 's3://bucket/runs'; pyarrow.fs opens it on every node).")
        raise InvalidOptionError(msg)
    failure = run_config.failure_config
    if failure is not None and failure.max_failures:
        options["max_failures"] = UNLIMITED_FAILURES if failure.max_failures < 0 else int(failure.max_failures)
    if runtime_env := getattr(run_config, "worker_runtime_env", None):
        options["runtime_env"] = dict(runtime_env)  # checked by RunOptions as launch(runtime_env=) is
    if getattr(run_config, "callbacks", None):
        msg = ("RunConfig(callbacks=...) is not run by nbtrain: its dashboard shows every rank's metrics live. "
               "Remove the callbacks, or log from the training function.")
        raise InvalidOptionError(msg)
    return options


def _result_of(run: Run, state: RunState) -> Any:
    """Ray Train's ``Result`` for an ended run: rank 0's last metrics and every report as a DataFrame."""
    from ray.train import Checkpoint
    from ray.train.v2.api.exceptions import WorkerGroupError

    frame = run.metrics_frame()
    if len(frame) and "rank" in frame:
        frame = frame[frame["rank"] == 0].reset_index(drop=True)
    run.refresh()
    last: dict[str, Any] = next((row for row in reversed(run.reader.rows_since()) if row.get("rank") == 0), {})
    metrics = {key: value for key, value in last.items() if key not in ROW_KEYS}
    files = run.checkpoint_dir()
    error = None
    if state != RunState.SUCCEEDED:
        failures = {f["rank"]: RuntimeError(f["summary"] + ("\n" + f["traceback"] if f["traceback"] else ""))
                    for f in run.reader.summary.get("failures", []) if f.get("rank") is not None}
        error = WorkerGroupError(f"nbtrain run {run.name!r} {state.value}.\n{run.error or ''}", failures)
    values = run.result if state == RunState.SUCCEEDED else None
    return train_result(metrics=metrics, checkpoint=Checkpoint.from_directory(str(files)) if files else None,
                        error=error, path=str(files.parent) if files else "", metrics_dataframe=frame,
                        return_value=values[0] if values else None)
