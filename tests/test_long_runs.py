"""A long run's history stays whole for the user while the notebook holds only its latest part.

The ``Run`` keeps a window of the latest rows and log chunks (what views draw
from); ``run.metrics`` and ``run.logs()`` still return everything, fetched page by
page from the cluster, and ``run.metrics_frame()`` returns it as a DataFrame.
"""

from __future__ import annotations

import math

import nbtrain
from nbtrain._client.run import handle as run_module
from nbtrain._cluster.supervisor.missing_rows import unsent_note

ROWS = 130_000  # past the Run's window (50 000 rows, trimmed at 75 000)
LINES = 16_000  # each print is two log chunks (the text, the newline): past the 20 000-chunk window


def report_many(config):
    for step in range(config["rows"]):
        nbtrain.report(step=step, loss=1.0 / (step + 1), phase="warmup" if step < 10 else "main",
                       spike=math.nan if step == 77_777 else 0.0)
    for line in range(config["lines"]):
        print(f"line {line}")


def test_a_long_run_reads_whole_though_the_notebook_keeps_its_latest_part(cluster):
    run = nbtrain.launch(report_many, name="long", workers=1, config={"rows": ROWS, "lines": LINES})
    while run.refresh(wait_s=1.0) or run.reader.summary["state"] not in ("succeeded", "failed"):
        assert len(run.reader.rows_since(run.reader.row_window_start)) <= run_module.ROW_WINDOW * 3 // 2
    run.raise_if_failed()
    assert run.reader.row_window_start > 0 and run.reader.log_window_start > 0, "the window never moved: proves nothing"
    assert len(run.reader.rows_since(0)) < ROWS

    rows = run.metrics
    assert [row["step"] for row in rows] == list(range(ROWS))
    assert rows[5]["phase"] == "warmup" and rows[-1]["phase"] == "main" and math.isnan(rows[77_777]["spike"])

    frame = run.metrics_frame()
    assert len(frame) == ROWS
    assert list(frame["step"]) == list(range(ROWS))
    assert {"rank", "step", "attempt", "time", "loss", "phase", "spike"} <= set(frame.columns)
    assert frame["loss"].iloc[-1] == 1.0 / ROWS and math.isnan(frame["spike"].iloc[77_777])
    assert frame["phase"].iloc[0] == "warmup"

    text = run.logs(rank=0)
    assert text.startswith("line 0\n") and text.endswith(f"line {LINES - 1}\n")
    assert text.count("\n") == LINES


def report_a_burst_then_end(config):
    from nbtrain._cluster.rank import session

    # this run's workers only (warm=False: none kept): small pushes, each with far more time than it
    # needs, and so many of them left at the end that sending them all outlasts one push's wait
    session.MAX_PUSH_ROWS = config["push_rows"]
    session.FINAL_PUSH_WAIT_S = config["push_wait_s"]
    for step in range(config["rows"]):
        nbtrain.report(step=step, loss=0.0)


def test_every_row_of_a_burst_at_the_end_lands_though_sending_it_outlasts_one_pushs_wait(cluster):
    # 400 000 rows reported faster than 200-row pushes carry them: about two thousand pushes are left when the
    # function returns. A final flush that gave all of them one push's wait (4 s) lost the rest. One
    # push's wait stays well above what a push takes on a loaded machine (1 s was outlasted under CI); the
    # rows are enough for the flush to outlast it on an idle machine too (200 000 took 5.7 s there)
    rows, push_wait_s = 400_000, 4.0
    run = nbtrain.launch(report_a_burst_then_end, name="burst", workers=1, warm=False,
                         config={"rows": rows, "push_rows": 200, "push_wait_s": push_wait_s})
    assert run.wait(timeout=300) == nbtrain.RunState.SUCCEEDED, run.error
    metrics = run.metrics
    whole = [row["step"] for row in metrics] == list(range(rows))
    assert whole, f"{rows - len(metrics)} of {rows} rows lost; the last that landed is step {metrics[-1]['step']}"
    final_flush_s = run.reader.summary["ended"] - metrics[-1]["time"]
    assert final_flush_s > push_wait_s, f"the last flush took {final_flush_s:.1f} s: the test proves nothing"


def test_rows_a_rank_could_not_send_as_it_ended_are_said_not_lost_silently(cluster):
    # a supervisor that takes no push within the final wait (here: no wait at all) gets the rank's
    # outcome all the same, by Ray; it says which rank's rows never came and how many
    rows = 100_000  # reported in about a second; sending them in 200-row pushes takes several
    run = nbtrain.launch(report_a_burst_then_end, name="burst-unsent", workers=1, warm=False,
                         config={"rows": rows, "push_rows": 200, "push_wait_s": 0.0})
    assert run.wait(timeout=300) == nbtrain.RunState.SUCCEEDED, run.error
    landed = len(run.metrics)
    assert landed < rows, "every row landed: the test proves nothing"
    notes = [event["message"] for event in run.events if "never reached" in event["message"]]
    assert notes == [unsent_note(0, {"rows": rows - landed, "logs": 0, "wait_s": 0.0})], run.events
