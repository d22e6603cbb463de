"""``nbtrain agent`` (what the lab sidebar's data and Stop go through) against the real loopback cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import nbtrain
from nbtrain._paths import nbtrain_home, ray_temp_dir

from _helpers import wait_for
from _train_fns import train_steps


def files_under(home: Path) -> dict[str, int]:
    """Every file in the nbtrain home except the embedded cluster's own (its state, Ray's temp dir, the
    runs' storage), with its modification time."""
    cluster_own = ("cluster", "storage", ray_temp_dir().relative_to(home).parts[0])
    return {str(path.relative_to(home)): path.stat().st_mtime_ns for path in home.rglob("*")
            if path.is_file() and path.relative_to(home).parts[0] not in cluster_own}


def test_one_agent_reports_and_stops_runs_over_one_connection_and_writes_nothing(cluster):
    run = nbtrain.launch(train_steps, config={"steps": 100_000, "sleep": 0.05}, workers=2, name="agent-stop",
                         total_steps=100_000)
    wait_for(lambda: len(run.metrics) > 2, 180, message="the run to report")
    before = files_under(nbtrain_home())
    agent = subprocess.Popen([sys.executable, "-m", "nbtrain", "agent"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=os.environ.copy())

    def ask(*argv: str) -> tuple[dict, float]:
        began = time.monotonic()
        agent.stdin.write(json.dumps(argv) + "\n")
        agent.stdin.flush()
        return json.loads(agent.stdout.readline()), time.monotonic() - began

    try:
        listed, connect_s = ask("runs", "--json", "--address", cluster.address)
        assert listed["ok"], listed["output"]
        answer = json.loads(listed["output"])
        assert answer["address"] == cluster.address
        assert answer["cluster"]["address"] == cluster.address
        assert answer["cluster"]["nodes"] >= 1
        assert answer["cluster"]["resources"]["CPU"][1] == cluster.resources()["CPU"][1]
        assert answer["cluster"]["resources"]["CPU"][0] >= 2  # the run's two workers hold a CPU each
        (mine,) = [r for r in answer["runs"] if r["name"] == "agent-stop"]
        assert mine["state"] == "running"
        assert mine["address"] == cluster.address
        assert mine["workers"] == 2
        assert mine["progress"]["total_steps"] == 100_000 and mine["progress"]["step"] > 0
        assert 0 < mine["latest"]["loss"] <= 1.0
        assert set(mine["latest"]) == {"loss", "sent"}

        missing, _ = ask("stop", "no-such-run", "--address", cluster.address)
        assert not missing["ok"]
        assert "no-such-run" in missing["output"]

        stopped, stop_s = ask("stop", "agent-stop", "--address", cluster.address)
        assert stopped["ok"], stopped["output"]
        again, _ = ask("runs", "--json", "--address", cluster.address)
        (mine,) = [r for r in json.loads(again["output"])["runs"] if r["name"] == "agent-stop"]
        assert mine["state"] == "stopped"
        assert mine["ended"] is not None
        print(f"\n[agent] first command (connects) {connect_s:.1f} s; stop on the open connection {stop_s:.1f} s")
    finally:
        agent.stdin.close()
        assert agent.wait(timeout=60) == 0
    after = files_under(nbtrain_home())
    written = sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))
    assert written == [], (f"the agent (runs --json, stop) wrote {written}; only launch() and a notebook's "
                           "connect() write the registry (cluster.json: connect() records every connection)")
    assert run.state == nbtrain.RunState.STOPPED
