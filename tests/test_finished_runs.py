"""A finished run holds no process, and reads as it did while it ran.

Once a run ends its supervisor writes what readers need and exits; everything a
user reads afterwards (``attach``, ``runs()``, state, metrics, workers as last
seen, logs, result, error, checkpoint, config, ``nbtrain runs --json``) comes from
the run's files through a short-lived task on the head node. A ``Run`` that was
following the run carries on across the exit with the same cursors; ``resume``
and ``delete`` work on a finished run as before.
"""

from __future__ import annotations

import psutil
import pytest

import nbtrain
from nbtrain._client.connecting import connection
from nbtrain._client.entry.cli import cluster_answer
from nbtrain._client.local import local_cluster
from nbtrain._client.run.stored import StoredRunHandle
from nbtrain._cluster.names import find_supervisor
from nbtrain._paths import run_index_dir, storage_root

import _reference_run
from _helpers import wait_for
from _train_fns import train_steps


def supervisor_processes() -> list[str]:
    """Command lines of the session cluster's RunSupervisor processes (not those of the other lane's clusters)."""
    info = local_cluster.status()
    assert info is not None, "the session cluster is not running"
    found = []
    for process in psutil.Process(info.pid).children(recursive=True):
        try:
            line = " ".join(process.cmdline())
        except psutil.Error:  # ended meanwhile
            continue
        if line.startswith("ray::RunSupervisor"):
            found.append(line)
    return found


def train_and_talk(config):
    """train_steps, and a line in each rank's log."""
    print(f"rank {nbtrain.get_context().rank} says hello")
    return train_steps(config)


def test_finished_runs_hold_no_process_and_read_as_before(cluster):
    ok = nbtrain.launch(train_and_talk, name="done-ok", workers=2,
                        config={"steps": 6, "checkpoint_every": 2, "sleep": 0.01})
    failed = nbtrain.launch(train_steps, name="done-failed", workers=1,
                            config={"steps": 6, "fail_rank": 0, "fail_step": 2, "sleep": 0.01})
    stopped = nbtrain.launch(train_steps, name="done-stopped", workers=1, config={"steps": 10**6, "sleep": 0.02})
    assert ok.wait(timeout=120) == nbtrain.RunState.SUCCEEDED
    assert failed.wait(timeout=120, raise_on_failure=False) == nbtrain.RunState.FAILED
    wait_for(lambda: stopped.metrics, 60, message="the stopped run's first row")
    assert stopped.stop() == nbtrain.RunState.STOPPED
    wait_for(lambda: not supervisor_processes(), 30, message="every finished run's supervisor to exit",
             describe=supervisor_processes)
    for name in ("done-ok", "done-failed", "done-stopped"):
        assert find_supervisor(name) is None

    # the Run that followed the run live carries on from the files, with the same cursors
    live_rows = ok.metrics
    assert sorted((row["rank"], row["step"]) for row in live_rows) == [(r, s) for r in (0, 1) for s in range(6)]
    assert isinstance(ok.reader.channel.handle, StoredRunHandle)

    again = nbtrain.attach("done-ok")
    assert again.state == nbtrain.RunState.SUCCEEDED
    assert again.metrics == live_rows
    assert again.result == [0, 1]
    assert again.config == {"steps": 6, "checkpoint_every": 2, "sleep": 0.01}
    assert "rank 1 says hello" in again.logs(rank=1) and "[rank 0] rank 0 says hello" in again.logs()
    workers = again.workers
    assert [w["rank"] for w in workers] == [0, 1] and all(w["pid"] and w["node"] == "127.0.0.1" for w in workers)
    assert [w["state"] for w in workers] == ["finished", "finished"]
    assert workers[1]["latest"]["loss"] == pytest.approx(1 / 6)
    assert again.load_checkpoint()["step"] == 4
    assert again.summary()["latest"]["loss"] == pytest.approx(1 / 6)

    gone = nbtrain.attach("done-failed")
    assert gone.state == nbtrain.RunState.FAILED
    assert "rank 0" in gone.error.lower() and "boom at step 2" in gone.error
    with pytest.raises(nbtrain.RunFailedError, match="boom at step 2"):
        gone.wait(timeout=10)
    assert nbtrain.attach("done-stopped").state == nbtrain.RunState.STOPPED

    listed = {run["name"]: run["state"] for run in nbtrain.runs() if run["name"] != _reference_run.NAME}
    assert listed == {"done-ok": "succeeded", "done-failed": "failed", "done-stopped": "stopped"}
    answered = {run["name"]: run["state"] for run in cluster_answer(connection.current())["runs"]
                if run["name"] != _reference_run.NAME}
    assert answered == listed  # what the lab sidebar shows (`nbtrain runs --json`)

    # a finished run keeps its name: launching it again starts done-ok-2, and done-ok stays as it was
    numbered = nbtrain.launch(train_steps, name="done-ok", workers=1, config={"steps": 1}, wait=True)
    assert numbered.name == "done-ok-2" and nbtrain.attach("done-ok").metrics == live_rows
    numbered.delete()

    # resume brings a supervisor back on the files; it continues from the checkpoint and exits again
    resumed = nbtrain.launch(train_and_talk, name="done-ok", workers=2, resume=True, wait=True,
                             config={"steps": 8, "checkpoint_every": 2, "sleep": 0.01})
    assert resumed.attempt == 2
    second = sorted((row["rank"], row["step"]) for row in resumed.metrics if row["attempt"] == 2)
    assert second == [(r, s) for r in (0, 1) for s in (5, 6, 7)]
    assert len(resumed.metrics) == len(live_rows) + 6
    wait_for(lambda: not supervisor_processes(), 30, message="the resumed run's supervisor to exit")

    # delete removes the files and the name; a new launch of it starts from step 0
    nbtrain.attach("done-ok").delete()
    assert not (storage_root() / "done-ok").exists() and not (run_index_dir() / "done-ok.json").exists()
    assert "done-ok" not in [run["name"] for run in nbtrain.runs()]
    with pytest.raises(nbtrain.RunNotFoundError, match="No run named 'done-ok'"):
        nbtrain.attach("done-ok")
    fresh = nbtrain.launch(train_steps, name="done-ok", workers=1, config={"steps": 2, "sleep": 0.01}, wait=True)
    assert [row["step"] for row in fresh.metrics] == [0, 1] and fresh.attempt == 1
