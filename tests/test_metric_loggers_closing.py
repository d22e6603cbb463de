"""The metric loggers close while rows still arrive: every row is written or counted as dropped, and said.

No cluster: these drive :class:`MetricLoggers` directly, with a real TensorBoard writer read back by
TensorBoard's own reader, or with a writer that blocks, swapped in for TensorBoard's.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from nbtrain._cluster.supervisor import metric_loggers
from nbtrain._cluster.supervisor.metric_loggers import MetricLoggers

pytestmark = pytest.mark.quick

RANKS = 4
BATCH = 5


def _rows(rank: int, first_step: int, count: int) -> list[dict[str, Any]]:
    return [{"rank": rank, "step": step, "attempt": 1, "time": 1000.0 + step, "loss": float(step)}
            for step in range(first_step, first_step + count)]


def _loggers(tmp_path: Path, said: list[str]) -> MetricLoggers:
    return MetricLoggers("tensorboard", "closing", tmp_path, tmp_path, {}, {}, on_error=said.append)


def _steps_on_disk(directory: Path) -> list[int]:
    if not directory.exists():
        return []
    events = EventAccumulator(str(directory), size_guidance={"scalars": 0})  # 0: keep every event
    events.Reload()
    return [event.step for event in events.Scalars("loss")] if "loss" in events.Tags()["scalars"] else []


def test_rows_pushed_while_the_loggers_close_are_written_or_counted(tmp_path):
    said: list[str] = []
    loggers = _loggers(tmp_path, said)
    pushed = [0] * RANKS
    some_pushed, closed = threading.Event(), threading.Event()

    def push(rank: int) -> None:
        while not closed.is_set():  # before close, while it waits for the writer, and maybe after it
            loggers.write(_rows(rank, pushed[rank], BATCH))
            pushed[rank] += BATCH
            if pushed[rank] >= 100:
                some_pushed.set()
            time.sleep(0)  # let the closing thread in while the pushes go on
        loggers.write(_rows(rank, pushed[rank], BATCH))  # after close returned: dropped, and said once
        pushed[rank] += BATCH

    threads = [threading.Thread(target=push, args=(rank,)) for rank in range(RANKS)]
    for thread in threads:
        thread.start()
    assert some_pushed.wait(timeout=30)
    loggers.close("succeeded")
    closed.set()
    for thread in threads:
        thread.join(timeout=30)

    on_disk = {rank: _steps_on_disk(tmp_path / "tensorboard" / "closing" / f"rank-{rank}") for rank in range(RANKS)}
    for rank, steps in on_disk.items():  # each rank's rows in order: the first ones written, the rest dropped
        assert steps == list(range(len(steps))), f"rank {rank}"
    assert sum(map(len, on_disk.values())) == loggers.written
    assert loggers.written + loggers.dropped == sum(pushed)
    assert loggers.dropped >= RANKS * BATCH
    assert any("arrived after the loggers began closing" in message for message in said), said
    assert sum("arrived after the loggers closed" in message for message in said) == 1, said
    assert all(message.startswith("tensorboard: ") for message in said), said


class _BlockingWriter:
    """Stands in for the TensorBoard writer: each write blocks until ``release`` is set."""

    made: ClassVar[list[_BlockingWriter]] = []

    def __init__(self, directory: Path, run_name: str) -> None:
        self.where = str(directory)
        self.entered, self.release, self.ended = threading.Event(), threading.Event(), threading.Event()
        self.rows: list[dict[str, Any]] = []
        self.writing = False
        self.closed_while_writing = False
        self.closed_with: str | None = None
        self.made.append(self)

    def write(self, rows: list[dict[str, Any]]) -> None:
        self.writing = True
        self.entered.set()
        self.release.wait(timeout=30)
        self.rows.extend(rows)
        self.writing = False

    def close(self, state: str) -> None:
        self.closed_while_writing = self.writing
        self.closed_with = state
        self.ended.set()


@pytest.fixture
def blocking_writer(monkeypatch):
    _BlockingWriter.made.clear()
    monkeypatch.setattr(metric_loggers, "_TensorBoard", _BlockingWriter)
    monkeypatch.setattr(metric_loggers, "CLOSE_WAIT_S", 0.3)
    monkeypatch.setattr(metric_loggers, "WRITE_INTERVAL_S", 0.05)


def test_a_busy_writer_is_not_closed_under_it_and_the_rows_it_misses_are_said(tmp_path, blocking_writer):
    said: list[str] = []
    loggers = _loggers(tmp_path, said)
    [writer] = _BlockingWriter.made
    loggers.write(_rows(0, 0, 10))
    assert writer.entered.wait(timeout=10)
    loggers.write(_rows(0, 10, 7))  # queued behind the batch the writer is stuck on

    loggers.close("failed")  # returns after CLOSE_WAIT_S, the writer still busy
    assert not writer.ended.is_set()
    [message] = said
    assert "7 rows were not written" in message and "after 0.3 s" in message, message
    assert "the 10 rows they hold" in message, message

    writer.release.set()
    assert writer.ended.wait(timeout=10)  # the writers' thread closes the writer once its batch is done
    assert not writer.closed_while_writing
    assert writer.closed_with == "failed"
    assert [row["step"] for row in writer.rows] == list(range(10))
    assert (loggers.written, loggers.dropped) == (10, 7)


def test_a_close_that_writes_everything_says_nothing(tmp_path, blocking_writer, monkeypatch):
    monkeypatch.setattr(metric_loggers, "CLOSE_WAIT_S", 10.0)  # a writer thread scheduled late still finishes
    said: list[str] = []
    loggers = _loggers(tmp_path, said)
    [writer] = _BlockingWriter.made
    writer.release.set()
    loggers.write(_rows(0, 0, 10))
    loggers.close("succeeded")
    loggers.close("succeeded")  # a second close does nothing
    assert writer.ended.is_set() and writer.closed_with == "succeeded"
    assert (loggers.written, loggers.dropped, said) == (10, 0, [])
