"""A kernel on the user's own cluster joins it as a Ray driver, without Ray Client (issue 45).

The cluster is a plain ``ray start --head --node-ip-address=127.0.0.1`` with token auth, as its operators
start it, stopped by its own processes. Each "kernel" is a fresh Python process, as a notebook kernel is
after a restart: the first finds the cluster with ``connect("auto")`` and launches a 2-rank run, steers
it, takes its stacks and a profile, then exits with the run going; the second reaches the same cluster by
``$RAY_ADDRESS`` (its GCS address), attaches to the run and finds every row, the change and the run going
on, stops it, and runs a sweep; the CLI lists the run from a third. Bad addresses are each one line, fast.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import _plain_cluster
import pytest

import nbtrain
from nbtrain._client.warm import WARM_START_ENV

FIRST_KERNEL = r'''
import json, time
import torch
import nbtrain

cluster = nbtrain.connect("auto")
assert cluster.via == "driver" and cluster.address == ADDRESS, cluster

def steered(config):
    torch.manual_seed(0)
    model = nbtrain.prepare_model(torch.nn.Linear(4, 1))
    optimizer = nbtrain.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    loader = nbtrain.prepare_loader(torch.utils.data.DataLoader(data, batch_size=4))
    for _epoch in range(10_000):
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            nbtrain.report(lr=optimizer.param_groups[0]["lr"])
            time.sleep(0.05)

run = nbtrain.launch(steered, name="on-the-cluster", workers=2)
deadline = time.monotonic() + 180
while time.monotonic() < deadline:
    run.refresh()
    workers = run.workers  # read once: each read asks the supervisor afresh
    if workers and min((w.get("step") or 0) for w in workers) >= 5:
        break
    time.sleep(0.2)
applied = run.adjust(lr=0.01, wait=True)
stacks = run.stacks()
profile = run.profile(steps=3, ranks=[0], timeout=120)
print("RESULT " + json.dumps({"applied": applied, "rows": len(run.metrics), "stacks": str(stacks)[:2000],
                              "profile": str(profile)[:500]}), flush=True)
'''

SECOND_KERNEL = r'''
import json, time
import nbtrain

cluster = nbtrain.connect()  # $RAY_ADDRESS: the GCS address
assert cluster.via == "driver", cluster
run = nbtrain.attach("on-the-cluster")
assert run.state == "running", run.state
seen = len(run.metrics)
deadline = time.monotonic() + 120
while len(run.metrics) < seen + 20 and time.monotonic() < deadline:
    run.refresh()
    time.sleep(0.2)
grew = len(run.metrics) - seen
run.stop()
state = run.wait(timeout=120, raise_on_failure=False)
by_rank = {rank: [r["step"] for r in run.metrics if r["rank"] == rank] for rank in (0, 1)}

def quality(config):
    import time as _time
    for step in range(1, 4):
        nbtrain.report(step=step, loss=config["q"] + 1.0 / step)
        _time.sleep(0.1)

from ray import tune
sweep = nbtrain.tune(quality, space={"q": tune.grid_search([0.1, 0.2])}, metric="loss", mode="min",
                     workers_per_trial=2, max_concurrent=1, name="sweep-on-the-cluster")
sweep_state = sweep.wait(timeout=400)
print("RESULT " + json.dumps({"grew": grew, "state": str(state), "by_rank": by_rank,
                              "changes": [c["step"] for c in run.changes], "sweep": str(sweep_state),
                              "best": sweep.best.config["q"]}), flush=True)
'''


@pytest.fixture(scope="module")
def plain_cluster():
    with _plain_cluster.running() as cluster:
        yield cluster


def _result(done: subprocess.CompletedProcess[str]) -> dict:
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.oldest_ray  # and on the oldest Ray (scripts/run-tests' tier)
def test_a_kernel_on_the_cluster_runs_steers_and_finds_its_run_again_after_a_restart(plain_cluster, tmp_path):
    home = str(tmp_path / "home")
    token_file = {"RAY_AUTH_TOKEN_PATH": str(plain_cluster.token_path)}  # where the cluster's nodes keep it
    first = _result(_plain_cluster.run_python(
        f"ADDRESS = {plain_cluster.gcs_address!r}\n" + FIRST_KERNEL,
        plain_cluster.driver_env(NBTRAIN_HOME=home, **token_file), timeout=400))
    assert first["applied"] >= 5 and first["rows"] >= 10
    assert "rank 0" in first["stacks"].lower() and "rank 1" in first["stacks"].lower()

    second = _result(_plain_cluster.run_python(
        SECOND_KERNEL, plain_cluster.driver_env(NBTRAIN_HOME=home, RAY_ADDRESS=plain_cluster.gcs_address,
                                                **token_file), timeout=500))
    assert second["grew"] >= 20, "the run did not go on while no kernel was connected"
    assert second["state"] == "stopped"
    assert second["changes"] == [first["applied"]]
    for rank, steps in second["by_rank"].items():  # no row lost between the two kernels
        assert steps == list(range(1, len(steps) + 1)), rank
    assert second["sweep"] == "succeeded" and second["best"] == 0.1

    listed = subprocess.run([sys.executable, "-m", "nbtrain._client.entry.cli", "runs", "--json",
                             "--address", plain_cluster.gcs_address],
                            env=plain_cluster.driver_env(NBTRAIN_HOME=home, **token_file),
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr[-3000:]
    assert "on-the-cluster" in listed.stdout


def _timed_refusal(address: str, **kwargs) -> tuple[str, float]:
    began = time.monotonic()
    with pytest.raises(nbtrain.ConnectionFailedError) as raised:
        nbtrain.connect(address, progress=lambda _m: None, **kwargs)
    return str(raised.value), time.monotonic() - began


@pytest.mark.oldest_ray  # and on the oldest Ray (scripts/run-tests' tier)
def test_auto_with_no_cluster_on_this_node_says_so_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    message, took = _timed_refusal("auto")
    assert took < 5
    assert message.startswith("connect('auto') found no Ray cluster on this node: $RAY_ADDRESS is not set and "
                               f"{tmp_path}/ray/ray_current_cluster")
    assert "ray start --head" in message and "nbtrain.connect()" in message
    (tmp_path / "ray").mkdir()
    with socket.socket() as held:  # bound, never listening: the cluster the file names has stopped
        held.bind(("127.0.0.1", 0))
        (tmp_path / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{held.getsockname()[1]}")
        message, took = _timed_refusal("auto")
    assert took < 5 and "but nothing listens at 127.0.0.1:" in message and "has stopped" in message


@pytest.mark.oldest_ray  # and on the oldest Ray (scripts/run-tests' tier)
def test_a_port_of_the_other_kind_and_a_wrong_token_are_each_one_line_at_once(plain_cluster):
    gcs, client = plain_cluster.gcs_address, plain_cluster.client_address
    cases = [
        (f"ray://{gcs}", {"token": plain_cluster.token},
         f"ray://{gcs} is the cluster's GCS port, not its Ray Client port. From a kernel on a node of the cluster, "
         f"join it as a Ray driver: nbtrain.connect('{gcs}')"),
        (client.removeprefix("ray://"), {"token": plain_cluster.token},
         f"{client.removeprefix('ray://')} is a Ray Client port, not the cluster's GCS: connect over Ray Client "
         f"with nbtrain.connect('{client}')"),
        (gcs, {"token": "not-the-token"},
         f"The cluster at {gcs} rejected the authentication token (token=). Pass the cluster's token"),
        (client, {"token": "not-the-token"},
         f"The cluster at {client} rejected the authentication token (token=). Pass the cluster's token"),
    ]
    for address, kwargs, expected in cases:
        message, took = _timed_refusal(address, **kwargs)
        assert message.startswith(expected), (address, message)
        assert "\n" not in message and took < 5, (address, took)


def test_the_embedded_cluster_is_reached_both_ways(tmp_path):
    """Not in the oldest-Ray tier: which address connect() takes is nbtrain's choice, which no Ray release changes
    (the tier's own session cluster is embedded, test_connect.py's client and this module's kernel are its two
    ways). Whichever way connect() takes to the embedded cluster by default, the other is its other address; the
    session over Ray Client warms its first run's ranks and its supervisor's process without a word of
    trouble (the spare process was once asked for from the notebook, which has no token for the raylet)."""
    code = r'''
import json, nbtrain
from nbtrain._client.local import local_cluster
try:
    first = nbtrain.connect(num_cpus=2, warm=False)  # the second session's ranks are the ones warmed
    info = local_cluster.status()
    other = info.address if first.via == "driver" else info.gcs_address
    second = nbtrain.connect(other)
    run = nbtrain.launch(lambda: nbtrain.report(x=1), workers=1, name="both-ways", wait=True)
    print("RESULT " + json.dumps({"vias": [first.via, second.via], "kinds": [first.kind, second.kind],
                                  "state": str(run.state), "rows": len(run.metrics)}), flush=True)
finally:
    nbtrain.disconnect()
    local_cluster.stop()
'''
    # a user's kernel: none of the variables this test session sets for the Ray processes it starts itself
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", WARM_START_ENV)}
    env["NBTRAIN_HOME"] = str(Path(tmp_path) / "home")
    done = _plain_cluster.run_python(code, env, timeout=300)
    result = _result(done)
    assert result["vias"] == ["driver", "client"] and result["kinds"] == ["local", "local"]
    assert "warming 2 ranks" in done.stdout + done.stderr, "the session over Ray Client warms its first run"
    assert "no spare process" not in done.stdout + done.stderr, done.stderr[-3000:]
    assert result["state"] == "succeeded" and result["rows"] == 1
