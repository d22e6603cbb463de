"""The run's history on disk: crash-safe appends, exact cursors, random access, a full disk.

No cluster: a real subprocess appends and is killed with SIGKILL, and the feed
is driven in-process the way the supervisor drives it.
"""

from __future__ import annotations

import io
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import nbtrain
from nbtrain._cluster.storage.history_log import FAULT_DISK_FULL_ENV, HistoryLog
from nbtrain._cluster.storage.run_storage import RunStorage
from nbtrain._cluster.supervisor.feed import ROW_TAIL, RunFeed

from _helpers import wait_for

pytestmark = pytest.mark.quick

SEGMENT = 1_000

WRITER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from nbtrain._cluster.storage.history_log import HistoryLog

    log = HistoryLog(Path(sys.argv[1]), "metrics", segment_rows=int(sys.argv[2]))
    i = len(log)
    print(i, flush=True)
    while True:  # batches of 50 wide rows: a kill lands mid-write often
        log.append([{"i": i + k, "pad": "x" * 300} for k in range(50)])
        i += 50
""")


def _indices(log: HistoryLog) -> list[int]:
    return [row["i"] for row in log.read(0)]


def _kill_writer_mid_append(directory: Path, script: Path, min_rows: int) -> int:
    """Start a writer, SIGKILL it once it wrote ``min_rows``; returns the count it started from."""
    source = str(Path(nbtrain.__file__).parents[1])  # the checkout under test
    proc = subprocess.Popen([sys.executable, str(script), str(directory), str(SEGMENT)], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": source})
    assert proc.stdout is not None
    started = int(proc.stdout.readline())
    deadline = time.monotonic() + 60
    while sum(p.stat().st_size for p in (directory / "metrics").glob("*.jsonl")) < (started + min_rows) * 300:
        assert time.monotonic() < deadline, "the writer wrote nothing"
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    return started


def test_appends_killed_mid_write_twice_lose_and_repeat_nothing(tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    first = _kill_writer_mid_append(tmp_path, script, 2_500)
    assert first == 0
    second = _kill_writer_mid_append(tmp_path, script, 2_500)
    log = HistoryLog(tmp_path, "metrics", segment_rows=SEGMENT)
    after_two = len(log)
    assert second > 2_000 and after_two > second + 2_000
    log.append([{"i": after_two + k, "pad": ""} for k in range(10)])
    assert _indices(log) == list(range(after_two + 10)), "a row was lost or repeated across the kills"
    segments = sorted(p.name for p in (tmp_path / "metrics").glob("*.jsonl"))
    assert segments[:3] == ["000000000000.jsonl", "000000001000.jsonl", "000000002000.jsonl"]
    log.close()


def test_a_torn_tail_is_cut_and_later_rows_follow_whole_lines(tmp_path):
    log = HistoryLog(tmp_path, "metrics", segment_rows=SEGMENT)
    log.append([{"i": i} for i in range(1_500)])
    log.close()
    last = tmp_path / "metrics" / "000000001000.jsonl"
    whole = last.stat().st_size
    with open(last, "ab") as handle:  # a write cut short by a crash, then zeros a machine crash can leave
        handle.write(b'{"i": 1500, "lo')
    assert len(HistoryLog(tmp_path, "metrics", read_only=True)) == 1_500
    assert last.stat().st_size > whole, "opening read-only changed the file"
    with open(last, "ab") as handle:
        handle.write(b"\n\0\0\0\n")
    log = HistoryLog(tmp_path, "metrics", segment_rows=SEGMENT)
    assert len(log) == 1_500 and last.stat().st_size == whole
    log.append([{"i": 1_500 + k} for k in range(600)])
    assert _indices(log) == list(range(2_100))
    assert _indices(HistoryLog(tmp_path, "metrics", read_only=True)) == list(range(2_100))


def test_rows_are_read_by_index_across_segment_boundaries(tmp_path):
    log = HistoryLog(tmp_path, "metrics", segment_rows=SEGMENT)
    for start in range(0, 10_000, 333):  # batches that straddle the boundaries
        log.append([{"i": i, "v": i * 0.5} for i in range(start, min(start + 333, 10_000))])
    assert sorted(p.name for p in (tmp_path / "metrics").glob("*.jsonl"))[-1] == "000000009000.jsonl"
    for start, stop in [(0, 1), (999, 1_001), (1_000, 2_000), (4_321, 7_654), (9_990, 20_000), (10_000, 10_001)]:
        assert _indices_between(log, start, stop) == list(range(start, min(stop, 10_000)))
    reopened = HistoryLog(tmp_path, "metrics", read_only=True)
    assert len(reopened) == 10_000
    assert _indices_between(reopened, 5_999, 6_001) == [5_999, 6_000]


def _indices_between(log: HistoryLog, start: int, stop: int) -> list[int]:
    return [row["i"] for row in log.read(start, stop)]


def test_a_run_recorded_in_one_file_per_kind_is_still_read(tmp_path):
    old = tmp_path / "metrics.jsonl"
    old.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(5)) + '{"i": 5, "tor')
    assert _indices(HistoryLog(tmp_path, "metrics", read_only=True)) == list(range(5))
    assert old.exists(), "a read-only open converted the file"
    log = HistoryLog(tmp_path, "metrics")
    log.append([{"i": 5}])
    assert _indices(log) == list(range(6)) and not old.exists()


def _feed(directory: Path) -> tuple[RunStorage, RunFeed]:
    storage = RunStorage(directory, "run")
    return storage, RunFeed(storage, threading.RLock())


def _row(step: int, **values: object) -> dict[str, object]:
    return {"rank": 0, "step": step, "attempt": 1, "time": float(step), "loss": 1.0 / (step + 1), **values}


def _read(feed: RunFeed, cursor: int = 0, max_rows: int = 10**9) -> dict[str, object]:
    with feed.lock:
        return feed.read((cursor, 0, 0), max_rows, 0.0, lambda: False, list, 1.0)


def test_the_feed_holds_a_tail_and_reads_older_rows_from_disk(tmp_path):
    storage, feed = _feed(tmp_path)
    total = ROW_TAIL * 2 + 123
    for seq, start in enumerate(range(0, total, 250), start=1):
        assert feed.accept(0, 1, seq, [_row(s) for s in range(start, min(start + 250, total))], []) == []
    assert feed.accept(0, 1, 3, [_row(0)], []) is None, "a resent push was taken twice"
    assert feed.row_count == total
    answer = _read(feed, 10, 50)
    assert [r["step"] for r in answer["rows"]] == list(range(10, 60)) and answer["cursor"] == 60
    assert answer["has_more"]
    assert [r["step"] for r in _read(feed)["rows"]] == list(range(total))
    storage.close()

    stored = RunFeed(RunStorage.open_existing(tmp_path / "run"), threading.RLock())
    stored.replay()
    assert stored.row_count == total and stored.latest_by_rank[0]["loss"] == 1.0 / total
    assert [r["step"] for r in _read(stored, total - 5)["rows"]] == list(range(total - 5, total))


def test_metric_rows_come_as_an_arrow_frame_with_nan_and_text(tmp_path):
    import pyarrow as pa

    storage, feed = _feed(tmp_path)
    feed.accept(0, 1, 1, [_row(0, note="warmup"), _row(1, loss=math.nan), _row(2, loss=math.inf)], [])
    feed.accept(0, 1, 2, [_row(3, extra=7)], [])
    table = pa.ipc.open_stream(io.BytesIO(feed.frame_ipc(1, None))).read_all()
    assert table.column_names[:4] == ["rank", "step", "attempt", "time"]
    assert table.column("step").to_pylist() == [1, 2, 3]
    loss = table.column("loss").to_pylist()
    assert math.isnan(loss[0]) and loss[1] == math.inf and loss[2] == 0.25
    assert "note" not in table.column_names  # only the rows asked for are read
    assert table.column("extra").to_pylist() == [None, None, 7]
    assert pa.ipc.open_stream(io.BytesIO(feed.frame_ipc(0, 1))).read_all().column("note").to_pylist() == ["warmup"]
    storage.close()


def test_a_full_disk_keeps_rows_in_memory_tells_the_user_once_and_writes_them_later(tmp_path, monkeypatch):
    flag = tmp_path / "disk-full"
    monkeypatch.setenv(FAULT_DISK_FULL_ENV, str(flag))
    storage, feed = _feed(tmp_path)
    woken = []

    def long_poll(cursor: tuple[int, int, int]) -> None:
        with feed.lock:
            woken.append(feed.read(cursor, 100, 5.0, lambda: False, list, 1.0))

    feed.accept(0, 1, 1, [_row(0)], [])
    flag.touch()
    poller = threading.Thread(target=long_poll, args=((feed.row_count, 0, feed.event_count),))
    poller.start()
    wait_for(lambda: _waiting(poller), 10, message="the poller to wait for rows")
    for seq in range(2, 6):
        feed.accept(0, 1, seq, [_row(seq - 1)], [("stdout", 1.0, "text\n")])
    poller.join(timeout=5)
    assert woken and woken[0]["rows"], "a poller was not woken by rows kept in memory"
    assert [r["step"] for r in _read(feed)["rows"]] == [0, 1, 2, 3, 4]
    full = [e for e in feed.events if e["kind"] == "storage"]
    assert [e["message"] for e in full] == [
        f"history storage is full at {storage.dir}: rows are kept in memory until space is freed"]
    assert storage.failure() is not None and not storage.sync()

    flag.unlink()
    feed.accept(0, 1, 6, [_row(5)], [])
    assert storage.sync() and storage.failure() is None
    assert "written again" in feed.events[-1]["message"]
    storage.close()
    on_disk = RunFeed(RunStorage.open_existing(storage.dir), threading.RLock())
    on_disk.replay()
    assert [r["step"] for r in _read(on_disk)["rows"]] == list(range(6))
    assert [e["message"] for e in on_disk.events] == [e["message"] for e in feed.events]
    assert on_disk.log_count == 4


def test_other_write_errors_are_named(tmp_path, monkeypatch):
    storage, feed = _feed(tmp_path)
    log = storage.history("metrics")

    def failing_write(fd: int, data: bytes) -> int:
        raise OSError(5, "Input/output error")

    with monkeypatch.context() as patched:
        patched.setattr(os, "write", failing_write)
        feed.accept(0, 1, 1, [_row(0)], [])
    assert log.pending == 1
    assert "cannot be written (Input/output error)" in feed.events[-1]["message"]
    feed.accept(0, 1, 2, [_row(1)], [])
    assert log.pending == 0 and [r["step"] for r in log.read(0)] == [0, 1]


def _waiting(thread: threading.Thread) -> bool:
    """Whether ``thread`` is blocked in a ``Condition.wait`` (the long poll waiting for rows)."""
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        if frame.f_code.co_name == "wait" and frame.f_code.co_filename == threading.__file__:
            return True
        frame = frame.f_back
    return False
