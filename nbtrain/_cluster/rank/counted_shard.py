"""A rank's Ray Dataset shard whose batches count toward its samples/s, as ``prepare_loader``'s do.

Without it the worker table could only show steps/s for runs that read a
Ray Dataset: the rank never learns how many samples a step took.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


class CountedShard:
    """Wraps ``ray.data.DataIterator``: every batch it yields is passed to ``on_batch`` first;
    everything else is the iterator's own."""

    def __init__(self, shard: Any, on_batch: Callable[[Any], None]) -> None:
        self._shard = shard
        self._on_batch = on_batch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._shard, name)

    def _counted(self, batches: Any) -> Iterator[Any]:
        for batch in batches:
            self._on_batch(batch)
            yield batch

    def iter_batches(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        return self._counted(self._shard.iter_batches(*args, **kwargs))

    def iter_torch_batches(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        return self._counted(self._shard.iter_torch_batches(*args, **kwargs))
