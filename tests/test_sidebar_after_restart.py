"""After the embedded cluster is stopped and started again on the same home, the sidebar tells the truth.

A fresh home and its own 2-CPU embedded cluster: one run finishes, one is still going when
``nbtrain cluster stop`` ends the cluster. A new cluster starts on the same home (a new port). The
lab server's run list (the registry's records, overlaid with what the agent's ``nbtrain runs --json``
answers for the cluster the home last connected to) shows the finished run as it ended, the lost one
as failed and "lost with its cluster", neither with a Stop button (``terminal``), and counts none of
them as running.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from nbtrain._lab.run_list import ClusterAnswers, served_runs
from nbtrain._registry import read_cluster, read_runs

SCRIPT = """
import json, time
import nbtrain
from nbtrain._client.local import local_cluster

def done(config):
    nbtrain.report(loss=1.0)

def going(config):
    import time
    while True:
        nbtrain.report(loss=1.0)
        time.sleep(0.1)

first = nbtrain.connect(num_cpus=2, progress=lambda message: None)
nbtrain.launch(done, workers=1, name="finished-before").wait(timeout=120)
lost = nbtrain.launch(going, workers=1, name="going-when-stopped")
while not lost.metrics:
    lost.refresh(wait_s=1.0)
nbtrain.disconnect()
local_cluster.stop()
second = nbtrain.connect(num_cpus=2, progress=lambda message: None)
print(json.dumps({"first": first.address, "second": second.address}))
nbtrain.disconnect()
"""


def test_runs_of_the_earlier_cluster_show_how_they_ended(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, "NBTRAIN_HOME": str(home)}
    try:
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPT)], env=env, capture_output=True,
                              text=True, timeout=300, stdin=subprocess.DEVNULL, check=False)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        addresses = json.loads(done.stdout.strip().splitlines()[-1])
        assert addresses["first"] != addresses["second"]
        answer = subprocess.run([sys.executable, "-m", "nbtrain", "runs", "--json", "--address", addresses["second"]],
                                env=env, capture_output=True, text=True, timeout=120, check=False)
        assert answer.returncode == 0, answer.stderr[-3000:]
    finally:
        subprocess.run([sys.executable, "-m", "nbtrain", "cluster", "stop"], env=env, capture_output=True, timeout=120,
                       check=False)

    answers = ClusterAnswers()
    answers.store(addresses["second"], answer.stdout, received=time.time())
    current = read_cluster(home)
    assert current is not None and current["address"] == addresses["second"]
    records = read_runs(home)
    assert {record["address"] for record in records} == {addresses["first"]}  # what the sidebar had to go by
    served = {run["name"]: run for run in served_runs(records, answers, time.time(), stale_after=60,
                                                      current=current["address"])}

    finished, lost = served["finished-before"], served["going-when-stopped"]
    assert (finished["state"], finished["terminal"]) == ("succeeded", True)
    assert (lost["state"], lost["terminal"]) == ("failed", True)
    assert "lost with its cluster" in lost["error"]
    assert [run for run in served.values() if not run["terminal"] and not run["stale"]] == []  # none running
    # without the current cluster's word, the records alone would say "pending" and live
    assert {run["state"] for run in served_runs(records, ClusterAnswers(), time.time(), 60)} == {"pending"}
