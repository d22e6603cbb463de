"""The names a training function uses on a worker: ``report``, ``prepare_model``, checkpoints, ...

Each one finds the rank's :class:`~nbtrain._cluster.rank.session.TrainingSession`; called
in the notebook they raise an error that says to use the ``Run`` object instead. The data's
names (``prepare_loader``, ``get_dataset_shard``) are in :mod:`nbtrain._cluster.rank.data`, which
talks to the session itself: this module does not import it.
"""

from __future__ import annotations

import io
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Any

from nbtrain._cluster.elastic import gradient_noise
from nbtrain._cluster.rank import optimizer_settings, parallel, sharded_checkpoint
from nbtrain._cluster.rank.inspection import step_timing
from nbtrain._cluster.rank.session import TrainContext, current_session
from nbtrain._cluster.storage import storage_uri
from nbtrain._cluster.storage.run_storage import checkpoint_source, load_trusted, storage_checkpoint, unpack_directory

RUN_PRECISION = "run"  # prepare_model's default precision: the run's ``precision`` option


def get_context() -> TrainContext:
    """This rank's ``rank``, ``world_size``, ``local_rank``, ``device``, ``attempt`` and ``config``.

    Returns:
        The rank's :class:`TrainContext`.

    Raises:
        NbtrainError: called outside a training function (in the notebook: use the ``Run``).

    Example::

        ctx = nbtrain.get_context()
        if ctx.rank == 0:
            print("training on", ctx.world_size, "workers")
    """
    return current_session().context


def prepare_model(model: Any, *, strategy: str | None = "ddp", precision: str | None = RUN_PRECISION,
                  auto_wrap_policy: Iterable[type] | Callable[[Any], bool] | None = None,
                  fsdp_kwargs: dict[str, Any] | None = None, **ddp_kwargs: Any) -> Any:
    """Move ``model`` to this rank's device and spread it over the ranks.

    ``strategy``: ``"ddp"`` (DistributedDataParallel; with one worker the model is only
    moved, so the same code runs at any scale), ``"fsdp"`` (FSDP2 ``fully_shard``: each
    rank holds 1/N of the parameters and optimizer state; ``auto_wrap_policy`` names the
    submodule classes, or a function of a module, sharded as units of their own;
    ``fsdp_kwargs`` go to ``fully_shard``), or ``None`` (only moved).
    ``precision``: ``"bf16-mixed"`` or ``"16-mixed"`` runs the forward under
    ``torch.autocast`` (``"16-mixed"`` also scales the loss: use :func:`backward` and
    :func:`prepare_optimizer`); default: the run's ``precision`` option.

    Args:
        model: a ``torch.nn.Module``.
        strategy: ``"ddp"``, ``"fsdp"`` or ``None``.
        precision: ``"bf16-mixed"``, ``"16-mixed"``, ``None`` (full precision), or the run's option.
        auto_wrap_policy: FSDP: submodule classes, or a function of a module, sharded as units.
        fsdp_kwargs: FSDP: keywords for ``fully_shard``.
        **ddp_kwargs: DDP: keywords for ``DistributedDataParallel``.

    Returns:
        The model to train (DDP-wrapped, sharded, or moved), its forward under autocast.

    Raises:
        NbtrainError: called outside a training function (in the notebook: use the ``Run``).

    Example::

        model = nbtrain.prepare_model(Net(), strategy="fsdp", auto_wrap_policy={Block}, precision="bf16-mixed")
    """
    import torch

    session = current_session()
    if precision == RUN_PRECISION:
        precision = session.payload.training.precision
    parallel.check_choices(strategy, precision)
    ctx = session.context
    model = parallel.distribute(model, ctx.device, ctx.world_size, strategy, auto_wrap_policy,
                                dict(fsdp_kwargs or {}), ddp_kwargs)
    session.steering.points.models.append(model)  # its state is copied at each checkpoint, for run.rewind()
    step_timing.time_communication(model, session.timing)  # before gns's hook, which then runs inside it
    if session.noise is not None:
        _measure_noise(model, session)
    if precision is not None:
        model = parallel.autocast_forward(model, ctx.device, precision)
    if precision == "16-mixed" and session.grad_scaler is None:
        session.grad_scaler = torch.amp.GradScaler(ctx.device.type)
    return model


def _measure_noise(model: Any, session: Any) -> None:
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel):
        gradient_noise.measure(model, session.noise, session.context.world_size, lambda: session.batch_size)
    elif session.context.rank == 0:
        print("[nbtrain] gns: the gradient noise scale is measured on models prepared with strategy='ddp' in runs of "
              "2 or more workers; this model is not, so rows carry no gns.", file=sys.stderr)


def prepare_optimizer(optimizer: Any) -> Any:
    """``optimizer``, stepping through the loss scaler when a ``"16-mixed"`` model was prepared (else unchanged).

    In an elastic run with ``scale_lr`` its learning rates are scaled for this attempt's world
    size (see the option), once per optimizer. It is also made steerable (see :func:`steerable`).

    Args:
        optimizer: a ``torch.optim.Optimizer`` of the prepared model's parameters.

    Returns:
        The optimizer to step (a wrapper that steps through the ``GradScaler`` with ``"16-mixed"``).

    Raises:
        NbtrainError: called outside a training function (in the notebook: use the ``Run``).

    Example::

        optimizer = nbtrain.prepare_optimizer(torch.optim.AdamW(model.parameters(), lr=config["lr"]))
    """
    session = current_session()
    lr_scale = session.payload.training.lr_scale
    if lr_scale != 1.0 and not getattr(optimizer, "_nbtrain_lr_scaled", False):
        optimizer_settings.rescale_lr(optimizer, lr_scale)  # an LR scheduler made before follows
        optimizer._nbtrain_lr_scaled = True
    if session.adaptive_batch is not None and optimizer not in session.optimizers:
        session.optimizers.append(optimizer)  # its learning rate follows the batch size (see adaptive_batch)
    session.steering.steer(optimizer)  # run.adjust() and the dashboard's controls reach it
    scaler = session.grad_scaler
    return optimizer if scaler is None else parallel.ScaledOptimizer(optimizer, scaler)


def steerable(optimizer: Any) -> Any:
    """``optimizer``, steerable from the notebook (``run.adjust(lr=...)``, pause, checkpoint now, commands) from
    now on; returns it unchanged.

    Every torch optimizer the code steps is steered anyway, from its first step, with no call (torch's
    global optimizer step hooks, on while the run's function runs): this adopts it before then, so its
    settings show from the start. A wrapper (Accelerate's ``AcceleratedOptimizer``, Lightning's) is steered
    as the optimizer it steps. A change is applied before the update of the step the run's supervisor
    chose, on every rank alike.

    Args:
        optimizer: a ``torch.optim.Optimizer``, or a wrapper of one.

    Returns:
        The same object.

    Raises:
        NbtrainError: called outside a training function (in the notebook: use the ``Run``).

    Example::

        optimizer = nbtrain.steerable(torch.optim.SGD(model.parameters(), lr=0.1))
    """
    return current_session().steering.steer(optimizer)


def backward(loss: Any) -> None:
    """``loss.backward()``, of the scaled loss when a ``"16-mixed"`` model was prepared.

    Args:
        loss: the scalar loss tensor.

    Raises:
        NbtrainError: called outside a training function (in the notebook: use the ``Run``).

    Example::

        nbtrain.backward(loss); optimizer.step()
    """
    scaler = current_session().grad_scaler
    (loss if scaler is None else scaler.scale(loss)).backward()


def stop_requested() -> bool:
    """Whether the notebook asked the run to stop after the epoch this rank is in (``run.stop(after="epoch")``,
    the dashboard's button). Check it at the end of each epoch and return, so the run ends with your result::

        for epoch in range(config["epochs"]):
            for x, y in loader:
                ...
            if nbtrain.stop_requested():
                break
        return {"accuracy": accuracy}

    Without the check, a ``prepare_loader`` loader holds the rank at the next epoch's start and the run is
    stopped there (``run.result`` is then ``None``). Lightning's and Hugging Face's trainers run through
    nbtrain check it for you and return from ``fit()`` / ``train()``. Costs two attribute reads.

    Returns:
        ``True`` once a stop after this epoch was asked.

    Raises:
        NbtrainError: called outside a training function.
    """
    return current_session().steering.stop_requested()


def checkpoint_requested() -> bool:
    """Whether the run wants a checkpoint now: an elastic run (``workers=(min, max)``) about to change
    size asks for one, and goes on at the new size from it. Check it once per step or batch and save::

        if nbtrain.checkpoint_requested():
            nbtrain.save_checkpoint({"model": model.state_dict(), "step": step})

    Without the check the resize waits for the function's next checkpoint. It also turns true
    when the notebook asks for one (``run.checkpoint_now()``, the dashboard's button), until the next
    save. Costs two attribute reads: the answer is fetched in the background.

    Returns:
        ``True`` when the run asks for a checkpoint now.

    Raises:
        NbtrainError: called outside a training function (in the notebook: use the ``Run``).
    """
    session = current_session()
    return session.checkpoint_requested or session.steering.checkpoint_wanted


def save_checkpoint(obj: Any, *, sharded: bool = False) -> None:
    """Store ``obj`` (e.g. ``{"model": model.state_dict(), "epoch": epoch}``) as the run's latest checkpoint.

    Only rank 0 writes; on other ranks this returns at once, so call it on every
    rank without an ``if``. The checkpoint is kept by the run's supervisor (or in
    ``storage=``: a shared directory, or a pyarrow.fs URI such as ``s3://bucket/runs``),
    so it survives the workers, and
    :func:`load_checkpoint` returns it after a restart. State dicts of
    ``prepare_model`` (DDP) models are stored without the ``module.`` prefix,
    so they load straight into an unwrapped model in the notebook.

    Sharded state (an FSDP model's or its optimizer's ``state_dict()``) is gathered
    into full tensors first, which is a collective: every rank must call this, as
    the natural code does. Called on rank 0 only, it waits for the other ranks
    until ``collective_timeout_s`` and then fails. To resume, load the saved state
    into the plain model before ``prepare_model(..., strategy="fsdp")``.

    ``sharded=True`` (for models too big to gather on one rank) has every rank
    write its own shards with ``torch.distributed.checkpoint`` into ``storage=``
    (at a URI: written locally, then each rank uploads its own files), in parallel;
    also a collective. Resume with ``load_checkpoint(into=...)``.

    What each rank reported before the call is in the run's history before the
    checkpoint is recorded: a run resumed from it misses no row reported before it.

    Args:
        obj: what to keep: a dict of state dicts and values, saved with ``torch.save``.
        sharded: every rank writes its own shards (``torch.distributed.checkpoint``) to ``storage=``.

    Raises:
        NbtrainError: called outside a training function; ``sharded=True`` without ``storage=``;
            the checkpoint could not be stored.

    Example::

        nbtrain.save_checkpoint({"model": model.state_dict(), "epoch": epoch})
    """
    import ray
    import torch

    session = current_session()
    keep = session.steering.saved_checkpoint()  # not while a guard's action is on its way (see rank/guarding)
    session.land_reported()
    if sharded:
        ctx = session.context
        step = session.current_step()
        path = sharded_checkpoint.save(obj, session.payload.checkpoints.storage, ctx.run_name, ctx.attempt, step)
        if ctx.rank == 0 and keep:
            meta = {"step": step, "epoch": session.epoch, "attempt": ctx.attempt, "time": time.time(),
                    "format": "dcp"}
            ray.get(session.supervisor.record_checkpoint.remote(meta, None, path))
        return
    obj = parallel.gather_shards(obj)
    if session.context.rank != 0 or not keep:
        return
    buffer = io.BytesIO()
    torch.save(_unwrap_models(obj), buffer)
    store_checkpoint(buffer.getvalue(), "torch")


def store_checkpoint(data: bytes, form: str) -> None:
    """Hand rank 0's checkpoint (``data`` in ``form``, see ``CHECKPOINT_SUFFIXES``) to the supervisor,
    or write it to ``storage=`` and tell the supervisor where; returns once it is recorded."""
    import ray

    session = current_session()
    session.land_reported()  # Lightning's, Hugging Face's and Ray Train's checkpoints come this way
    ctx = session.context
    step = session.current_step()
    meta = {"step": step, "epoch": session.epoch, "attempt": ctx.attempt, "time": time.time(), "format": form}
    if not session.payload.checkpoints.storage:
        ray.get(session.supervisor.record_checkpoint.remote(meta, data, None))
        return
    path = storage_checkpoint(session.payload.checkpoints.storage, ctx.run_name, ctx.attempt, step, form)
    storage_uri.write_bytes(path, data)
    ray.get(session.supervisor.record_checkpoint.remote(meta, None, path))


def _unwrap_models(obj: Any) -> Any:
    """Store DDP state dicts without DDP's ``module.`` key prefix, so they load into a plain model."""
    if hasattr(obj, "module") and hasattr(obj, "state_dict"):
        return obj.module
    if isinstance(obj, dict):
        keys = list(obj)
        if keys and all(isinstance(k, str) and k.startswith("module.") for k in keys):
            return type(obj)((k[len("module."):], v) for k, v in obj.items())
        return {k: _unwrap_models(v) for k, v in obj.items()}
    return obj


def load_checkpoint(into: Any = None) -> Any | None:
    """The checkpoint this attempt started from (the run's latest as it began), or ``None`` on a fresh start.

    After a restart (``max_failures``), this returns what was saved before the
    failure and makes ``report()``'s default step continue from it. Every rank gets
    the same one, however late it asks: never one saved during this attempt. Loaded with
    ``torch.load(weights_only=True)`` unless the run was launched with
    ``checkpoint_weights_only=False``. A checkpoint reported by Ray Train code
    (``ray.train.report(checkpoint=...)``) comes back as a ``ray.train.Checkpoint``
    of a local directory with its files. A sharded one (``save_checkpoint(sharded=True)``)
    fills ``into`` in place, each rank reading its own shards, and returns it.

    Args:
        into: for a sharded checkpoint, the state to fill (``{"model": model.state_dict()}``).

    Returns:
        What :func:`save_checkpoint` saved, ``into`` filled, a ``ray.train.Checkpoint``, or ``None``.

    Raises:
        NbtrainError: called outside a training function (in the notebook: use the ``Run``).

    Example::

        saved = nbtrain.load_checkpoint()
        start = saved["epoch"] + 1 if saved else 0
    """
    found = checkpoint_to_resume()
    if found is None:
        return None
    meta, source = found
    if meta.get("format") == "dcp":
        return sharded_checkpoint.load_into(str(source), into)
    if meta.get("format") == "directory":
        from ray.train import Checkpoint

        return Checkpoint.from_directory(str(unpack_directory(source, tempfile.mkdtemp(prefix="nbtrain-ckpt-"))))
    return load_trusted(source, current_session().context.device, current_session().payload.checkpoints.weights_only)


def checkpoint_to_resume() -> tuple[dict[str, Any], bytes | str] | None:
    """The meta and bytes (or its path in ``storage=``, see ``checkpoint_source``) of the checkpoint this
    attempt started from, the same for every rank; the default step continues from it."""
    import ray

    session = current_session()
    found = ray.get(session.supervisor.checkpoint_to_resume.remote())
    if found is None:
        return None
    meta, data, path = found
    session.resume_at(int(meta.get("step", 0)))
    return meta, checkpoint_source(data, path, meta.get("format", "torch"))
