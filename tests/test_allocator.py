"""A rank reuses the memory a training step freed instead of faulting in fresh pages.

Real ranks on the loopback cluster train a small CNN (8 MiB activations per
layer, as in the benchmark) and count their minor page faults per step after
warm-up. With glibc's defaults the activations' pages are unmapped and faulted
in again every step (thousands of faults); a rank that keeps freed memory
touches only pages it already has.
"""

from __future__ import annotations

import os
import sys

import pytest

import nbtrain
from nbtrain._cluster.rank import allocator

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc tuning is Linux-only")


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


@linux_only
def test_ranks_reuse_freed_tensor_memory(cluster):
    run = nbtrain.launch(_page_faults_per_step, workers=2, name="malloc-kept")
    assert run.wait(timeout=180) == nbtrain.RunState.SUCCEEDED
    assert [w["malloc_tuned"] for w in run.workers] == [True, True]
    for rank, faults in enumerate(run.result):
        assert faults < 100, f"rank {rank} faulted {faults:.0f} pages per step"


def _one_row():
    nbtrain.report(step=1)


@linux_only
def test_a_run_can_keep_glibcs_defaults(cluster):
    """Said on every rank's row of the worker table; what glibc's defaults cost is the benchmark's (training the
    CNN here under them took 17 s of the session lane and asserted nothing of it)."""
    run = nbtrain.launch(_one_row, workers=2, name="malloc-default",
                         env={"NBTRAIN_MALLOC_TUNING": "0"})
    assert run.wait(timeout=180) == nbtrain.RunState.SUCCEEDED
    assert [w["malloc_tuned"] for w in run.workers] == [False, False]


def _libc_must_not_be_touched():
    raise AssertionError("mallopt was looked up although the allocator should be left alone")


@pytest.mark.parametrize("value", ["0", "false", "No", " off "])
def test_opting_out_leaves_the_allocator_alone(monkeypatch, value):
    monkeypatch.setenv("NBTRAIN_MALLOC_TUNING", value)
    monkeypatch.setattr(allocator, "_glibc_mallopt", _libc_must_not_be_touched)
    assert allocator.keep_freed_memory() is False


@pytest.mark.parametrize(("name", "value"), [("MALLOC_TRIM_THRESHOLD_", "4096"),
                                             ("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=65536")])
def test_the_users_own_malloc_settings_win(monkeypatch, name, value):
    monkeypatch.delenv("NBTRAIN_MALLOC_TUNING", raising=False)
    monkeypatch.setenv(name, value)
    monkeypatch.setattr(allocator, "_glibc_mallopt", _libc_must_not_be_touched)
    assert allocator.keep_freed_memory() is False


def _runs_on_glibc() -> bool:
    try:
        return bool(os.confstr("CS_GNU_LIBC_VERSION"))
    except (ValueError, OSError):
        return False


@pytest.mark.skipif(not _runs_on_glibc(), reason="only glibc has these malloc settings")
def test_mallopt_is_found_on_glibc():
    assert allocator._glibc_mallopt() is not None
