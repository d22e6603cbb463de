"""The names a training function uses on a worker: ``report``, ``prepare_model``, ...

Each one finds the rank's :class:`~nbtrain._session.TrainingSession`; called
in the notebook they raise an error that says to use the ``Run`` object instead.
"""

from __future__ import annotations

import io
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from nbtrain._cluster.elastic import adaptive_batch, gradient_noise
from nbtrain._cluster.rank import parallel, sharded_checkpoint
from nbtrain._cluster.rank.counted_shard import CountedShard
from nbtrain._cluster.rank.session import TrainContext, current_session
from nbtrain._cluster.storage import storage_uri
from nbtrain._cluster.storage.run_storage import checkpoint_source, load_trusted, storage_checkpoint, unpack_directory
from nbtrain._exceptions import NbtrainError

RUN_PRECISION = "run"  # prepare_model's default precision: the run's ``precision`` option


def get_context() -> TrainContext:
    """This rank's ``rank``, ``world_size``, ``local_rank``, ``device``, ``attempt`` and ``config``.

    Example::

        ctx = nbtrain.get_context()
        if ctx.rank == 0:
            print("training on", ctx.world_size, "workers")
    """
    return current_session().context


def report(metrics: dict[str, Any] | None = None, /, **more: Any) -> None:
    """Record metrics for this rank; returns at once (the rows are sent in the background).

    Metrics come as keywords, as a dict (Ray Train's ``report({...})`` style), or both.
    Each call is one row with ``rank``, ``step``, ``attempt`` and ``time`` added.
    ``step`` defaults to the number of batches drawn from loaders made by
    :func:`prepare_loader` (or, without one, the number of ``report`` calls);
    pass ``step=`` (a whole number) to set it yourself. A metric named ``rank``,
    ``attempt`` or ``time`` cannot replace the row's own: it is kept as
    ``user_rank``, ``user_attempt`` or ``user_time`` (the rank's log says so once).
    Values may be numbers (tensors and numpy scalars become numbers), text, or
    NaN and infinities, which are kept as they are everywhere. A value is turned
    into a number here, in the call: a tensor changed in place afterwards keeps the
    reported value. On a GPU that means ``.item()``, which waits for the step's
    queued kernels (as ``loss.item()`` in your own code would); report a Python
    number, or report every few steps, where that wait matters. Example::

        nbtrain.report(loss=loss.item(), lr=scheduler.get_last_lr()[0])
        nbtrain.report({"loss": loss.item()}, epoch=epoch)
    """
    if metrics is None:
        current_session().report(more)
        return
    if not isinstance(metrics, dict):
        raise TypeError(f"report() takes a dict of metrics or keywords, not {type(metrics).__name__}: "
                        "write nbtrain.report(loss=0.5) or nbtrain.report({'loss': 0.5}).")
    twice = sorted(set(metrics) & set(more))
    if twice:
        raise TypeError(f"report() was given {', '.join(map(repr, twice))} both in the dict and as a keyword: "
                        "pass each metric once.")
    current_session().report({**metrics, **more})


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
    :func:`prepare_optimizer`); default: the run's ``precision`` option. Example::

        model = nbtrain.prepare_model(Net(), strategy="fsdp", auto_wrap_policy={Block}, precision="bf16-mixed")
    """
    import torch

    session = current_session()
    if precision == RUN_PRECISION:
        precision = session.precision
    parallel.check_choices(strategy, precision)
    ctx = session.context
    model = parallel.distribute(model, ctx.device, ctx.world_size, strategy, auto_wrap_policy,
                                dict(fsdp_kwargs or {}), ddp_kwargs)
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
    size (see the option), once per optimizer.
    """
    session = current_session()
    if session.lr_scale != 1.0 and not getattr(optimizer, "_nbtrain_lr_scaled", False):
        for group in optimizer.param_groups:
            group["lr"] = group["lr"] * session.lr_scale
            if "initial_lr" in group:  # an LR scheduler made before: its base follows
                group["initial_lr"] = group["initial_lr"] * session.lr_scale
        optimizer._nbtrain_lr_scaled = True
    if session.adaptive_batch is not None and optimizer not in session.optimizers:
        session.optimizers.append(optimizer)  # its learning rate follows the batch size (see adaptive_batch)
    scaler = session.grad_scaler
    return optimizer if scaler is None else parallel.ScaledOptimizer(optimizer, scaler)


def backward(loss: Any) -> None:
    """``loss.backward()``, of the scaled loss when a ``"16-mixed"`` model was prepared."""
    scaler = current_session().grad_scaler
    (loss if scaler is None else scaler.scale(loss)).backward()


class PreparedLoader:
    """A DataLoader that shards with DistributedSampler, moves batches to the device,
    reshuffles per epoch, counts steps for ``report()``, and (``adaptive_batch``)
    changes its batch size between epochs."""

    def __init__(self, make: Callable[[int | None], Any], batch_size: int | None, move_to_device: bool) -> None:
        self._make = make              # batch size -> the DataLoader over this rank's shard
        self._batch = batch_size
        self._initial = batch_size
        self._loader = make(batch_size)
        self._move = move_to_device
        self._epoch = 0
        self._timed = [0.0, 0]         # seconds and steps timed at the current batch size this epoch
        self._step_times: dict[int, float] = {}  # per-rank batch size -> mean step time over the ranks

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)

    def __iter__(self) -> Iterator[Any]:
        session = current_session()
        if self._epoch > 0 and session.adaptive_batch is not None and self._batch is not None:
            self._adapt(session)
        sampler = getattr(self._loader, "sampler", None)
        set_epoch = getattr(sampler, "set_epoch", None)
        if set_epoch is not None:
            set_epoch(self._epoch)
        session.epoch = self._epoch
        device = session.context.device
        handed: float | None = None  # when the last batch was handed to the training step
        for batch in self._loader:
            if handed is not None:
                self._timed[0] += time.perf_counter() - handed
                self._timed[1] += 1
            session.on_batch(_batch_size(batch))
            yield _to_device(batch, device) if self._move else batch
            handed = time.perf_counter()
        self._epoch += 1

    def _adapt(self, session: Any) -> None:
        """Pick the next epoch's batch size with every rank (one all-reduce of four numbers) and apply it."""
        import torch
        import torch.distributed as dist

        assert session.noise is not None and session.adaptive_batch is not None and self._batch is not None
        ctx = session.context
        noise, (seconds, steps) = session.noise, self._timed
        known = noise.true_sq.value is not None
        stats = torch.tensor([noise.true_sq.value or 0.0, noise.trace.value or 0.0,
                              seconds / steps if steps else 0.0, 1.0 if known and steps else 0.0],
                             dtype=torch.float64, device=ctx.device)
        dist.all_reduce(stats)
        true_sq, trace, step_time, ready = (float(v) / ctx.world_size for v in stats.tolist())
        if ready < 1.0:  # a rank has no estimate or no timed step yet: keep the size another epoch
            return
        self._step_times[self._batch] = step_time
        self._timed = [0.0, 0]
        assert self._initial is not None
        choice = adaptive_batch.choose(self._batch, self._initial, session.adaptive_batch, ctx.world_size,
                                       gradient_noise.ratio(trace, true_sq), self._step_times)
        for optimizer in session.optimizers:
            for group in optimizer.param_groups:
                group["lr"] = group["lr"] * choice.lr_gain / session.lr_gain
        session.lr_gain = choice.lr_gain
        if choice.batch_size != self._batch:
            print(f"[nbtrain] epoch {self._epoch}: batch size {self._batch} -> {choice.batch_size} per rank "
                  f"(gradient noise scale {gradient_noise.ratio(trace, true_sq):.4g}, "
                  f"learning rate x{choice.lr_gain:.3g} of the start)", file=sys.stderr)
            self._batch = choice.batch_size
            self._loader = self._make(choice.batch_size)


def prepare_loader(loader: Any, move_to_device: bool = True) -> PreparedLoader:
    """Give each rank its own shard of ``loader``'s data (a ``DistributedSampler``).

    Keeps the loader's batch size, workers and collate function; ``shuffle=True``
    loaders stay shuffled, differently each epoch. In an elastic run the batch size is that
    of ``min`` ranks' global batch shared by this attempt's ranks (see ``scale_lr``). With
    the run's ``adaptive_batch=(min, max)`` the batch size starts at the loader's (kept
    within the bounds) and is chosen again at the start of every epoch. Example::

        loader = nbtrain.prepare_loader(DataLoader(train_set, batch_size=64, shuffle=True))
    """
    from torch.utils.data import DataLoader, DistributedSampler, RandomSampler

    ctx = current_session().context
    session = current_session()
    session.uses_loader = True
    batch_size = loader.batch_size
    if batch_size is not None and session.batch_scale != 1.0:
        batch_size = max(1, round(batch_size * session.batch_scale))
    if batch_size is not None and session.adaptive_batch is not None:
        low, high = session.adaptive_batch
        batch_size = min(max(batch_size, low), high)
    sampler = loader.sampler
    if ctx.world_size > 1 and not isinstance(loader.sampler, DistributedSampler):
        sampler = DistributedSampler(loader.dataset, num_replicas=ctx.world_size, rank=ctx.rank,
                                     shuffle=isinstance(loader.sampler, RandomSampler))
    if sampler is loader.sampler and batch_size == loader.batch_size and session.adaptive_batch is None:
        return PreparedLoader(lambda _size: loader, batch_size, move_to_device)

    def make(size: int | None) -> Any:
        return DataLoader(
            loader.dataset, batch_size=size, sampler=sampler,
            num_workers=loader.num_workers, collate_fn=loader.collate_fn,
            pin_memory=loader.pin_memory, drop_last=loader.drop_last,
            timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
            persistent_workers=loader.persistent_workers if loader.num_workers > 0 else False,
        )

    return PreparedLoader(make, batch_size, move_to_device)


def _batch_size(batch: Any) -> int:
    first = batch
    while isinstance(first, (list, tuple)) and first:
        first = first[0]
    if isinstance(first, dict) and first:
        first = next(iter(first.values()))
    shape = getattr(first, "shape", None)
    return int(shape[0]) if shape else 1


def _to_device(batch: Any, device: Any) -> Any:
    if hasattr(batch, "to"):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_device(item, device) for item in batch)
    if isinstance(batch, dict):
        return {key: _to_device(value, device) for key, value in batch.items()}
    return batch


def checkpoint_requested() -> bool:
    """Whether the run wants a checkpoint now: an elastic run (``workers=(min, max)``) about to change
    size asks for one, and goes on at the new size from it. Check it once per step or batch and save::

        if nbtrain.checkpoint_requested():
            nbtrain.save_checkpoint({"model": model.state_dict(), "step": step})

    Without the check the resize waits for the function's next checkpoint. Always False in a
    run of fixed size. Costs an attribute read: the answer is fetched in the background.
    """
    return current_session().checkpoint_requested


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
    """
    import ray
    import torch

    session = current_session()
    session.land_reported()
    if sharded:
        ctx = session.context
        step = session.current_step()
        path = sharded_checkpoint.save(obj, session.storage, ctx.run_name, ctx.attempt, step)
        if ctx.rank == 0:
            meta = {"step": step, "epoch": session.epoch, "attempt": ctx.attempt, "time": time.time(),
                    "format": "dcp"}
            ray.get(session.supervisor.record_checkpoint.remote(meta, None, path))
        return
    obj = parallel.gather_shards(obj)
    if session.context.rank != 0:
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
    if not session.storage:
        ray.get(session.supervisor.record_checkpoint.remote(meta, data, None))
        return
    path = storage_checkpoint(session.storage, ctx.run_name, ctx.attempt, step, form)
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
    return load_trusted(source, current_session().context.device, current_session().weights_only)


def checkpoint_to_resume() -> tuple[dict[str, Any], bytes | str] | None:
    """The meta and bytes (or its path in ``storage=``, see ``checkpoint_source``) of the checkpoint this
    attempt started from, the same for every rank; the default step continues from it."""
    import ray

    session = current_session()
    found = ray.get(session.supervisor.checkpoint_to_resume.remote())
    if found is None:
        return None
    meta, data, path = found
    session.step = session.report_calls = session.last_step = int(meta.get("step", 0))
    return meta, checkpoint_source(data, path, meta.get("format", "torch"))


def get_dataset_shard(name: str = "train") -> Any:
    """This rank's shard of a Ray Dataset passed as ``datasets={name: ds}`` to ``launch()``.

    Example::

        for batch in nbtrain.get_dataset_shard("train").iter_torch_batches(batch_size=64):
            ...
    """
    session = current_session()
    try:
        return CountedShard(session.datasets[name], lambda batch: session.on_batch(_batch_size(batch)))
    except KeyError:
        known = ", ".join(sorted(session.datasets)) or "none"
        msg = f"No dataset named {name!r} was passed to launch(datasets=...); this run has: {known}."
        raise NbtrainError(msg) from None
