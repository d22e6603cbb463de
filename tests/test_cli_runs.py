"""``nbtrain runs`` answers from this home's files, whether its cluster is up or down.

What a user sees: the run list, each run at the last step it recorded, with no
cluster asked (no Ray is even imported) unless ``--live`` says so. A run that
was going when its cluster stopped shows as failed, "lost with its cluster", at
its last recorded step, in the files' list, in ``--live`` from a new cluster and
in the lab server's list. Speed is the benchmark's (``benchmarks/cli_runs.py``).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nbtrain._cluster.storage.run_storage import RunStorage
from nbtrain._cluster.supervisor.stored_run import record_in_index, write_final
from nbtrain._paths import storage_root
from nbtrain._registry import record_launch

from _jupyterlab import REPO

LAUNCH = """
import json, time
import nbtrain

def finished(config):
    for step in range(8):
        nbtrain.report(step=step, loss=1.0 / (step + 1))

def stuck(config):  # records steps 0..7, then hangs (a long evaluation, a deadlock)
    import time
    for step in range(8):
        nbtrain.report(step=step, loss=0.5)
    time.sleep(3600)

cluster = nbtrain.connect(num_cpus=2, progress=lambda message: None)
nbtrain.launch(finished, workers=1, name="finished-run", warm=False).wait(timeout=180)
going = nbtrain.launch(stuck, workers=1, name="stuck-run", warm=False)
deadline = time.monotonic() + 180
while 7 not in {row["step"] for row in going.metrics} and time.monotonic() < deadline:
    going.refresh(wait_s=1.0)
nbtrain.disconnect()
print(json.dumps({"address": cluster.address}))
"""

# `nbtrain runs ARGS` as the entry point runs it, saying on stderr whether Ray was imported (it never is
# without --live: nothing can have connected to a cluster, nor started one).
RUNS = """
import sys
from nbtrain._client.entry.cli import main
code = main(["runs", *sys.argv[1:]])
print("ray imported" if "ray" in sys.modules else "no ray", file=sys.stderr)
sys.exit(code)
"""


def nbtrain_runs(env: dict[str, str], *args: str) -> tuple[str, bool]:
    """What ``nbtrain runs ARGS`` printed, and whether it imported Ray."""
    done = subprocess.run([sys.executable, "-c", RUNS, *args], env=env, capture_output=True, text=True,
                          timeout=180, stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout, done.stderr.strip().splitlines()[-1] == "ray imported"


def nbtrain(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nbtrain", *args], env=env, capture_output=True, text=True,
                          timeout=240, stdin=subprocess.DEVNULL, check=False)


def rows(output: str) -> dict[str, dict[str, Any]]:
    return {run["name"]: run for run in json.loads(output)["runs"]}


@pytest.fixture
def home() -> Iterator[Path]:
    """A fresh home, short enough for Ray's socket paths; its cluster stopped at the end."""
    path = Path(tempfile.mkdtemp(prefix="nbt-"))
    yield path
    nbtrain(_env(path), "cluster", "stop")
    shutil.rmtree(path, ignore_errors=True)


def _env(home: Path) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, "NBTRAIN_HOME": str(home)}


def test_runs_lists_from_files_with_the_cluster_up_and_down_and_a_lost_run_at_its_last_step(home: Path) -> None:
    env = _env(home)
    launched = subprocess.run([sys.executable, "-c", textwrap.dedent(LAUNCH)], env=env, capture_output=True,
                              text=True, timeout=400, stdin=subprocess.DEVNULL, check=False)
    assert launched.returncode == 0, launched.stdout[-2000:] + launched.stderr[-3000:]
    address = json.loads(launched.stdout.strip().splitlines()[-1])["address"]

    # cluster up: the stuck run is running, at step 7, from its files; nothing was asked of the cluster
    output, imported_ray = nbtrain_runs(env, "--json")
    assert not imported_ray
    answer, listed = json.loads(output), rows(output)
    assert answer["source"] == "files"
    assert answer["cluster"]["address"] == address and answer["cluster"]["up"] is True
    finished, stuck = listed["finished-run"], listed["stuck-run"]
    assert (finished["state"], finished["progress"]["step"], finished["source"]) == ("succeeded", 7, "files")
    assert (stuck["state"], stuck["progress"]["step"], stuck["source"]) == ("running", 7, "files")
    assert stuck["latest"] == {"loss": 0.5} and stuck["workers"] == 1 and stuck["address"] == address

    # cluster down: the same rows, the stuck run lost with its cluster at the last step it recorded
    assert nbtrain(env, "cluster", "stop").returncode == 0
    output, imported_ray = nbtrain_runs(env, "--json")
    assert not imported_ray
    answer, listed = json.loads(output), rows(output)
    assert answer["cluster"]["up"] is False and answer["clusters"][address] == {"up": False}
    assert (listed["finished-run"]["state"], listed["finished-run"]["progress"]["step"]) == ("succeeded", 7)
    stuck = listed["stuck-run"]
    assert (stuck["state"], stuck["progress"]["step"]) == ("failed", 7)
    assert "lost with its cluster" in stuck["error"]
    text, imported_ray = nbtrain_runs(env)
    assert not imported_ray
    header, *lines = text.splitlines()
    assert f"cluster {address} (local) down" in header and "nbtrain runs --live" in header
    shown = {line.split()[0]: line for line in lines}  # newest first
    assert list(shown) == ["stuck-run", "finished-run"]
    assert shown["finished-run"].split()[1:6] == ["succeeded", "attempt", "1", "step", "7"]
    assert shown["stuck-run"].split()[1:6] == ["failed", "attempt", "1", "step", "7"]
    assert "lost with its cluster" in shown["stuck-run"]
    assert nbtrain(env, "cluster", "status").stdout.strip() == "stopped"  # listing started no cluster

    # a new cluster on the same home: the files still say lost (it started after the run last wrote),
    # and so does the cluster itself when asked (--live), at the same step
    assert nbtrain(env, "cluster", "start", "--num-cpus", "2").returncode == 0
    output, _ = nbtrain_runs(env, "--json")
    assert (rows(output)["stuck-run"]["state"], rows(output)["stuck-run"]["progress"]["step"]) == ("failed", 7)
    output, imported_ray = nbtrain_runs(env, "--live", "--json")
    assert imported_ray and json.loads(output)["source"] == "cluster"
    stuck = rows(output)["stuck-run"]
    assert (stuck["state"], stuck["progress"]["step"], stuck["source"]) == ("failed", 7, "cluster")
    assert "lost with its cluster" in stuck["error"]


# -- the files alone, no cluster at all ----------------------------------------------------------------------

def _stored(name: str, state: str, steps: int, *, final: bool = False) -> None:
    """A run as a supervisor leaves it on disk: index entry, metric history of 2 ranks, state (and summary)."""
    storage = RunStorage(storage_root(), name)
    record_in_index(name, storage.dir, "launch-1")
    storage.append("metrics", [{"rank": rank, "step": step, "attempt": 1, "time": time.time(), "loss": 1 / (step + 1)}
                               for step in range(steps) for rank in range(2)])
    storage.save_state({"launch": "launch-1", "state": state, "attempt": 1, "failures": [], "error": None,
                        "checkpoint": None, "started": time.time() - 5, "ended": time.time() if final else None})
    if final:
        write_final(storage.dir, {"name": name, "step": steps - 1, "workers": [], "latest": {"loss": 1 / steps}},
                    None, b"")
    storage.close()


@pytest.mark.quick
def test_the_lab_server_lists_runs_from_their_files_with_what_only_the_cluster_knows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nbtrain._lab.sidebar_agent import CommandRunner, NbtrainServer

    monkeypatch.setenv("NBTRAIN_HOME", str(tmp_path))
    gone = "ray://127.0.0.1:1"  # nothing listens there: the cluster these runs had is down
    with socket.socket() as listening:  # a cluster that is up (its port accepts connections)
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        up = f"ray://127.0.0.1:{listening.getsockname()[1]}"
        for name, address in (("lost-run", gone), ("done-run", gone), ("going-run", up),
                              ("elsewhere", "ray://10.255.255.1:10001")):
            record_launch(name, address, notebook="a.ipynb", workers=2, total_steps=20)
        runner = CommandRunner(NbtrainServer(), tmp_path, str(REPO), logging.getLogger("test"))
        # what the agent said of the going run a moment ago: it flags a straggler
        said = {"name": "going-run", "state": "running", "progress": {"step": 3, "total_steps": 20, "fraction": 0.15},
                "stragglers": [1], "workers": 2, "source": "cluster"}
        runner.answers.store(up, json.dumps({"address": up, "cluster": None, "runs": [said]}), received=time.time())
        _stored("lost-run", "running", 8)
        _stored("done-run", "succeeded", 12, final=True)
        _stored("going-run", "running", 5)  # written after the answer: newer
        served = {run["name"]: run for run in runner.runs()}

    lost, done, going, elsewhere = (served[name] for name in ("lost-run", "done-run", "going-run", "elsewhere"))
    assert (lost["state"], lost["terminal"], lost["progress"], lost["source"]) == (
        "failed", True, {"step": 7, "total_steps": 20, "fraction": 0.35}, "files")
    assert "lost with its cluster" in lost["error"] and lost["workers"] == 2 and lost["notebook"] == "a.ipynb"
    assert (done["state"], done["progress"]["step"], done["latest"], done["source"]) == (
        "succeeded", 11, {"loss": 1 / 12}, "files")
    # the going run's step is its files' (newer), its straggler the cluster's (only it knows)
    assert (going["state"], going["terminal"], going["stale"], going["progress"]["step"], going["source"],
            going["stragglers"]) == ("running", False, False, 4, "files", [1])
    # its files are on another machine's head: what launch() recorded, said as such
    assert (elsewhere["state"], elsewhere["source"]) == ("pending", "launch record")

    # the cluster's answer, once newer than the files, wins
    answer = {"address": gone, "cluster": None, "runs": [
        {"name": "done-run", "state": "succeeded", "progress": {"step": 12, "total_steps": 20, "fraction": 1.0},
         "source": "cluster"}]}
    runner.answers.store(gone, json.dumps(answer), received=time.time())
    served = {run["name"]: run for run in runner.runs()}
    assert (served["done-run"]["progress"]["step"], served["done-run"]["source"]) == (12, "cluster")


def test_runs_live_with_no_cluster_up_says_so_and_starts_none(home: Path) -> None:
    """`nbtrain runs --live` on a home whose cluster is down started one only to ask it; it says there is none."""
    done = nbtrain(_env(home), "runs", "--live")
    assert done.returncode != 0
    said = done.stderr + done.stdout
    assert "no cluster is up to ask" in said and "`nbtrain runs` lists" in said
    status = subprocess.run([sys.executable, "-c", "from nbtrain._client.local import local_cluster; "
                             "print(local_cluster.status())"], env=_env(home), capture_output=True, text=True,
                            timeout=60, check=True)
    assert status.stdout.strip() == "None", "a cluster was started"
