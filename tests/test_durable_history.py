"""The run's history survives its supervisor's death and a full disk (real loopback cluster).

The supervisor is killed by PID (SIGKILL: no chance to flush or close), twice,
while a notebook follows the run with ``run.refresh()``; the disk is made
"full" through the named fault-injection setting ``NBTRAIN_FAULT_DISK_FULL``
(conftest points it at a flag file in the test home before the cluster starts).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil

import nbtrain
from nbtrain._cluster.storage.history_log import FAULT_DISK_FULL_ENV, HistoryLog
from nbtrain._paths import storage_root

from _helpers import wait_for
from _train_fns import train_steps


def _supervisor_pid(run_dir: Path) -> int | None:
    """The PID of the ``ray::RunSupervisor`` process holding ``run_dir``'s history files open."""
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if "RunSupervisor" not in " ".join(proc.info["cmdline"] or []):
                continue
            if any(f.path.startswith(str(run_dir) + os.sep) for f in proc.open_files()):
                return int(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


def _keys(rows):
    return [(r["attempt"], r["rank"], r["step"]) for r in rows]


def test_supervisor_killed_mid_run_twice_loses_and_repeats_no_row(cluster):
    name = "history-kill-twice"
    run_dir = storage_root() / name
    run = nbtrain.launch(train_steps, workers=2, name=name,
                         config={"steps": 200, "sleep": 0.05, "checkpoint_every": 25})
    seen: list[dict] = []

    def follow(predicate):
        def step():  # every row the Run fetched, by index (run.state fetches too)
            run.refresh(wait_s=0.5)
            seen.extend(run.reader.rows_since(len(seen)))
            return predicate()
        return step

    killed: list[int] = []
    for attempt in (1, 2):
        wait_for(follow(lambda a=attempt: sum(r["attempt"] == a for r in seen) > 60), 240,
                 message=f"rows of attempt {attempt}")
        pid = wait_for(lambda: _supervisor_pid(run_dir), 30, message="the supervisor's process")
        assert pid not in killed
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)
    wait_for(follow(lambda: run.state.is_terminal), 300, message="the run to end")
    run.refresh()
    seen.extend(run.reader.rows_since(len(seen)))
    assert run.state == nbtrain.RunState.SUCCEEDED, run.error
    assert run.attempt == 3
    assert len(set(_keys(seen))) == len(seen), "the notebook saw a row twice"
    stored = HistoryLog(run_dir, "metrics", read_only=True).read(0)
    assert seen == stored, "the notebook's rows are not the stored history, in order"
    last = [r for r in seen if r["attempt"] == 3]
    assert {(r["rank"], r["step"]) for r in last} >= {(rank, 199) for rank in (0, 1)}
    restarts = [e for e in run.events if "supervisor process was restarted" in e["message"]]
    assert len(restarts) == 2


def test_a_full_disk_is_told_training_goes_on_and_every_row_is_kept(cluster):
    flag = Path(os.environ[FAULT_DISK_FULL_ENV])
    name = "history-disk-full"
    run_dir = storage_root() / name
    run = nbtrain.launch(train_steps, workers=2, name=name, config={"steps": 150, "sleep": 0.04})
    try:
        wait_for(lambda: len(run.metrics) > 20, 180, message="the run to report")
        flag.touch()
        full = wait_for(lambda: [e for e in run.events if e["kind"] == "storage"], 30,
                        message="the storage-full event")
        assert full[0]["message"] == (f"history storage is full at {run_dir}: "
                                      f"rows are kept in memory until space is freed")
        on_disk = len(HistoryLog(run_dir, "metrics", read_only=True))
        during = len(run.metrics)
        wait_for(lambda: len(run.metrics) > during + 40, 60, message="training to go on while the disk is full")
        assert len(HistoryLog(run_dir, "metrics", read_only=True)) == on_disk, "rows were written while full"
    finally:
        flag.unlink(missing_ok=True)
    wait_for(lambda: any("written again" in e["message"] for e in run.events), 30, message="the written-again event")
    assert run.wait(timeout=180) == nbtrain.RunState.SUCCEEDED
    assert len([e for e in run.events if e["kind"] == "storage"]) == 2, "the user was told more than once"
    rows = run.metrics
    assert {(r["rank"], r["step"]) for r in rows} == {(rank, step) for rank in (0, 1) for step in range(150)}
    assert HistoryLog(run_dir, "metrics", read_only=True).read(0) == rows
