"""Each rank's share of a ``DataLoader``'s samples or batches, with the meaning the user gave them.

``prepare_loader`` replaces a plain sequential or shuffling loader with PyTorch's
``DistributedSampler``. Any other sampler means something a ``DistributedSampler`` would lose:
a ``WeightedRandomSampler`` draws by weight, a ``SubsetRandomSampler`` only from its indices, a
custom ``batch_sampler`` groups samples its own way. Here every rank runs the user's own sampler
with the same seed for the epoch, so all ranks see one and the same sequence, and takes every
``world_size``-th item of it from its rank on: together the ranks draw exactly what one process
would have, each a disjoint share. The sequence is padded by repeating its start to a multiple
of ``world_size``, as ``DistributedSampler`` does, so every rank takes as many steps (a rank
with fewer batches would leave the others waiting in an all-reduce).

The seed is the sampler's own generator's, when the user gave one, else 0; plus the epoch. A
custom sampler without a ``generator`` attribute is shared out only if it gives the same sequence
under two different global seeds (it draws nothing at random); one that draws from the global
RNG would give each rank another sequence, and is refused with what to do instead. Runs in each
rank's process.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from nbtrain._exceptions import InvalidOptionError

# torch.utils.data samplers whose only randomness is their ``generator`` attribute
_SEEDABLE = ("RandomSampler", "SubsetRandomSampler", "WeightedRandomSampler")
_ORDERED = ("SequentialSampler",)


class RankShare:
    """Every ``world_size``-th item, from ``rank`` on, of ``source`` (a sampler or batch sampler) run with
    the epoch's seed on every rank. ``set_epoch`` as ``DistributedSampler`` has it."""

    def __init__(self, source: Any, rank: int, world_size: int) -> None:
        refusal = unshareable(source)
        if refusal is not None:
            raise InvalidOptionError(refusal)
        self.source = source
        self.rank = rank
        self.world_size = world_size
        self._seeded = _generator_holder(source)
        generator = getattr(self._seeded, "generator", None)
        self.seed = int(generator.initial_seed()) if generator is not None else 0
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[Any]:
        import torch

        if self._seeded is not None:
            self._seeded.generator = torch.Generator().manual_seed(self.seed + self.epoch)
        items = list(self.source)
        if not items:
            return iter(())
        total = -(-len(items) // self.world_size) * self.world_size
        items += (items * (total // len(items) + 1))[: total - len(items)]
        return iter(items[self.rank::self.world_size])

    def __len__(self) -> int:
        return -(-len(self.source) // self.world_size)


def _generator_holder(source: Any) -> Any:
    """The object whose ``generator`` attribute ``source`` draws from: itself, or a batch sampler's sampler."""
    for candidate in (source, getattr(source, "sampler", None)):
        if candidate is not None and hasattr(candidate, "generator"):
            return candidate
    return None


def unshareable(source: Any) -> str | None:
    """Why ``source`` cannot be shared out among the ranks with its meaning kept, or None."""
    kind = type(source)
    if kind.__module__.startswith("torch.utils.data") and kind.__name__ in _SEEDABLE + _ORDERED:
        return None
    if kind.__module__.startswith("torch.utils.data") and kind.__name__ == "BatchSampler":
        return unshareable(source.sampler)
    if _generator_holder(source) is not None or _same_under_two_seeds(source):
        return None
    name = f"{kind.__module__}.{kind.__qualname__}"
    return (f"prepare_loader cannot share {name} out among the ranks: it draws from the global random "
            f"number generator, which differs on every rank, so the ranks' shares would overlap. Give it "
            f"a `generator` attribute that it draws from (nbtrain seeds it alike on every rank, per epoch), "
            f"or make it a torch.utils.data.DistributedSampler that yields this rank's share itself "
            f"(nbtrain.get_context().rank and .world_size); prepare_loader keeps a DistributedSampler as it is.")


def _same_under_two_seeds(source: Any) -> bool:
    """Whether ``source`` yields the same sequence whatever the global random state (restored after)."""
    import random
    import sys

    import torch

    numpy = sys.modules.get("numpy")
    saved = (random.getstate(), numpy.random.get_state() if numpy is not None else None)
    sequences = []
    try:
        with torch.random.fork_rng():  # torch's generators come back as they were
            for seed in (1, 2):
                random.seed(seed)
                torch.manual_seed(seed)
                if numpy is not None:
                    numpy.random.seed(seed)
                sequences.append(list(source))
    finally:
        random.setstate(saved[0])
        if numpy is not None:
            numpy.random.set_state(saved[1])
    return sequences[0] == sequences[1]
