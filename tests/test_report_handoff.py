"""Rows and log lines go from the training thread to the flusher thread without a window in which
one is lost or sent twice, and a reported value is the value at the call.

A stress test of that handoff alone, in this process: one rank's ``TrainingSession`` (nbtrain's real
one, not started: no cluster, no supervisor) takes 10^6 ``report()`` calls and as many printed
lines from one thread while another collects what is waiting every millisecond, as the flusher
does (its shortest tick in a run is 10 ms). Thread switches are made as frequent as Python allows,
so a swap-and-append race would show. Sending the collected rows to the supervisor is covered by
the cluster tests (``test_durable_history``, ``test_metrics_streaming``).
"""

from __future__ import annotations

import queue
import sys
import threading

import pytest
import torch

from nbtrain._cluster.rank.payload import local_payload
from nbtrain._cluster.rank.session import TrainingSession

ROWS = 1_000_000


def _session() -> TrainingSession:
    return TrainingSession(local_payload("handoff", flush_interval_s=0.001), torch.device("cpu"))


# Not in the quick tier: 6 s of the 2 cores on a million rows (the whole suite runs it).
def test_a_million_rows_collected_every_millisecond_arrive_once_each() -> None:
    session = _session()
    done = threading.Event()

    def train() -> None:
        for step in range(ROWS):
            session.report({"step": step, "loss": 1.0})
            session.logs.append(("stdout", 0.0, f"{step}\n"))
        done.set()

    collected = 0
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        trainer = threading.Thread(target=train)
        trainer.start()
        while not done.is_set():
            done.wait(0.001)
            session._collect()
            collected += 1
        trainer.join()
        session._collect()
    finally:
        sys.setswitchinterval(switch)
    steps = [row["step"] for row in session._waiting_rows]
    lines = [text for _stream, _when, text in session._waiting_logs]
    assert collected > 100, f"only {collected} collections: the handoff was not raced"
    assert steps == list(range(ROWS)), f"{ROWS - len(set(steps))} rows lost, {len(steps) - len(set(steps))} twice"
    assert lines == [f"{step}\n" for step in range(ROWS)]


@pytest.mark.quick
def test_a_tensor_changed_after_report_keeps_the_reported_value() -> None:
    session = _session()
    loss = torch.tensor(2.5)
    session.report({"loss": loss})
    loss.add_(100.0)  # the training loop reuses the tensor in place
    session._collect()
    assert session._waiting_rows[0]["loss"] == 2.5


@pytest.mark.quick
def test_an_attempts_first_row_is_sent_as_it_is_reported_and_later_rows_wait_for_the_tick() -> None:
    """A warm re-run's first point: the first row does not wait up to a flush tick (here one far away) to leave
    the rank; once it is sent, report() runs without the hook that woke the flusher."""
    session = TrainingSession(local_payload("first-row", flush_interval_s=10.0), torch.device("cpu"))
    sent: queue.Queue[list[int]] = queue.Queue()

    def send(_state: str) -> None:
        sent.put([row["step"] for row in session._waiting_rows])
        session._waiting_rows = []

    session._send = send  # type: ignore[method-assign]  # the push to the supervisor, recorded
    assert session.reporter.hook is not None, "before the first row, report() wakes the flusher"
    session._thread.start()
    try:
        session.report({"step": 1, "loss": 1.0})
        assert sent.get(timeout=5.0) == [1], "the first row, sent before the tick"
        assert session.reporter.hook is None, "later rows take report()'s plain path, flushed on the ticks"
    finally:
        session._stop.set()
        session._wake.set()
        session._thread.join(timeout=5.0)
