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


@linux_only
def test_ranks_reuse_freed_tensor_memory(reference_run):
    """The reference run's ranks count their page faults per step of a small CNN (``tests/_reference_run.py``)."""
    assert [w["malloc_tuned"] for w in reference_run.workers] == [True, True]
    for rank, measured in enumerate(reference_run.result):
        faults = measured["page_faults_per_step"]
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
