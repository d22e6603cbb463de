"""A rank runs the user's function only once every rank has joined the process group.

Without it, a rank whose function ends at once (two ``report()`` calls) destroyed its side of gloo's mesh
while its peer was still connecting, and the peer's ``init_process_group`` failed with "Connection closed by
peer" (seen once in CI, in ``test_run_data``). Real ``torch.distributed`` in two processes; no Ray needed.
"""

from __future__ import annotations

import multiprocessing
import os
import types

from nbtrain._cluster.rank.actor import worker
from nbtrain._net import free_port


def _join_and_count(rank: int, port: int, answers: multiprocessing.Queue) -> None:
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    payload = types.SimpleNamespace(
        place=types.SimpleNamespace(rank=rank, world_size=2),
        process_group=types.SimpleNamespace(master_addr="127.0.0.1", master_port=port, backend="gloo",
                                            collective_timeout_s=30))
    worker._join_process_group(payload, None)
    store = distributed_c10d._get_default_store().underlying_store  # the TCPStore the run's ranks meet on
    key = f"{distributed_c10d.STORE_BASED_BARRIER_PREFIX}:{dist.group.WORLD.group_name}"
    answers.put((rank, store.add(key, 0), os.environ.get(worker.INIT_BARRIER_ENV)))
    dist.barrier()  # the store (rank 0's) stays up until both have read it
    dist.destroy_process_group()


def test_each_rank_returns_from_joining_only_once_every_rank_has_joined():
    context = multiprocessing.get_context("spawn")
    answers = context.Queue()
    port = free_port("127.0.0.1")
    ranks = [context.Process(target=_join_and_count, args=(rank, port, answers)) for rank in (0, 1)]
    for process in ranks:
        process.start()
    seen = sorted(answers.get(timeout=60) for _ in ranks)
    for process in ranks:
        process.join(timeout=30)
    # each rank, as its join returns, finds both ranks counted as joined; the switch is not left set for user code
    assert seen == [(0, 2, None), (1, 2, None)]
    assert [process.exitcode for process in ranks] == [0, 0]
