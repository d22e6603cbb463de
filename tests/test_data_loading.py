"""``prepare_loader`` keeps what the user's DataLoader means: a weighted, subset or custom sampler and a
custom batch sampler are shared out among the ranks (disjoint shares that together are what one process
would draw), every other DataLoader argument is kept, and a sampler whose draws cannot be made the same
on every rank is refused with a message naming it.

One 2-rank run on the loopback cluster prepares each kind of loader on both ranks and returns what
each rank drew; the test compares the ranks' shares with what the sampler gives in this process.
"""

from __future__ import annotations

import random
import sys

import cloudpickle
import pytest
import torch
from torch.utils.data import DataLoader, Sampler, SubsetRandomSampler, WeightedRandomSampler

import nbtrain

ITEMS = list(range(16))
WEIGHTS = [0.0] * 8 + [1.0] * 8          # only the second half may ever be drawn
SUBSET = [1, 3, 5, 7, 9, 11, 13, 15]
BATCHES = [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11], [12, 13, 14]]


class GlobalShuffle(Sampler):
    """Draws from Python's global random state: the ranks' draws would differ."""

    def __iter__(self):
        order = list(ITEMS)
        random.shuffle(order)
        return iter(order)

    def __len__(self):
        return len(ITEMS)


class EveryOther(Sampler):
    """A custom sampler with nothing random in it."""

    def __iter__(self):
        return iter(ITEMS[::2])

    def __len__(self):
        return len(ITEMS) // 2


def draw_every_kind(config):
    def drawn(loader):
        return [int(item) if not isinstance(item, torch.Tensor) else item.tolist() for item in
                nbtrain.prepare_loader(loader)]

    weighted = WeightedRandomSampler(WEIGHTS, num_samples=16, replacement=True,
                                     generator=torch.Generator().manual_seed(7))
    kept_loader = nbtrain.prepare_loader(DataLoader(
        ITEMS, batch_size=4, sampler=SubsetRandomSampler(SUBSET), num_workers=1, prefetch_factor=3,
        persistent_workers=True, multiprocessing_context="fork", generator=torch.Generator().manual_seed(3),
        pin_memory=False, timeout=30))
    try:
        nbtrain.prepare_loader(DataLoader(ITEMS, batch_size=None, sampler=GlobalShuffle()))
        refused = None
    except nbtrain.InvalidOptionError as exc:
        refused = str(exc)
    return {
        "weighted": drawn(DataLoader(ITEMS, batch_size=None, sampler=weighted)),
        "subset": drawn(DataLoader(ITEMS, batch_size=None, sampler=SubsetRandomSampler(SUBSET))),
        "batches": drawn(DataLoader(ITEMS, batch_sampler=BATCHES)),
        "every_other": drawn(DataLoader(ITEMS, batch_size=None, sampler=EveryOther())),
        "kept": {name: repr(getattr(kept_loader, name)) for name in
                 ("prefetch_factor", "persistent_workers", "num_workers", "timeout", "batch_size")}
                | {"multiprocessing_context": kept_loader.multiprocessing_context.get_start_method(),
                   "generator_seed": kept_loader.generator.initial_seed()},
        "refused": refused,
    }


@pytest.fixture(scope="module")
def shares(cluster):
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # before the per-test fixture that does it
    run = nbtrain.launch(draw_every_kind, workers=2, name="data-loading")
    assert run.wait(timeout=180) == nbtrain.RunState.SUCCEEDED, run.error
    return run.result


def _disjoint_and_together(first: list, second: list, whole: list) -> None:
    assert len(first) == len(second), (first, second)  # as many steps on every rank
    assert sorted(map(repr, first + second)) == sorted(map(repr, whole))


def test_a_weighted_sampler_draws_by_weight_across_the_ranks(shares):
    alone = list(WeightedRandomSampler(WEIGHTS, num_samples=16, replacement=True,
                                       generator=torch.Generator().manual_seed(7)))
    _disjoint_and_together(shares[0]["weighted"], shares[1]["weighted"], alone)
    assert all(item >= 8 for item in shares[0]["weighted"] + shares[1]["weighted"])


def test_a_subset_sampler_shares_out_its_subset(shares):
    first, second = shares[0]["subset"], shares[1]["subset"]
    assert not set(first) & set(second)
    _disjoint_and_together(first, second, SUBSET)


def test_a_custom_batch_sampler_keeps_its_batches(shares):
    first, second = shares[0]["batches"], shares[1]["batches"]
    padded = BATCHES + BATCHES[:1]  # 5 batches on 2 ranks: the first comes round again, as DistributedSampler pads
    _disjoint_and_together(first, second, padded)


def test_a_custom_sampler_without_randomness_is_shared_out(shares):
    _disjoint_and_together(shares[0]["every_other"], shares[1]["every_other"], ITEMS[::2])


def test_every_other_dataloader_argument_is_kept(shares):
    assert shares[0]["kept"] == {"prefetch_factor": "3", "persistent_workers": "True", "num_workers": "1",
                                 "timeout": "30", "batch_size": "4", "multiprocessing_context": "fork",
                                 "generator_seed": 3}


def test_a_sampler_drawing_from_the_global_rng_is_refused_by_name(shares):
    message = shares[0]["refused"]
    assert message is not None and "GlobalShuffle" in message
    assert "`generator` attribute" in message and "DistributedSampler" in message
