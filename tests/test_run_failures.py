"""A rank that raises or dies fails the run fast, names the rank, and leaves nothing running."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest

import nbtrain

from _helpers import run_actor_names, wait_for
from _train_fns import train_steps


def test_rank_raising_at_step_20_fails_the_run_within_10_s(cluster):
    run = nbtrain.launch(train_steps, config={"steps": 1000, "sleep": 0.05, "fail_rank": 1, "fail_step": 20},
                         workers=2, name="rank1-raises")
    wait_for(lambda: any(r["step"] >= 20 and r["rank"] == 1 for r in run.refresh() + run.metrics), 120,
             message="rank 1 to reach step 20")
    began = time.monotonic()
    with pytest.raises(nbtrain.RunFailedError) as raised:
        run.wait(timeout=30)
    detected = time.monotonic() - began
    assert detected < 10, f"failure took {detected:.1f} s to surface"
    message = str(raised.value)
    assert "Rank 1 raised ValueError at step 20: boom at step 20" in message
    assert "Traceback (most recent call last)" in message
    assert 'raise ValueError(f"boom at step {step}")' in message
    # a function pickled here (the tests' functions travel by value) keeps its origin on the rank
    assert f'File "{sys.modules["_train_fns"].__file__}"' in message and "<dynamic-code>" not in message
    assert "The other 1 worker" in message
    assert run.state == nbtrain.RunState.FAILED
    wait_for(lambda: not run_actor_names("rank1-raises", run), 10, message="the run's workers to be gone")
    # the rank that raised returned its error: its process, torch imported, is the next run's, warm
    raised_pid = next(worker["pid"] for worker in run.workers if worker["rank"] == 1)
    again = nbtrain.launch(train_steps, config={"steps": 2}, workers=2, name="after-the-fix")
    assert again.wait(timeout=120) == nbtrain.RunState.SUCCEEDED, again.error
    assert raised_pid in [worker["pid"] for worker in again.workers]


def test_killed_worker_process_is_reported_as_died(cluster):
    run = nbtrain.launch(train_steps, config={"steps": 1000, "sleep": 0.05}, workers=2, name="killed")
    wait_for(lambda: len(run.metrics) > 10, 120, message="rows")
    pid = next(w["pid"] for w in run.workers if w["rank"] == 1)
    os.kill(pid, signal.SIGKILL)
    began = time.monotonic()
    state = run.wait(timeout=30, raise_on_failure=False)
    assert state == nbtrain.RunState.FAILED
    assert time.monotonic() - began < 10
    assert f"Rank 1's worker process died (pid {pid}" in run.error
    wait_for(lambda: not run_actor_names("killed", run), 10, message="the run's workers to be gone")


def test_unpicklable_closure_is_named_before_any_worker_starts(cluster):
    lock = threading.Lock()

    def train(config):
        with lock:
            nbtrain.report(x=1)

    began = time.monotonic()
    with pytest.raises(nbtrain.NotSerializableError, match=r"`lock` \(a threading.Lock\) cannot be sent"):
        nbtrain.launch(train, workers=2, name="unpicklable")
    assert time.monotonic() - began < 5
    assert not run_actor_names("unpicklable")
    with pytest.raises(nbtrain.RunNotFoundError):
        nbtrain.attach("unpicklable")


def test_too_many_workers_is_refused_at_once_listing_what_exists(cluster):
    began = time.monotonic()
    with pytest.raises(nbtrain.ResourcesUnavailableError) as raised:
        nbtrain.launch(train_steps, workers=64, name="too-big")
    assert time.monotonic() - began < 5
    message = str(raised.value)
    assert "64 workers" in message and "4 CPU and 0 GPU in all" in message and "at most 4 workers" in message
    with pytest.raises(nbtrain.ResourcesUnavailableError, match="this cluster has no GPUs"):
        nbtrain.launch(train_steps, workers=2, gpus_per_worker=1, name="no-gpus")


def test_wrong_signature_is_refused(cluster):
    def train(a, b):
        return a + b

    with pytest.raises(nbtrain.NbtrainError, match=r"must take one argument \(the config dict\) or none"):
        nbtrain.launch(train, workers=1)
