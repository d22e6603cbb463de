"""Metrics reach the notebook while the run goes, through a cursor that loses and repeats nothing."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import nbtrain

from _helpers import wait_for, waiting_for_an_answer
from _train_fns import train_steps


def test_rows_arrive_live_and_the_cursor_neither_drops_nor_repeats(cluster):
    run = nbtrain.launch(train_steps, config={"steps": 60, "sleep": 0.05}, workers=2, name="stream")
    delivered: list[dict] = []
    counts_while_running = []
    latencies = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        new = run.refresh()  # only what arrived since the last read
        now = time.time()
        latencies += [now - row["sent"] for row in new]
        delivered += new
        summary = run.reader.summary
        if summary["state"] == "running":
            counts_while_running.append(len(delivered))
        if nbtrain.RunState(summary["state"]).is_terminal:
            break
        time.sleep(0.1)
    assert run.state == nbtrain.RunState.SUCCEEDED
    growth = sorted(set(counts_while_running))
    assert len([c for c in growth if 0 < c < 120]) >= 3, f"metrics did not arrive while running: {growth}"
    delivered += run.refresh()
    keys = [(r["attempt"], r["rank"], r["step"]) for r in delivered]
    assert len(keys) == len(set(keys)), "a row was delivered twice"
    assert sorted(keys) == sorted((1, rank, step) for rank in (0, 1) for step in range(60)), "rows were lost"
    assert run.metrics == delivered  # the Run's own history is the same stream, in the same order
    latencies.sort()
    print(f"report → notebook latency p50 {latencies[len(latencies) // 2] * 1000:.0f} ms")


def test_reading_metrics_does_not_wait_behind_a_dashboards_long_poll(cluster):
    # One row every 5 s: a long poll on this run waits up to 5 s for the next one.
    run = nbtrain.launch(train_steps, config={"steps": 2, "sleep": 5.0}, workers=1, name="reader")
    wait_for(lambda: run.refresh(wait_s=1.0), 120, interval=0, message="the first row")
    followed: list[dict] = []
    follower = threading.Thread(target=lambda: followed.extend(run.refresh(wait_s=10.0)))
    follower.start()
    # Measure only once the dashboard-style long poll has been sent and waits for its answer.
    wait_for(lambda: waiting_for_an_answer(follower, "refresh") or not follower.is_alive(), 30, interval=0.01,
             message="the follower's long poll to be sent")
    assert follower.is_alive(), f"the long poll answered before the next row was due: {followed}"
    began = time.monotonic()
    rows = run.metrics
    took = time.monotonic() - began
    print(f"run.metrics during a long poll: {took * 1000:.0f} ms")
    assert took < 3.0, f"run.metrics waited {took:.1f} s behind the long poll"
    assert [r["step"] for r in rows] == [0]
    follower.join(timeout=30)
    assert [r["step"] for r in followed] == [1]  # the long poll still delivers the next row, once
    run.stop()  # its last 5 s would prove nothing more
    assert [r["step"] for r in run.metrics] == [0, 1]  # nothing lost, nothing twice


def test_a_dashboard_draws_the_rows_a_cell_fetched_first(cluster):
    from nbtrain._views.dashboard.follower import TextProgress

    run = nbtrain.launch(train_steps, config={"steps": 30, "sleep": 0.1}, workers=2, name="shared-reader")
    view = TextProgress(run, stream=io.StringIO())
    view.follow_in_background()
    reads = 0
    while view.thread.is_alive():
        run.metrics  # noqa: B018 - a cell reading the Run while its dashboard follows it
        reads += 1
        time.sleep(0.05)
    assert run.state == nbtrain.RunState.SUCCEEDED
    assert view.history.rows_seen == len(run.metrics) == 60, f"the view drew {view.history.rows_seen} of 60 rows"
    print(f"{reads} reads of run.metrics while the view followed; the view drew all 60 rows")


def test_a_second_driver_process_attaches_and_sees_the_same_history(cluster):
    run = nbtrain.launch(train_steps, config={"steps": 40, "sleep": 0.02}, workers=2, name="attach-me")
    run.wait(timeout=120)
    expected = len(run.metrics)
    script = textwrap.dedent(f"""
        import nbtrain
        nbtrain.connect({cluster.address!r}, progress=lambda m: None)
        run = nbtrain.attach("attach-me")
        print("ROWS", len(run.metrics), run.state.value, run.result)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env={**os.environ})
    assert f"ROWS {expected} succeeded [0, 1]" in out.stdout, out.stdout + out.stderr
    assert expected == 80


def test_runs_lists_this_run_and_attach_refuses_unknown_names(cluster):
    run = nbtrain.launch(train_steps, config={"steps": 5, "sleep": 0.0}, workers=1, name="listed")
    run.wait(timeout=120)
    listed = {r["name"]: r for r in nbtrain.runs()}
    assert listed["listed"]["state"] == "succeeded"
    with pytest.raises(nbtrain.RunNotFoundError, match=r"No run named 'nope'.*listed"):
        nbtrain.attach("nope")
    again = nbtrain.launch(train_steps, config={"steps": 5, "sleep": 0.0}, workers=1, name="listed", wait=True)
    assert again.name == "listed-2" and {"listed", "listed-2"} <= {r["name"] for r in nbtrain.runs()}


def report_fast(config):
    for step in range(config["rows"]):
        nbtrain.report(step=step, loss=float(step))


def test_when_a_run_ends_every_row_it_reported_is_there_in_order(cluster):
    """A rank's last pushes may still be in flight when its function returns; the run is not
    called succeeded until they have landed, so a reader that sees the end sees every row.
    Each rank's rows arrive in the order it reported them (the dashboard relies on it)."""
    rows = 100_000  # five full pushes per rank: most are still to land when the function returns
    run = nbtrain.launch(report_fast, config={"rows": rows}, workers=2, name="every-row-at-the-end")
    assert run.wait(timeout=300) == nbtrain.RunState.SUCCEEDED
    metrics = run.metrics
    assert len(metrics) == 2 * rows
    for rank in (0, 1):
        assert [row["step"] for row in metrics if row["rank"] == rank] == list(range(rows))
