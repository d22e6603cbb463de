"""A rank reuses the memory a step freed instead of faulting in fresh pages the next step.

Real ranks on the loopback cluster. 64 MiB is above anything glibc's own
dynamic mmap threshold reaches (32 MiB), so with glibc's defaults every such
tensor is a new mapping whose 16 384 pages fault on first touch; a rank that
keeps freed memory touches pages it already has.
"""

from __future__ import annotations

import sys

import pytest

import nbtrain

pytestmark = [pytest.mark.cluster,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc tuning is Linux-only")]

PAGES_PER_TENSOR = 64 * 2**20 // 4096


def _faults_per_big_tensor():
    """Minor page faults per allocate-touch-free of a 64 MiB tensor, after one warm-up round."""
    import resource

    import torch

    def once():
        block = torch.ones(16 * 2**20)  # 64 MiB of float32, every page written
        del block

    once()
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    for _ in range(10):
        once()
    return (resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before) / 10


def test_ranks_reuse_freed_tensor_memory(cluster):
    run = nbtrain.launch(_faults_per_big_tensor, workers=2, name="malloc-kept")
    assert run.wait(timeout=180) == nbtrain.RunState.SUCCEEDED
    assert [w["malloc_tuned"] for w in run.workers] == [True, True]
    for rank, faults in enumerate(run.result):
        assert faults < PAGES_PER_TENSOR / 100, f"rank {rank} faulted {faults:.0f} pages per 64 MiB tensor"


def test_opting_out_keeps_glibcs_defaults(cluster):
    run = nbtrain.launch(_faults_per_big_tensor, workers=1, name="malloc-default",
                         env={"NBTRAIN_MALLOC_TUNING": "0"})
    assert run.wait(timeout=180) == nbtrain.RunState.SUCCEEDED
    assert run.workers[0]["malloc_tuned"] is False
    # glibc maps and unmaps a block this big every time: each round faults in every page again
    assert run.result[0] > PAGES_PER_TENSOR * 0.9
