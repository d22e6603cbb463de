"""``nbtrain agent`` (what the lab sidebar's Stop goes through) against the real loopback cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from _helpers import wait_for
from _train_fns import train_steps

import nbtrain
from nbtrain._registry import read_run

pytestmark = pytest.mark.cluster


def test_one_agent_lists_and_stops_runs_over_one_connection(cluster):
    run = nbtrain.launch(train_steps, config={"steps": 100_000, "sleep": 0.05}, workers=2, name="agent-stop")
    wait_for(lambda: len(run.metrics) > 2, 180, message="the run to report")
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
        assert "agent-stop" in [r["name"] for r in json.loads(listed["output"])]

        missing, _ = ask("stop", "no-such-run", "--address", cluster.address)
        assert not missing["ok"]
        assert "no-such-run" in missing["output"]

        stopped, stop_s = ask("stop", "agent-stop", "--address", cluster.address)
        assert stopped["ok"], stopped["output"]
        assert run.state == nbtrain.RunState.STOPPED
        assert read_run("agent-stop")["state"] == "stopped"  # the sidebar sees it at once
        print(f"\n[agent] first command (connects) {connect_s:.1f} s; stop on the open connection {stop_s:.1f} s")
    finally:
        agent.stdin.close()
        assert agent.wait(timeout=60) == 0
