"""A ``DistributedSampler``'s ``set_epoch(epoch)`` tells the rank which epoch it begins.

A torchrun script counts its epochs itself, and calls ``sampler.set_epoch(epoch)`` as each begins so
every rank shuffles alike: the one sign, in code that makes no nbtrain call, that an epoch starts. With it
the rank's heartbeat carries the epoch, and ``run.stop(after="epoch")`` holds the rank at the start of
the epoch after the one named, as a ``prepare_loader`` loader does (the run is stopped there). Where an
integration (Lightning's, Hugging Face's) counted epochs first, the samplers leave the counting to it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


def install(session: Any) -> Callable[[], None]:
    """Until the returned undo runs, ``DistributedSampler.set_epoch`` also counts ``session``'s epochs."""
    from torch.utils.data.distributed import DistributedSampler

    original = DistributedSampler.__dict__["set_epoch"]

    counting: list[bool] = []  # whether the samplers count this rank's epochs (decided at the first set_epoch)

    @functools.wraps(original)
    def set_epoch(sampler: Any, epoch: int) -> None:
        original(sampler, epoch)
        steering = session.steering
        if not counting:
            # Lightning's and Hugging Face's integrations count epochs already, and stop where their trainers
            # return: a hold here, in the trainer's epoch change, could leave the other rank in a collective
            counting.append(not steering.epochs_counted)
            steering.epochs_counted = True
        if counting[0]:
            steering.at_epoch_start(int(epoch))

    DistributedSampler.set_epoch = set_epoch

    def undo() -> None:
        DistributedSampler.set_epoch = original
    return undo
