"""``get_dataset_shard``: a rank's Ray Dataset shard whose batches count toward its samples/s, as
``prepare_loader``'s do, and whose waits for a batch count as the step's data wait (see :mod:`.step_timing`).

Without the count the worker table could only show steps/s for runs that read a
Ray Dataset: the rank never learns how many samples a step took. Ray Train code's
``ray.train.get_dataset_shard`` comes here too (:mod:`~nbtrain._cluster.rank.ray_train.seam`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from nbtrain._cluster.rank.data.loading import batch_size_of
from nbtrain._cluster.rank.inspection.step_timing import StepTimes
from nbtrain._cluster.rank.session import current_session
from nbtrain._exceptions import NbtrainError

_END = object()


def get_dataset_shard(name: str = "train") -> Any:
    """This rank's shard of a Ray Dataset passed as ``datasets={name: ds}`` to ``launch()``.

    Args:
        name: the key in ``datasets=``.

    Returns:
        This rank's shard, with Ray's ``DataIterator`` methods (``iter_torch_batches``...), its
        batches counted as ``report()``'s steps.

    Raises:
        NbtrainError: called outside a training function, or the run has no dataset ``name``.

    Example::

        for batch in nbtrain.get_dataset_shard("train").iter_torch_batches(batch_size=64):
            ...
    """
    session = current_session()
    try:
        return CountedShard(session.datasets[name], lambda batch: session.on_batch(batch_size_of(batch)),
                            session.timing)
    except KeyError:
        known = ", ".join(sorted(session.datasets)) or "none"
        msg = f"No dataset named {name!r} was passed to launch(datasets=...); this run has: {known}."
        raise NbtrainError(msg) from None


class CountedShard:
    """Wraps ``ray.data.DataIterator``: every batch it yields is passed to ``on_batch`` first, and the
    time its iterator took to give it to ``timing``; everything else is the iterator's own."""

    def __init__(self, shard: Any, on_batch: Callable[[Any], None], timing: StepTimes | None = None) -> None:
        self._shard = shard
        self._on_batch = on_batch
        self._timing = timing

    def __getattr__(self, name: str) -> Any:
        return getattr(self._shard, name)

    def _counted(self, batches: Any) -> Iterator[Any]:
        batches = iter(batches)
        while True:
            asked = time.perf_counter()
            batch = next(batches, _END)
            if batch is _END:
                break
            if self._timing is not None:
                self._timing.batch(time.perf_counter() - asked)
            self._on_batch(batch)
            yield batch
        if self._timing is not None:
            self._timing.pause()

    def iter_batches(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        return self._counted(self._shard.iter_batches(*args, **kwargs))

    def iter_torch_batches(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        return self._counted(self._shard.iter_torch_batches(*args, **kwargs))
