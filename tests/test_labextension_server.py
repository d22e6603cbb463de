"""The nbtrain server extension's REST API, against a real JupyterLab server.

The agent is swapped for a small script (``_fake_agent.py``, through the
``NbtrainServer`` settings) that records how it was called and acts on the
registry the way ``python -m nbtrain agent`` does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from _jupyterlab import REPO, JupyterLab, start_jupyterlab

FAKE_AGENT = Path(__file__).with_name("_fake_agent.py")


def make_run(name: str, **fields: Any) -> dict[str, Any]:
    now = time.time()
    run = {
        "name": name,
        "state": "running",
        "address": "ray://127.0.0.1:9999",
        "created": now - 60,
        "updated": now,
        "ended": None,
        "notebook": None,
        "workers": 2,
        "attempt": 1,
        "progress": {"step": 10, "total_steps": 100, "fraction": 0.1},
        "latest": {"loss": 0.5},
        "error": None,
    }
    run.update(fields)
    return run


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def wait_for(predicate: Callable[[], Any], timeout: float = 15.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("nbtrain-home")


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory, home: Path) -> Iterator[JupyterLab]:
    server = start_jupyterlab(
        tmp_path_factory.mktemp("root"),
        env={"NBTRAIN_HOME": str(home)},
        server_config={
            "NbtrainServer": {
                "agent_command": [sys.executable, str(FAKE_AGENT)],
                "refresh_interval": 0.5,
                "refresh_max_backoff": 1.0,
                "refresh_after": 10,
                "stale_after": 30,
            }
        },
        labextension=False,
    )
    yield server
    server.stop()


@pytest.fixture
def registry(home: Path) -> Iterator[Path]:
    """An empty registry for each test."""
    for path in [*home.glob("runs/*"), home / "cluster.json", home / "calls.jsonl"]:
        path.unlink(missing_ok=True)
    yield home


def agent_calls(home: Path) -> list[dict[str, Any]]:
    """Every call the fake agent got: time, argv and the agent's pid."""
    path = home / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def calls(home: Path, since: float = 0.0) -> list[list[str]]:
    """How the fake agent was called (after ``since``)."""
    return [call["argv"] for call in agent_calls(home) if call["time"] >= since]


ROUTES = [
    ("GET", "nbtrain/api/runs", 200),
    ("GET", "nbtrain/api/runs/alpha", 200),
    ("GET", "nbtrain/api/cluster", 200),
    ("POST", "nbtrain/api/runs/alpha/stop", 202),
]


@pytest.mark.parametrize(("method", "path", "ok"), ROUTES, ids=[f"{m} {p}" for m, p, _ in ROUTES])
def test_every_route_needs_the_token(lab: JupyterLab, registry: Path, method: str, path: str, ok: int) -> None:
    write_json(registry / "runs" / "alpha.json", make_run("alpha"))
    assert lab.request(method, path, token=False)[0] == 403
    assert lab.request(method, path + f"?token=wrong{lab.token}", token=False)[0] == 403
    status, body = lab.request(method, path)
    assert status == ok, body


def test_runs_lists_registry_files_live_first(lab: JupyterLab, registry: Path) -> None:
    now = time.time()
    write_json(registry / "runs" / "old.json", make_run("old", state="succeeded", created=now - 500, ended=now - 400))
    write_json(registry / "runs" / "new.json", make_run("new", created=now - 10))
    write_json(registry / "runs" / "older-live.json", make_run("older-live", state="pending", created=now - 100))
    (registry / "runs" / "broken.json").write_text('{"name": "brok')
    (registry / "runs" / ".new.json.1234.tmp").write_text("{}")

    status, body = lab.request("GET", "nbtrain/api/runs")

    assert status == 200
    assert [run["name"] for run in body["runs"]] == ["new", "older-live", "old"]
    assert abs(body["now"] - time.time()) < 5
    first = body["runs"][0]
    assert first["progress"] == {"step": 10, "total_steps": 100, "fraction": 0.1}
    assert first["latest"] == {"loss": 0.5}
    assert first["stale"] is False
    assert first["stop"] is None


def test_run_whose_kernel_is_gone_still_lists(lab: JupyterLab, registry: Path) -> None:
    # A "kernel" writes its run, then dies without cleaning up.
    writer = textwrap.dedent(
        f"""
        import json, os, time
        path = {str(registry / "runs" / "orphan.json")!r}
        run = {make_run("orphan", updated=time.time() - 600)!r}
        os.makedirs(os.path.dirname(path), exist_ok=True)
        json.dump(run, open(path + ".tmp", "w")); os.replace(path + ".tmp", path)
        os._exit(1)
        """
    )
    subprocess.run([sys.executable, "-c", writer], check=False, timeout=30)

    status, body = lab.request("GET", "nbtrain/api/runs")

    assert status == 200
    (orphan,) = body["runs"]
    assert orphan["name"] == "orphan"
    assert orphan["state"] == "running"
    assert orphan["stale"] is True  # the sidebar says the state may be outdated


def test_get_one_run(lab: JupyterLab, registry: Path) -> None:
    write_json(registry / "runs" / "alpha.json", make_run("alpha", latest={"loss": 0.25, "accuracy": 0.9}))

    status, run = lab.request("GET", "nbtrain/api/runs/alpha")
    assert status == 200
    assert run["latest"] == {"loss": 0.25, "accuracy": 0.9}

    status, body = lab.request("GET", "nbtrain/api/runs/missing")
    assert status == 404
    assert "missing" in body["message"]
    assert lab.request("GET", "nbtrain/api/runs/..%2Fcluster")[0] == 404


def test_stop_runs_nbtrain_stop_and_the_list_shows_it(lab: JupyterLab, registry: Path) -> None:
    write_json(registry / "runs" / "alpha.json", make_run("alpha"))

    status, run = lab.request("POST", "nbtrain/api/runs/alpha/stop")

    assert status == 202
    assert run["stop"]["status"] == "stopping"
    stopped = wait_for(
        lambda: (r := lab.request("GET", "nbtrain/api/runs/alpha")[1])["state"] == "stopped" and r,
        what="the run to be stopped",
    )
    assert stopped["stop"] is None  # the registry caught up; nothing pending
    assert ["stop", "alpha", "--address", "ray://127.0.0.1:9999"] in calls(registry)


def test_stop_failure_shows_the_tools_message(lab: JupyterLab, registry: Path) -> None:
    write_json(registry / "runs" / "unreachable.json", make_run("unreachable"))

    assert lab.request("POST", "nbtrain/api/runs/unreachable/stop")[0] == 202

    run = wait_for(
        lambda: (r := lab.request("GET", "nbtrain/api/runs/unreachable")[1])["stop"]["status"] == "failed" and r,
        what="the stop to fail",
    )
    assert "connection refused" in run["stop"]["message"]
    assert run["state"] == "running"


def test_one_agent_serves_every_command_and_a_dead_one_is_replaced(lab: JupyterLab, registry: Path) -> None:
    for name in ("first", "second", "crash", "third"):
        write_json(registry / "runs" / f"{name}.json", make_run(name))
    pids = []
    for name in ("first", "second"):
        assert lab.request("POST", f"nbtrain/api/runs/{name}/stop")[0] == 202
        wait_for(lambda n=name: lab.request("GET", f"nbtrain/api/runs/{n}")[1]["state"] == "stopped", what=name)
        pids.append(wait_for(lambda n=name: [c["pid"] for c in agent_calls(registry) if c["argv"][:2] == ["stop", n]]))
    assert pids[0] == pids[1], "each stop started its own agent"

    assert lab.request("POST", "nbtrain/api/runs/crash/stop")[0] == 202
    crashed = wait_for(lambda: (r := lab.request("GET", "nbtrain/api/runs/crash")[1])["stop"]["status"] == "failed" and r,
                       what="the stop to fail with the agent")
    assert "agent exited unexpectedly" in crashed["stop"]["message"]
    assert "segmentation fault" in crashed["stop"]["message"]

    assert lab.request("POST", "nbtrain/api/runs/third/stop")[0] == 202
    wait_for(lambda: lab.request("GET", "nbtrain/api/runs/third")[1]["state"] == "stopped", what="a new agent to stop it")
    third = [c["pid"] for c in agent_calls(registry) if c["argv"][:2] == ["stop", "third"]]
    assert third and third[0] != pids[0]


def test_a_watched_live_run_gets_the_agent_connected_before_any_stop(lab: JupyterLab, registry: Path) -> None:
    # A failed stop leaves the agent unconnected (as a real one drops its connection).
    write_json(registry / "runs" / "unreachable-1.json", make_run("unreachable-1"))
    lab.request("POST", "nbtrain/api/runs/unreachable-1/stop")
    wait_for(lambda: lab.request("GET", "nbtrain/api/runs/unreachable-1")[1]["stop"]["status"] == "failed")
    (registry / "runs" / "unreachable-1.json").unlink()
    # A notebook keeps this run current, so no refresh is due; the agent connects to its cluster anyway.
    write_json(registry / "runs" / "fresh.json", make_run("fresh", address="ray://127.0.0.1:7777", updated=time.time() + 60))
    lab.request("GET", "nbtrain/api/runs")

    wait_for(lambda: ["runs", "--json", "--address", "ray://127.0.0.1:7777"] in calls(registry),
             timeout=10, what="the agent to connect to the run's cluster")


def test_stop_of_an_ended_run_is_a_conflict(lab: JupyterLab, registry: Path) -> None:
    start = time.time()
    write_json(registry / "runs" / "done.json", make_run("done", state="succeeded", ended=time.time()))

    status, body = lab.request("POST", "nbtrain/api/runs/done/stop")

    assert status == 409
    assert "already ended" in body["message"]
    assert lab.request("POST", "nbtrain/api/runs/missing/stop")[0] == 404
    assert not [call for call in calls(registry, since=start) if call[0] == "stop"]


def test_cluster_is_the_last_connected_one(lab: JupyterLab, registry: Path) -> None:
    assert lab.request("GET", "nbtrain/api/cluster") == (200, {"cluster": None})
    cluster = {
        "address": "ray://127.0.0.1:10001",
        "kind": "local",
        "nodes": 1,
        "resources": {"CPU": [2, 4], "GPU": [0, 0]},
        "updated": time.time(),
    }
    write_json(registry / "cluster.json", cluster)

    assert lab.request("GET", "nbtrain/api/cluster") == (200, {"cluster": cluster})


def test_registry_refreshes_the_cluster_of_a_silent_live_run(lab: JupyterLab, registry: Path) -> None:
    # Nobody (no open notebook) has updated this run for a while.
    write_json(registry / "runs" / "alpha.json", make_run("alpha", updated=time.time() - 30))
    lab.request("GET", "nbtrain/api/runs")  # a browser polls

    wait_for(
        lambda: ["runs", "--json", "--address", "ray://127.0.0.1:9999"] in calls(registry),
        timeout=10,
        what="a registry refresh of the run's cluster",
    )


def test_no_refresh_for_ended_runs_or_runs_a_notebook_keeps_current(lab: JupyterLab, registry: Path) -> None:
    write_json(registry / "runs" / "done.json", make_run("done", state="failed", error="boom"))
    write_json(registry / "runs" / "shown.json", make_run("shown", updated=time.time() + 5))
    time.sleep(0.5)  # let a refresh started by the previous test finish
    start = time.time()
    lab.request("GET", "nbtrain/api/runs")
    time.sleep(1.5)
    assert calls(registry, since=start) == []


def test_default_agent_is_the_nbtrain_cli_and_a_failed_stop_says_why(tmp_path: Path) -> None:
    """The real ``python -m nbtrain agent``, asked to stop a run on a cluster that is not there."""
    import asyncio
    import concurrent.futures
    import logging

    from nbtrain._lab.commands import CommandRunner, NbtrainServer

    settings = NbtrainServer()
    assert settings.agent_command == [sys.executable, "-m", "nbtrain", "agent"]
    # cwd: `python -m` finds this checkout's nbtrain first.
    runner = CommandRunner(settings, tmp_path, str(REPO), logging.getLogger("test"))

    async def stop() -> dict[str, Any]:
        runner.request_stop(make_run("ghost", address="ray://127.0.0.1:1"))
        await asyncio.gather(*runner._tasks)
        outcome = runner.annotate(make_run("ghost"))["stop"]
        await runner._agent.close()
        return outcome

    # its own thread: pytest-playwright keeps an event loop running in this one
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        outcome = pool.submit(asyncio.run, stop()).result()

    assert outcome["status"] == "failed"
    assert "Nothing is listening at ray://127.0.0.1:1" in outcome["message"]
