"""A rank reuses the memory a training step freed instead of faulting in fresh pages.

Real ranks on the loopback cluster train a small CNN (8 MiB activations per
layer, as in the benchmark) and count their minor page faults per step after
warm-up. With glibc's defaults every step maps, unmaps and re-faults thousands
of pages; a rank that keeps freed memory touches only pages it already has.
"""

from __future__ import annotations

import sys

import pytest

import nbtrain

pytestmark = [pytest.mark.cluster,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc tuning is Linux-only")]


def _page_faults_per_step():
    """Median minor page faults of the training thread per SGD step of a small CNN, after warm-up.

    The median, because the heap may still grow once after warm-up (a one-off, not a per-step cost).
    """
    import resource
    import statistics

    import torch
    from torch import nn

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nbtrain.prepare_model(nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(1024, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 3, 32, 32), torch.randint(0, 10, (64,))

    def step():
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    for _ in range(5):
        step()
    faults = []
    for _ in range(11):
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        step()
        faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
    return statistics.median(faults)


def test_ranks_reuse_freed_tensor_memory(cluster):
    run = nbtrain.launch(_page_faults_per_step, workers=2, name="malloc-kept")
    assert run.wait(timeout=180) == nbtrain.RunState.SUCCEEDED
    assert [w["malloc_tuned"] for w in run.workers] == [True, True]
    for rank, faults in enumerate(run.result):
        assert faults < 100, f"rank {rank} faulted {faults:.0f} pages per step"


def test_opting_out_keeps_glibcs_defaults(cluster):
    run = nbtrain.launch(_page_faults_per_step, workers=2, name="malloc-default",
                         env={"NBTRAIN_MALLOC_TUNING": "0"})
    assert run.wait(timeout=180) == nbtrain.RunState.SUCCEEDED
    assert [w["malloc_tuned"] for w in run.workers] == [False, False]
    print(f"page faults per step with glibc's defaults: {run.result}")
    # the activations' pages are handed back to the OS and faulted in again every step
    assert min(run.result) > 1000
