"""Which warm worker a run's rank is lent, decided where the pool decides it (``choose``, ``stale_for``,
``lend`` in ``nbtrain/_cluster/warm/warm_pool.py``), with fake workers: fewer ranks leave the others idle,
more start only the missing ones, another shape ends the idle ones, and on GPUs a worker is lent only to a
rank whose bundle gives it the CUDA view it first had (CUDA reads ``CUDA_VISIBLE_DEVICES`` once).

That real processes are reused, a killed one is not, and idle ones exit: ``test_warm_workers.py``. Which
CUDA view a bundle's GPU ids give each rank: ``test_gpu_layout.py``."""

from __future__ import annotations

import pytest

from nbtrain._cluster.supervisor.worker_group import giving_back
from nbtrain._cluster.warm.warm_pool import Shape, _Worker, choose, lend, stale_for

pytestmark = pytest.mark.quick

CPU = Shape(1.0, 0.0, (), "{}")
GPU = Shape(1.0, 1.0, (), "{}")
ONE_GPU_0, ONE_GPU_1 = ("0", "cuda:0"), ("1", "cuda:0")  # one rank on GPU 0 or on GPU 1
BOTH_GPUS_FIRST = ("0,1", "cuda:0")                       # two ranks on one node: each sees both, uses one


def worker(pid: int, shape: Shape = CPU, node: str = "a", view: tuple[str, str] | None = None,
           run: str | None = None) -> _Worker:
    return _Worker(handle=f"worker-{pid}", shape=shape, node_id=node, pid=pid, cuda_view=view, leased_by=run)


def test_fewer_ranks_take_some_idle_workers_and_more_start_only_the_missing_ones():
    idle = [worker(1), worker(2)]
    assert choose([("a", None)], idle) == [idle[0]], "one rank takes one idle worker; the other stays idle"
    three = choose([("a", None)] * 3, idle)
    assert three[:2] == idle and three[2] is None, "a third rank gets a new worker"
    assert choose([("b", None)], idle) == [None], "a worker is lent only on its own node"


def test_another_shape_ends_the_idle_workers_and_a_restarted_runs_own_lease_is_ended():
    idle_cpu, busy_cpu, mine = worker(1), worker(2, run="other-run"), worker(3, run="this-run")
    ended = stale_for([idle_cpu, busy_cpu, mine], "this-run", GPU)
    assert ended == [idle_cpu, mine], "idle workers of another shape end; another run's busy ones are kept"
    assert stale_for([idle_cpu, busy_cpu], "this-run", CPU) == [], "the same shape keeps its idle workers"


def test_a_worker_is_lent_again_only_to_a_rank_with_the_cuda_view_it_first_had():
    on_gpu_0 = worker(1, GPU, view=ONE_GPU_0)
    assert choose([("a", ONE_GPU_0)], [on_gpu_0]) == [on_gpu_0]
    assert choose([("a", ONE_GPU_1)], [on_gpu_0]) == [None], "another GPU: CUDA would keep its first one"
    assert choose([("a", BOTH_GPUS_FIRST)], [on_gpu_0]) == [None], "the same index, other visible ids"


def test_a_worker_that_never_had_a_gpu_takes_the_first_view_it_is_lent_and_keeps_it():
    fresh = worker(1, GPU)
    [chosen] = choose([("a", ONE_GPU_1)], [fresh])
    assert chosen is fresh
    lend(fresh, "first-run", ONE_GPU_1)
    assert fresh.leased_by == "first-run" and fresh.cuda_view == ONE_GPU_1
    fresh.leased_by = None  # given back
    assert choose([("a", ONE_GPU_0)], [fresh]) == [None]
    lend(fresh, "cpu-run", None)
    assert fresh.cuda_view == ONE_GPU_1, "a run without GPUs does not clear the view CUDA already read"


def test_an_attempt_gives_back_the_ranks_whose_run_returned_reusable_whatever_its_outcome():
    assert giving_back(2, replaced=set(), reusable={0, 1}) == [0, 1], "a run that ended well: every rank"
    assert giving_back(2, replaced=set(), reusable={1}) == [1], \
        "rank 1 raised and returned; rank 0, still waiting in a collective, is killed"
    assert giving_back(2, replaced=set(), reusable=set()) == [], "stopped: no rank returned"
    assert giving_back(3, replaced={2}, reusable={0, 1, 2}) == [0, 1], \
        "a worker started in place of a leased one lost while starting was never the pool's"
