"""``prepare_loader``: each rank's share of a ``DataLoader``, on the rank's device, counted as steps.

The loader the user built is taken apart only as far as sharding needs: its sampler (or batch
sampler) is shared out among the ranks with its meaning kept (:mod:`.sharded_sampling`), and every
other argument it was made with is passed on. The prepared loader moves batches to the rank's
device, tells its sampler the epoch, counts batches for ``report()``'s step and, with
``adaptive_batch``, picks the next epoch's batch size with the other ranks. Runs in each rank's process.
"""

from __future__ import annotations

import inspect
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from nbtrain._cluster.elastic import adaptive_batch, gradient_noise
from nbtrain._cluster.rank import optimizer_settings
from nbtrain._cluster.rank.data.sharded_sampling import RankShare
from nbtrain._cluster.rank.session import current_session

_END = object()  # the loader's iterator is done


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
        self._taken = 0                # batches handed out in the current epoch
        self._back_to: tuple[int, int] | None = None  # a rewind's (epoch, batches to pass over), until iterated
        self._timed = [0.0, 0]         # seconds and steps timed at the current batch size this epoch
        self._step_times: dict[int, float] = {}  # per-rank batch size -> mean step time over the ranks
        current_session().steering.points.loaders.append(self)  # its place is kept at each checkpoint

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def position(self) -> int:
        """Batches handed out in the current epoch (a restore point keeps it, see rank/rewinding)."""
        return self._taken

    def go_back(self, epoch: int, taken: int, skip: int) -> None:
        """A rewind: the iteration in progress goes on from batch ``taken + skip`` of ``epoch`` (the skipped
        batches are read and passed over: the sampler's order is kept whatever it is)."""
        self._epoch, self._taken = epoch, taken + skip
        self._back_to = (epoch, taken + skip)

    def _taken_back(self) -> tuple[int, int] | None:
        back_to, self._back_to = self._back_to, None
        return back_to

    def _batches_from(self, epoch: int, start: int) -> Iterator[Any]:
        for sampler in (getattr(self._loader, "sampler", None), getattr(self._loader, "batch_sampler", None)):
            set_epoch = getattr(sampler, "set_epoch", None)
            if set_epoch is not None:
                set_epoch(epoch)
        batches: Iterator[Any] = iter(self._loader)
        for _ in range(start):
            if next(batches, _END) is _END:
                break
        return batches

    def __iter__(self) -> Iterator[Any]:
        session = current_session()
        if self._epoch > 0 and session.adaptive_batch is not None and self._batch is not None:
            self._adapt(session)
        session.steering.at_epoch_start(self._epoch)  # run.stop(after="epoch") holds the rank here
        session.epoch = self._epoch
        device, timing = session.context.device, session.timing
        handed: float | None = None  # when the last batch was handed to the training step
        self._taken, self._back_to = 0, None
        batches = self._batches_from(self._epoch, 0)
        while True:
            asked = time.perf_counter()
            if session.steering.pending:
                session.steering.at_batch()  # a rewind due now calls go_back()
                if (back_to := self._taken_back()) is not None:
                    batches = self._batches_from(*back_to)
            batch = next(batches, _END)
            if batch is _END:
                break
            if handed is not None:  # the step, its wait for this batch included
                self._timed[0] += time.perf_counter() - handed
                self._timed[1] += 1
            self._taken += 1
            session.on_batch(batch_size_of(batch))
            if self._move:
                batch = _to_device(batch, device)
            if timing is not None:  # waiting for the batch, its move to the device included (see step_timing)
                timing.batch(time.perf_counter() - asked)
            yield batch
            handed = time.perf_counter()
        if timing is not None:
            timing.pause()
        self._epoch += 1
        self._taken = 0

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
                                       gradient_noise.ratio(trace, true_sq), self._step_times, session.lr_gain)
        for optimizer in session.optimizers:  # their schedules follow (see optimizer_settings.rescale_lr)
            optimizer_settings.rescale_lr(optimizer, choice.lr_gain / session.lr_gain)
        session.lr_gain = choice.lr_gain
        if choice.batch_size != self._batch:
            print(f"[nbtrain] epoch {self._epoch}: batch size {self._batch} -> {choice.batch_size} per rank "
                  f"(gradient noise scale {gradient_noise.ratio(trace, true_sq):.4g}, "
                  f"learning rate x{choice.lr_gain:.3g} of the start)", file=sys.stderr)
            self._batch = choice.batch_size
            self._loader = self._make(choice.batch_size)


def prepare_loader(loader: Any, move_to_device: bool = True) -> PreparedLoader:
    """Give each rank its own shard of ``loader``'s data.

    A plain loader (sequential, or ``shuffle=True``) gets a ``DistributedSampler``; shuffled loaders
    stay shuffled, differently each epoch. Any other sampler keeps its meaning: a
    ``WeightedRandomSampler``, ``SubsetRandomSampler``, custom sampler or custom ``batch_sampler``
    runs alike on every rank (same seed per epoch) and each rank takes its share of what it
    yields (see :mod:`~nbtrain._cluster.rank.data.sharded_sampling`; a sampler whose draws nbtrain
    cannot seed is refused, saying what to do). A ``DistributedSampler`` is kept as it is, and an
    ``IterableDataset``'s loader is returned unchanged: such a dataset shards itself (use
    ``get_context().rank``). Every other argument the loader was made with (workers, collate
    function, ``prefetch_factor``, ``generator``, ``multiprocessing_context``...) is kept. In an
    elastic run the batch size is that
    of ``min`` ranks' global batch shared by this attempt's ranks (see ``scale_lr``). With
    the run's ``adaptive_batch=(min, max)`` the batch size starts at the loader's (kept
    within the bounds) and is chosen again at the start of every epoch.

    Args:
        loader: a ``torch.utils.data.DataLoader``.
        move_to_device: move each batch's tensors to the rank's device.

    Returns:
        A loader to iterate as the original (``len()``, epochs, ``set_epoch``), yielding this rank's batches.

    Raises:
        NbtrainError: called outside a training function.
        InvalidOptionError: a sampler whose draws nbtrain cannot seed (the message says what to do).

    Example::

        loader = nbtrain.prepare_loader(DataLoader(train_set, batch_size=64, shuffle=True))
    """
    from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, IterableDataset, RandomSampler

    ctx = current_session().context
    session = current_session()
    session.uses_loader = True
    if isinstance(loader.dataset, IterableDataset):
        return PreparedLoader(lambda _size: loader, loader.batch_size, move_to_device)
    custom_batches = loader.batch_size is None and not isinstance(loader.batch_sampler, BatchSampler) \
        and loader.batch_sampler is not None
    if custom_batches:  # the user's batch sampler decides the batches: each rank takes its share of them
        share = RankShare(loader.batch_sampler, ctx.rank, ctx.world_size) if ctx.world_size > 1 else None
        kept = _loader_arguments(loader)
        return PreparedLoader(lambda _size: loader if share is None else DataLoader(
            loader.dataset, batch_sampler=share, **kept), None, move_to_device)
    batch_size = loader.batch_size
    if batch_size is not None and session.batch_scale != 1.0:
        batch_size = max(1, round(batch_size * session.batch_scale))
    if batch_size is not None and session.adaptive_batch is not None:
        low, high = session.adaptive_batch
        batch_size = min(max(batch_size, low), high)
    sampler: Any = loader.sampler
    if ctx.world_size > 1 and not isinstance(sampler, DistributedSampler):
        plain_shuffle = (type(sampler) is RandomSampler and not sampler.replacement
                         and sampler.num_samples == len(sampler.data_source))
        if plain_shuffle or type(sampler).__name__ == "SequentialSampler":
            sampler = DistributedSampler(loader.dataset, num_replicas=ctx.world_size, rank=ctx.rank,
                                         shuffle=plain_shuffle)
        else:
            sampler = RankShare(sampler, ctx.rank, ctx.world_size)
    if sampler is loader.sampler and batch_size == loader.batch_size and session.adaptive_batch is None:
        return PreparedLoader(lambda _size: loader, batch_size, move_to_device)
    kept = _loader_arguments(loader)

    def make(size: int | None) -> Any:
        return DataLoader(loader.dataset, batch_size=size, sampler=sampler, drop_last=loader.drop_last, **kept)

    return PreparedLoader(make, batch_size, move_to_device)


def _loader_arguments(loader: Any) -> dict[str, Any]:
    """Every argument ``loader`` was made with that says how to load, not what to sample (those
    prepare_loader sets): workers, collate function, ``prefetch_factor``, ``generator``, ..."""
    from torch.utils.data import DataLoader

    sampling = {"self", "dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "drop_last"}
    kept = {name: getattr(loader, name) for name in inspect.signature(DataLoader.__init__).parameters
            if name not in sampling and hasattr(loader, name)}
    if loader.num_workers == 0:  # DataLoader refuses these without worker processes
        kept.pop("prefetch_factor", None)
        kept["persistent_workers"] = False
    return kept


def batch_size_of(batch: Any) -> int:
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
